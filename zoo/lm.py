"""Small causal language models with Canon layers: Llama-style Transformers, GLA and Mamba2.

"Physics of Language Models: Part 4.1 — Architecture Design and the Magic of Canon Layers",
Z. Allen-Zhu, NeurIPS 2025, arXiv 2512.17351. Official code: https://github.com/facebookresearch/PhysicsLM4
(``huggingface/modeling_llama_canon.py``, ``lingua_modified/huggingface/modeling_{gla,mamba2}_canon.py``).

One pre-norm decoder for every family; the sequence mixer is a registry argument::

    h = x + Mixer(CanonA(RMSNorm(x)))          mixer: attention (Llama) | gla | mamba2
    y = h + MLP(CanonC(RMSNorm(h)))             MLP: down(silu(g) * u), [g, u] = CanonD(gate_up(.))

``canon`` picks any subset of the four Canon points (``'ABCD'``, ``'AC'``, ``''`` = the baseline):
A after the first norm, B on the mixer's concatenated projections (Llama: concat[q, k, v] before RoPE),
C after the second norm, D on concat[gate, up] before the activation. Each inserted layer has 4*m
parameters (m its channels) and keeps PyTorch's default init (std ~0.289); every other weight is
re-initialised N(0, 0.02) in a fixed order *after* construction, from the RNG state the constructor
started with, so the same seed gives the same
non-Canon weights whatever ``canon`` is, and ``canon=''`` is exactly the baseline model.
The linear families keep their own short SiLU convolution ("Canon-b", ``short_conv=True``).
``forward(tokens, cache)`` with ``cache = model.init_cache()`` decodes incrementally (KV cache for attention,
recurrent state for GLA / Mamba2, rolling windows for every short conv and Canon layer); ``generate`` uses it.
``forward(tokens, attention_mask=...)`` takes HF's 2-d padding mask (1 = token, 0 = padding, covering the cached
prefix too): padded positions are no-ops for every Canon layer (zeroed before the convolution, as the official
``apply_canon``), attention (masked keys, RoPE positions counted over real tokens) and the recurrent mixers, so a
left- or right-padded batch gives each sequence's unpadded logits at its real positions.

Differences from the paper's code: q/k/v (and gate/up) are fused into one Linear each (identical
function and parameter count: the fused output *is* the concatenation Canon-B/D act on); Mamba2's conv1d
has no bias; Mamba2 blocks carry the gated MLP ("Mamba2(mlp)") so all four Canon points exist.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo import layers
from zoo.layers.canon import Canon, ShortConv, apply_cached, parse_canon_set

from ._builder import build_model
from ._registry import register_model

__all__ = ['CausalLMNet', 'DecoderBlock', 'GatedMLP']


class GatedMLP(nn.Module):
    """Llama's gated MLP ``down(silu(gate(x)) * up(x))`` with an optional Canon-D on concat[gate, up]."""

    def __init__(self, dim: int, hidden: int, canon_d: bool = False, canon_kernel: int = 4, canon_residual: bool = True,
                 canon_activation: bool = False):
        super().__init__()
        self.hidden = hidden
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)              # = concat[gate_proj, up_proj]
        self.canon_d = Canon(2 * hidden, canon_kernel, canon_residual, canon_activation) if canon_d else None
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        gu = apply_cached(self.canon_d, self.gate_up(x), cache, 'canon_d', mask)  # (B, T, 2 hidden)
        g, u = gu.chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)


