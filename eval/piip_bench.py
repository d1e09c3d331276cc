"""PIIP benchmarks (issue 18): the deformable cross-attention core and the PIIP models, on the CPU.

    python -m zoo.eval.piip_bench deform            # batched grid_sample core vs one grid_sample per head
    python -m zoo.eval.piip_bench models            # params, MACs, latency: piip_tsb vs ViT-B and its branches,
                                                    # piip_tiny vs its single-branch baseline
    python -m zoo.eval.piip_bench models --macs-only

MACs: ``zoo.eval.profile.count_macs`` (torch's FlopCounterMode: linears, convs, attention matmuls) plus the
bilinear sampling, which the counter does not see: 5 MACs per sampled channel (4 corner products and the
attention weight), i.e. 5 * Nq * P * int(D * ratio) per deformable attention (the official get_flops.py adds
5 * N * K * D).

Timings are interleaved (``zoo.eval.profile.benchmark``); run on a quiet machine, the numbers of a shared
one are noise. No Lightning, no training.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.layers.deform_attn import DeformCrossAttention, deform_attn_core

from .profile import benchmark, count_macs, count_params


def per_head_core(value, value_grid, locations, weights):
    """The same computation with one grid_sample call per head (the layout of a naive port), for comparison."""
    b, _, m, dh = value.shape
    h, w = value_grid
    outs = []
    for head in range(m):
        v = rearrange(value[:, :, head], 'b (h w) d -> b d h w', h=h, w=w)
        s = F.grid_sample(v, 2 * locations[:, :, head] - 1, mode='bilinear', padding_mode='zeros',
                          align_corners=False)  # (B, Dh, Nq, P)
        outs.append((s * weights[:, None, :, head]).sum(-1))  # (B, Dh, Nq)
    return rearrange(torch.stack(outs, 1), 'b m d q -> b q (m d)')


class _Deform(nn.Module):
    """One interaction direction of PIIP-TSB (query grid -> value grid) as a model taking the query tokens."""

    def __init__(self, dim, qgrid, vgrid, core):
        super().__init__()
        self.attn, self.qgrid, self.vgrid, self.core = DeformCrossAttention(dim), qgrid, vgrid, core
        self.register_buffer('value', torch.randn(1, vgrid[0] * vgrid[1], dim))

    def forward(self, q):
        a = self.attn
        loc, wgt = a.sampling(q, self.qgrid, self.vgrid)
        v = rearrange(a.value_proj(self.value.expand(q.shape[0], -1, -1)), 'b n (m d) -> b n m d', m=a.num_heads)
        return a.output_proj(self.core(v, self.vgrid, loc, wgt))


def bench_deform(repeats: int, threads: int | None) -> None:
    # PIIP-TSB 368/192/128: T (23x23 grid, 192) <-> S (12x12, 384) and S <-> B (8x8, 768)
    cases = [('T<-S', 192, (23, 23), (12, 12)), ('S<-T', 384, (12, 12), (23, 23)), ('B<-S', 768, (8, 8), (12, 12))]
    for name, dim, qg, vg in cases:
        torch.manual_seed(0)
        batched = _Deform(dim, qg, vg, deform_attn_core)
        looped = _Deform(dim, qg, vg, per_head_core)
        looped.load_state_dict(batched.state_dict())
        x = torch.randn(8, qg[0] * qg[1], dim)
        with torch.no_grad():
            diff = (batched(x) - looped(x)).abs().max().item()
        res = benchmark({'batched': batched, 'per_head': looped}, input_size=tuple(x.shape[1:]), batch_size=8,
                        repeats=repeats, threads=threads, inputs={'batched': x, 'per_head': x})
        b, p = res['batched'].median_ms, res['per_head'].median_ms
        print(f'{name:5s} dim {dim:3d} {qg}->{vg} batch 8: batched {b:.2f} ms, per-head {p:.2f} ms '
              f'(x{p / b:.2f}); max |diff| {diff:.1e}')


def deform_sampling_macs(model) -> int:
    """MACs of the bilinear sampling of every deformable attention in a PIIP model (see the module docstring)."""
    from zoo.layers.piip import InteractionBlock
    grids = [(s // model.patch_size,) * 2 for s in model.img_sizes]
    total = 0
    for block in model.interactions:
        assert isinstance(block, InteractionBlock)
        for i in range(block.num_branches - 1):
            unit = block.unit(i)
            for inj, g in ((unit.branch2to1_injector, grids[i]), (unit.branch1to2_injector, grids[i + 1])):
                a = inj.attn
                total += 5 * g[0] * g[1] * a.num_points * a.value_dim
    return total


def _macs(model, size) -> int:
    macs = count_macs(model, (3, size, size))
    return macs + (deform_sampling_macs(model) if hasattr(model, 'interactions') else 0)


def _single_branch_baseline(piip_model, num_classes=1000):
    """A standalone ViT of the PIIP model's widest branch at the largest resolution (same depth and style)."""
    from timm.models.vision_transformer import VisionTransformer
    b = piip_model.branches[0]
    return VisionTransformer(img_size=piip_model.img_sizes[-1], patch_size=piip_model.patch_size,
                             num_classes=num_classes, embed_dim=piip_model.embed_dims[0], depth=len(b.blocks),
                             num_heads=b.blocks[0].attn.num_heads, no_embed_class=b.no_embed_class,
                             init_values=1.0 if b.no_embed_class else None)


