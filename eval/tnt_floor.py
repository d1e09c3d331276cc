"""A floor for an eager TNT forward: every op of the forward timed on its own, and the times summed.

Each op of a TNT inference forward (eval, batch B) runs alone, back to back over the blocks' real
weights (TNT-S holds 95 MB of weights, more than the L3 cache, so they come from memory as in the
forward), and the per-op medians are added up. The sum leaves out everything *between* ops
(dispatch, allocation, activations leaving the cache, thread wake-ups), so no eager implementation
that runs these ops can be faster than it. The ops are split into:

- ``shared``: the outer transformer's GEMMs, attention, GELU and LayerNorms and the word-to-sentence
  projection, the same ops with the same shapes in timm and in zoo;
- ``inner``: the inner transformer over the words, where implementations can differ (layout, fusion).

The last block runs the class token alone (what ``TNT.forward`` does in inference), so the floor's
ops execute exactly the multiply-adds of ``zoo.create(name).eval()(x)`` under ``torch.inference_mode``
(``tests/test_tnt.py`` checks that). With ``--vs``, the zoo model and the reference are timed too,
interleaved, and the output compares the floor with the time a ``--target`` speed-up would need.

    python -m zoo.eval.tnt_floor --model tnt_s --batch-size 1 --vs timm/tnt_s_patch16_224
"""
from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange

import zoo

from .profile import benchmark, interleave