class DecoderBlock(nn.Module):
    """``h = x + mixer(CanonA(norm1(x)))``, ``y = h + mlp(CanonC(norm2(h)))`` (the residual stream is never convolved)."""

    def __init__(self, dim: int, mixer, mlp_hidden: int, canon: str = '', canon_kernel: int = 4,
                 canon_residual: bool = True, norm_eps: float = 1e-6, canon_activation: bool = False):
        super().__init__()
        canon = parse_canon_set(canon)
        mk = dict(canon_b=True, canon_kernel=canon_kernel) if 'B' in canon else {}
        if 'B' in canon and canon_activation:
            mk['canon_activation'] = True
        if 'B' in canon and not canon_residual:
            raise ValueError('canon_residual=False is supported at points A, C and D only')
        self.norm1 = nn.RMSNorm(dim, eps=norm_eps)
        self.canon_a = Canon(dim, canon_kernel, canon_residual, canon_activation) if 'A' in canon else None
        self.mixer = mixer(dim, **mk)
        self.norm2 = nn.RMSNorm(dim, eps=norm_eps)
        self.canon_c = Canon(dim, canon_kernel, canon_residual, canon_activation) if 'C' in canon else None
        self.mlp = GatedMLP(dim, mlp_hidden, 'D' in canon, canon_kernel, canon_residual, canon_activation)

    def forward(self, x: torch.Tensor, cache: dict | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d). ``cache``: ``None`` for a whole sequence, else this block's dict of decoding caches
        (Canon-A/C windows, the mixer's and the MLP's sub-dicts), updated in place. ``mask``: optional (B, L)
        attention mask (1 = token, 0 = padding) over the cached prefix and these T tokens."""
        h = apply_cached(self.canon_a, self.norm1(x), cache, 'canon_a', mask)
        mixer_cache = None if cache is None else cache.setdefault('mixer', {})
        x = x + (self.mixer(h, mixer_cache) if mask is None else self.mixer(h, mixer_cache, mask=mask))
        h = apply_cached(self.canon_c, self.norm2(x), cache, 'canon_c', mask)
        return x + self.mlp(h, None if cache is None else cache.setdefault('mlp', {}), mask)


class CausalLMNet(nn.Module):
    """Token embedding -> ``depth`` decoder blocks -> RMSNorm -> LM head; (B, T) ids -> (B, T, vocab) logits.

    Args:
        vocab_size: tokens. dim: width d. depth: blocks.
        mixer: ``sequence_mixer`` spec (``'attention'``, ``'gla'``, ``'mamba2'``, a class or a partial).
        num_heads: heads of attention / GLA. rope_dim: attention only; ``None`` = full RoPE, 0 = NoPE, else partial.
        rope_heads: attention only; the fraction of heads with RoPE, the rest NoPE (``rope_heads=0.5,
            rope_dim=head_dim // 2`` = the paper's "half the heads at half dims").
        canon: Canon points, any subset of ``'ABCD'``. canon_kernel: taps, 2..6 (the official ``canon_kernel``).
        canon_residual: ``False`` = NoRes ablation. canon_activation: SiLU on every Canon output (the "Act" ablation).
        mlp_hidden: gated-MLP width (default ``int(8 d / 3)``). mixer_kwargs: extra mixer arguments.
        tie_embeddings: share the embedding with the LM head (HF Llama's default is untied).
    """

    def __init__(self, vocab_size: int = 32000, dim: int = 512, depth: int = 8, mixer='attention',
                 num_heads: int | None = 8, rope_dim: int | None = None, canon: str = '', canon_kernel: int = 4,
                 canon_residual: bool = True, mlp_hidden: int | None = None, mixer_kwargs: dict | None = None,
                 tie_embeddings: bool = False, norm_eps: float = 1e-6, init_std: float = 0.02,
                 rope_heads: float | None = None, canon_activation: bool = False):
        super().__init__()
        rng_state = torch.get_rng_state()  # re-initialise from here: Canon layers' own draws must not shift the rest
        self.canon = parse_canon_set(canon)
        self.vocab_size, self.dim, self.depth, self.init_std = vocab_size, dim, depth, init_std
        mixer_cls = layers.get('sequence_mixer', mixer)
        self.mixer_name = layers.name_of('sequence_mixer', mixer_cls)
        kw = dict(mixer_kwargs or {})
        if num_heads is not None and self.mixer_name in ('attention', 'gla'):
            kw.setdefault('num_heads', num_heads)
        for key, val in (('rope_dim', rope_dim), ('rope_heads', rope_heads)):
            if val is not None:
                if self.mixer_name != 'attention':
                    raise ValueError(f'{key} applies to the attention mixer only, not {self.mixer_name!r}')
                kw[key] = val
        mixer_fn = lambda d, **extra: mixer_cls(d, **kw, **extra)  # noqa: E731
        hidden = mlp_hidden or int(8 * dim / 3)
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, mixer_fn, hidden, self.canon, canon_kernel, canon_residual,
                                                 norm_eps, canon_activation) for _ in range(depth))
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        torch.set_rng_state(rng_state)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) for every Linear and the embedding, zero biases, Mamba2's SSM init; Canon layers keep
        PyTorch's default (the paper: re-initialising them to 0.02 is not wise). Fixed module order, so the
        draws do not depend on which Canon layers exist."""
        for m in self.modules():
            if isinstance(m, ShortConv):          # the linear models' own conv (Canon-b) belongs to the baseline
                m.reset_parameters()
                continue
            if getattr(m, 'skip_global_init', False):
                continue
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=self.init_std)
                if getattr(m, 'bias', None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, layers.sequence_mixers.Mamba2Mixer):
                m.reset_ssm_parameters()

    def forward(self, tokens: torch.Tensor, cache: list[dict] | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, vocab) logits. ``cache``: ``None`` for whole sequences, else the list from
        ``init_cache()``, updated in place: the call continues the cached sequence (a prompt, then one token at a
        time), attending to / carrying state from everything before instead of re-running it.
        ``attention_mask``: optional (B, past + T) padding mask, 1 = token, 0 = padding (HF's 2-d form; with a
        cache it covers the cached prefix too). Logits at padded positions are meaningless."""
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2 or tokens.is_floating_point():
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f'{type(self).__name__} expects integer token ids of shape (B, T), got {shape}')
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f'cache must be the list from init_cache() (one dict per block, {len(self.blocks)}), '
                             f'got {len(cache)} entries')
        if attention_mask is not None:
            if (not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2
                    or attention_mask.shape[0] != tokens.shape[0] or attention_mask.shape[1] < tokens.shape[1]
                    or not ((attention_mask == 0) | (attention_mask == 1)).all()):
                shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
                raise ValueError(f'attention_mask must be a (B, past + T) tensor of 0/1 (1 = token, 0 = padding) '
                                 f'for tokens of shape {tuple(tokens.shape)}, got {shape}')
        if tokens.numel() and not tokens.is_meta and not torch.compiler.is_compiling():
            lo, hi = int(tokens.min()), int(tokens.max())  # one sync; cheaper than a device-side assert
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(f'{type(self).__name__}: token id {bad} is outside the vocabulary of size '
                                 f'{self.vocab_size} (ids must be in 0..{self.vocab_size - 1})')
        x = self.embed(tokens)                                              # (B, T, d)
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if cache is None else cache[i], attention_mask)
        return self.head(self.norm(x))                                      # (B, T, vocab)

    def init_cache(self) -> list[dict]:
        """Empty decoding caches, one dict per block: KV cache (attention) or recurrent state (GLA, Mamba2), the
        mixers' short-conv and every Canon layer's rolling window, filled by the first ``forward(..., cache)``."""
        return [{} for _ in self.blocks]

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy continuation (B, T) -> (B, T + max_new_tokens). With ``use_cache`` the prompt is run once and
        each new token is decoded alone against the caches; ``use_cache=False`` re-runs the whole prefix at every
        step (the reference the cached path is tested and benchmarked against). ``attention_mask``: (B, T) for a
        left-padded batch of prompts (1 = token, 0 = padding); it grows by a 1 for every generated token."""
        if max_new_tokens <= 0:
            return tokens
        mask = attention_mask

        def grow(m):
            return None if m is None else torch.cat([m, m.new_ones(m.shape[0], 1)], 1)
        if not use_cache:
            for _ in range(max_new_tokens):
                nxt = self(tokens, attention_mask=mask)[:, -1].argmax(-1, keepdim=True)
                tokens, mask = torch.cat([tokens, nxt], 1), grow(mask)
            return tokens
        cache = self.init_cache()
        logits = self(tokens, cache, attention_mask=mask)                  # prefill
        new = []
        for i in range(max_new_tokens):
            new.append(logits[:, -1].argmax(-1, keepdim=True))              # (B, 1)
            if i + 1 < max_new_tokens:
                mask = grow(mask)
                logits = self(new[-1], cache, attention_mask=mask)
        return torch.cat([tokens, *new], 1)


def _create(cfg: dict, kwargs: dict) -> CausalLMNet:
    return build_model(CausalLMNet, cfg, kwargs)


_PAPER = 'Physics of Language Models: Part 4.1, Architecture Design and the Magic of Canon Layers (arXiv 2512.17351)'
_REPO = 'https://github.com/facebookresearch/PhysicsLM4'
_LM = dict(task='language_modeling', paper=_PAPER, repo=_REPO, input_size=(64,))
_TINY = dict(vocab_size=64, dim=16, depth=1)

# Parameter counts (vocab 32000, untied embeddings, gated MLP int(8d/3), no biases) derived by hand:
#   llama: 2Vd + d + L(4d^2 + 3 d h + 2d),  h = int(8d/3)
#   gla:   2Vd + d + L(qkv d(2d/2 + d) + conv 4(2d) + gate 16d + 16(d/2) + d/2 + g d^2 + norm d/H + o d^2 + mlp 3dh + 2d)
#   mamba2: 2Vd + d + L(in d(4d + 2N + H) + conv 4(2d + 2N) + 3H + 2d + out 2d^2 + 3dh + 2d), N = 64, H = 2d/64
_LLAMA = dict(family='llama', tiny='llama_tiny', **_LM)


@register_model(**_LLAMA, params=57_938_432)
def llama_8l512d(**kwargs):
    """The paper's Llama 8L512D (8 heads, RoPE; ``rope_dim=0`` = NoPE, ``canon='ABCD'`` = full Canon)."""
    return _create(dict(dim=512, depth=8, num_heads=8), kwargs)


@register_model(**_LLAMA, params=70_523_392)
def llama_12l512d(**kwargs):
    return _create(dict(dim=512, depth=12, num_heads=8), kwargs)


@register_model(**_LLAMA, params=105_788_160)
def llama_8l768d(**kwargs):
    return _create(dict(dim=768, depth=8, num_heads=12), kwargs)


@register_model(**_LLAMA, params=134_105_856)
def llama_12l768d(**kwargs):
    return _create(dict(dim=768, depth=12, num_heads=12), kwargs)


@register_model(**{**_LLAMA, 'input_size': (32,)})
def llama_tiny(**kwargs):
    """1 layer, d = 16, 2 heads: the paper's token-copy probe model (Figure 5)."""
    return _create(dict(**_TINY, num_heads=2), kwargs)


_GLA = dict(family='gla', tiny='gla_tiny', **_LM)


@register_model(**_GLA, params=58_072_576)
def gla_8l512d(**kwargs):
    """GLA (gated linear attention) + gated MLP, 8 layers x 512, 4 heads, with its own short conv (Canon-b)."""
    return _create(dict(dim=512, depth=8, mixer='gla', num_heads=4), kwargs)


@register_model(**_GLA, params=134_407_680)
def gla_12l768d(**kwargs):
    return _create(dict(dim=768, depth=12, mixer='gla', num_heads=4), kwargs)


@register_model(**{**_GLA, 'input_size': (32,)})
def gla_tiny(**kwargs):
    return _create(dict(**_TINY, mixer='gla', num_heads=2), kwargs)


_MAMBA2 = dict(family='mamba2', tiny='mamba2_tiny', **_LM)


@register_model(**_MAMBA2, params=62_768_000)
def mamba2_8l512d(**kwargs):
    """Mamba2(mlp): Mamba2 mixer (expand 2, head_dim 64, d_state 64) + gated MLP, 8 layers x 512."""
    return _create(dict(dim=512, depth=8, mixer='mamba2'), kwargs)


@register_model(**_MAMBA2, params=149_761_632)
def mamba2_12l768d(**kwargs):
    return _create(dict(dim=768, depth=12, mixer='mamba2'), kwargs)


@register_model(**{**_MAMBA2, 'input_size': (32,)})
def mamba2_tiny(**kwargs):
    return _create(dict(**_TINY, mixer='mamba2', mixer_kwargs=dict(head_dim=8, d_state=8, chunk_size=16)), kwargs)