def bench_models(repeats: int, threads: int | None, macs_only: bool = False) -> None:
    import zoo
    rows = []  # (name, model, input side)
    tsb = zoo.create('piip_tsb').eval()
    rows.append(('timm/vit_base_patch16_224 @224', zoo.create('timm/vit_base_patch16_224').eval(), 224))
    rows.append(('piip_tsb 368/192/128', tsb, 368))
    for i, (b, s) in enumerate(zip(tsb.branches, tsb.img_sizes)):
        rows.append((f'  its branch{i + 1} alone @{s}', b, s))
    tiny = zoo.create('piip_tiny').eval()
    rows.append(('piip_tiny 64/48/32', tiny, 64))
    rows.append(('  single-branch baseline (widest @64)', _single_branch_baseline(tiny).eval(), 64))
    print(f'{"model":42s} {"params":>12s} {"GMACs":>8s}')
    macs = {}
    for name, m, s in rows:
        macs[name] = _macs(m, s)
        print(f'{name:42s} {count_params(m)["params"]:12,d} {macs[name] / 1e9:8.3f}')
    if macs_only:
        return
    for group in ([r for r in rows if 'tiny' not in r[0] and 'baseline' not in r[0]],
                  [r for r in rows if 'tiny' in r[0] or 'baseline' in r[0]]):
        # interleaved (A, B, C, A, B, C, ...), each model on its own input size
        res = benchmark({name: m for name, m, _ in group}, input_size=(3, group[0][2], group[0][2]),
                        repeats=repeats, threads=threads,
                        inputs={name: torch.randn(1, 3, s, s) for name, _, s in group})
        ref = group[0][0]
        for name, _, _ in group:
            r = res[name].median_ms / res[ref].median_ms
            print(f'{name:42s} median {res[name].median_ms:9.2f} ms  latency x{r:.2f}  '
                  f'MACs x{macs[name] / macs[ref]:.2f}'
                  f'  (vs {ref.strip()})')


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('what', choices=['deform', 'models'])
    ap.add_argument('--repeats', type=int, default=20)
    ap.add_argument('--threads', type=int, default=None)
    ap.add_argument('--macs-only', action='store_true', help='models: parameters and MACs, no timing')
    args = ap.parse_args(argv)
    if args.what == 'deform':
        bench_deform(args.repeats, args.threads)
    else:
        bench_models(args.repeats, args.threads, args.macs_only)


if __name__ == '__main__':
    main()