def floor_ops(model, batch_size: int = 1) -> dict[str, tuple[str, Callable[[], None]]]:
    """name -> (group, a callable that runs that op for every block once), with random activations."""
    blocks = list(model.blocks)
    full, last = blocks[:-1], blocks[-1]
    b, n, m = batch_size, model.word_embed.num_patches, model.word_embed.num_words
    c, d = model.word_pos.shape[-1], model.sentence_pos.shape[-1]
    ih, oh = blocks[0].inner_attn.num_heads, blocks[0].outer_attn.num_heads
    hidden_in, hidden_out = blocks[0].inner_mlp.fc1.out_features, blocks[0].outer_mlp.fc1.out_features
    r = torch.randn
    words, sentences = r(b * n * m, c), r(b * (1 + n), d)                     # 2-D token rows
    wq = r(b * n, ih, m, c // ih)                                             # (B*N, heads, m, c/heads)
    sq = r(b, oh, 1 + n, d // oh)                                             # (B, heads, 1+N, d/heads)
    s_hidden, w_hidden = r(b * (1 + n), hidden_out), r(b * n * m, hidden_in)
    flat = r(b * n, m * c)                                                    # the words of each sentence
    ps = model.word_embed.patch_size
    patches = r(b * n, model.in_chans, ps, ps)                                # (B*N, C, P, P)
    cls = r(b, d)

    def each(blks, fn):
        def run():
            for blk in blks:
                fn(blk)  # the output is dropped at once, as the forward frees its temporaries
        return run

    def transformer(stream: str, group: str, blks, tokens, heads, hidden) -> dict:
        """The ops of one pre-norm transformer block (``inner_*`` or ``outer_*`` modules) over ``blks``."""
        mod = lambda blk, name: getattr(blk, f'{stream}_{name}')  # noqa: E731
        return {
            f'{stream} LayerNorm x2': (group, each(blks, lambda k: (mod(k, 'norm1')(tokens), mod(k, 'norm2')(tokens)))),
            f'{stream} qkv': (group, each(blks, lambda k: mod(k, 'attn').qkv(tokens))),
            f'{stream} attention': (group, each(blks, lambda k: F.scaled_dot_product_attention(heads, heads, heads))),
            f'{stream} proj': (group, each(blks, lambda k: mod(k, 'attn').proj(tokens))),
            f'{stream} fc1': (group, each(blks, lambda k: mod(k, 'mlp').fc1(tokens))),
            f'{stream} GELU (in place)': (group, each(blks, lambda k: torch.ops.aten.gelu_(hidden))),
            f'{stream} fc2': (group, each(blks, lambda k: mod(k, 'mlp').fc2(hidden))),
        }

    def stem_and_head():
        model.word_embed.proj(patches)
        model.sentence_embed(flat)
        model.head(model.norm(cls))

    return {
        'stem and head': ('shared', stem_and_head),
        **transformer('inner', 'inner', blocks, words, wq, w_hidden),
        'word-to-sentence': ('shared', each(blocks, lambda k: k.word_to_sentence(flat))),
        **transformer('outer', 'shared', full, sentences, sq, s_hidden),
        # last block: keys and values of every token; queries, projection and MLP of the class token only
        'last block, class token': ('shared', lambda: _class_token_only(last, sentences, b, oh)),
    }


def _class_token_only(blk, sentences: torch.Tensor, b: int, heads: int) -> None:
    d = sentences.shape[-1]
    w, bias = blk.outer_attn.qkv.weight, blk.outer_attn.qkv.bias              # rows: q, k, v
    cls = rearrange(sentences, '(b l) d -> b l d', b=b)[:, 0]                 # (B, d)
    q = F.linear(cls, w[:d], None if bias is None else bias[:d])
    kv = F.linear(sentences, w[d:], None if bias is None else bias[d:])
    q = rearrange(q, 'b (h e) -> b h 1 e', h=heads)
    k, v = rearrange(kv, '(b l) (two h e) -> two b h l e', b=b, two=2, h=heads)
    o = rearrange(F.scaled_dot_product_attention(q, k, v), 'b h 1 e -> b (h e)')
    blk.outer_mlp.fc2(torch.ops.aten.gelu_(blk.outer_mlp.fc1(blk.outer_attn.proj(o))))


def time_ops(ops: dict, repeats: int = 20, warmup: int = 3) -> dict[str, float]:
    """Median ms of each op (all blocks), the ops interleaved in every repeat."""
    with torch.inference_mode():
        times = interleave({name: fn for name, (_, fn) in ops.items()}, repeats, warmup)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--model', default='tnt_s')
    p.add_argument('--batch-size', type=int, default=1)
    p.add_argument('--vs', default=None, help='also time the model and this reference, e.g. timm/tnt_s_patch16_224')
    p.add_argument('--target', type=float, default=1.2, help='speed-up over the reference to compare the floor with')
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--threads', type=int, default=None, help='torch threads (default: all cores)')
    args = p.parse_args(argv)
    if args.vs == args.model:
        p.error(f'--vs must name another model than --model ({args.model}), e.g. timm/tnt_s_patch16_224')
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = zoo.create(args.model).eval()
    ops = floor_ops(model, args.batch_size)
    ms = time_ops(ops, args.repeats)
    groups = {g: sum(ms[n] for n, (gg, _) in ops.items() if gg == g) for g in ('shared', 'inner')}
    print(f'{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads, median ms per forward:')
    for name, (group, _) in ops.items():
        print(f'  {name:28s} {group:7s} {ms[name]:8.2f}')
    print(f"  {'shared ops':36s} {groups['shared']:8.2f}\n  {'inner ops':36s} {groups['inner']:8.2f}")
    print(f"  {'floor (sum)':36s} {sum(groups.values()):8.2f}")
    if args.vs:
        from .bench import _build, input_size_of
        models = {args.model: model, args.vs: _build(args.vs, None, None)}
        lat = benchmark(models, input_size=input_size_of(args.model, None), batch_size=args.batch_size,
                        repeats=args.repeats, threads=args.threads)
        ref = lat[args.vs].median_ms
        print(f'  measured: {args.model} {lat[args.model].median_ms:.2f}, {args.vs} {ref:.2f}; '
              f'{args.target}x the reference needs <= {ref / args.target:.2f} ms, which leaves '
              f'{ref / args.target - sum(groups.values()):.2f} ms above the floor for everything between ops')


if __name__ == '__main__':
    main()
