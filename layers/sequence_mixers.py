"""Causal sequence mixers for the language models: softmax attention (RoPE / partial RoPE / NoPE),
GLA-style gated linear attention and a Mamba2-style state-space mixer.

Kind ``sequence_mixer``: constructor ``(dim, **kw)``, (B, T, D) -> (B, T, D), causal. Each mixer takes
``canon_b``: whether to put a residual Canon layer (Canon-B, "Physics of Language Models: Part 4.1",
arXiv 2512.17351) on the concatenated projections before the heads are formed.

- ``CausalSelfAttention``: Llama attention (Touvron et al. 2023) through ``F.scaled_dot_product_attention``;
  Canon-B acts on concat[q, k, v] (m = 3d) before RoPE.
- ``GatedLinearAttention``: GLA (Yang et al., "Gated Linear Attention Transformers with Hardware-Efficient
  Training", ICML 2024, arXiv 2312.06635; code: https://github.com/fla-org/flash-linear-attention) with a
  low-rank per-key-channel forget gate, its short SiLU convolution on q/k/v ("Canon-b"), a per-head RMSNorm
  and a swish output gate. Chunked: exact inside each chunk, a recurrence across chunks only.
- ``Mamba2Mixer``: Mamba2 / SSD (Dao & Gu, "Transformers are SSMs", ICML 2024, arXiv 2405.21060; code:
  https://github.com/state-spaces/mamba) with a scalar decay per head, its conv1d on (x, B, C) ("Canon-b"),
  a gated RMSNorm and D skip. Chunked SSD, pure PyTorch.

``gla_recurrent`` and ``ssd_recurrent`` are the token-by-token references the chunked scans are tested
and benchmarked against. Every mixer's ``forward(x, cache=None)`` also continues a sequence from a cache dict
(KV cache / recurrent state plus the short-conv and Canon-B windows) for step-by-step decoding, and takes
an optional attention ``mask`` (B, L) of 1 = token, 0 = padding covering the cached prefix and the T new tokens
(HF's 2-d form): padded positions are no-ops, so a padded batch gives each sequence's unpadded outputs at its
real positions. Attention masks padded keys and counts RoPE positions over real tokens only (left padding);
GLA and Mamba2 zero the padded inputs of their convolutions and make padded steps leave the state unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register
from .canon import Canon, ShortConv, apply_cached, zero_padding

__all__ = ['CausalSelfAttention', 'GatedLinearAttention', 'Mamba2Mixer', 'apply_rope',
           'gla_chunked', 'gla_recurrent', 'ssd_chunked', 'ssd_recurrent']

_EX = dict(layout='nlc', example_input=(2, 12, 32))


# ----------------------------------------------------------------------------------------------- RoPE
def apply_rope(x: torch.Tensor, rope_dim: int, theta: float = 10000.0, offset: int = 0,
               positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding (rotate-half convention, as HF Llama) on the first ``rope_dim`` dims of each head.

    x: (..., T, hd) at positions offset .. offset + T - 1, or (..., B, H, T, hd) at per-sequence ``positions``
    (B, T) (padded batches). The remaining ``hd - rope_dim`` dims pass through (partial RoPE); ``rope_dim=0``
    is NoPE.
    """
    if rope_dim == 0:
        return x
    t = x.shape[-2]
    inv_freq = 1.0 / theta ** (torch.arange(0, rope_dim, 2, device=x.device, dtype=torch.float32) / rope_dim)
    if positions is None:
        pos = torch.arange(offset, offset + t, device=x.device, dtype=torch.float32)
        ang = torch.outer(pos, inv_freq)                               # (T, rope_dim/2)
    else:
        ang = positions.float()[:, None, :, None] * inv_freq           # (B, 1, T, rope_dim/2): broadcast over heads
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    xr, xp = x[..., :rope_dim], x[..., rope_dim:]
    x1, x2 = xr.chunk(2, dim=-1)
    rotated = xr * cos + torch.cat([-x2, x1], dim=-1) * sin
    return torch.cat([rotated, xp], dim=-1)


@register('sequence_mixer', 'attention', example=dict(dim=32, num_heads=2), **_EX)
class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE, partial RoPE or NoPE (no GQA, no biases, as Llama).

    Args:
        dim: model width d. num_heads: heads (head_dim = d / num_heads).
        rope_dim: rotary dims per RoPE head: ``None`` = all (RoPE), ``0`` = NoPE, else partial RoPE (the first
            ``rope_dim`` dims; even, <= head_dim).
        rope_heads: fraction of the heads with RoPE (the first ``rope_heads * num_heads``; the others are NoPE).
            The paper's two best partial RoPEs are ``rope_dim=head_dim // 4`` and "half the heads at half dims",
            ``rope_heads=0.5, rope_dim=head_dim // 2``.
        rope_theta: RoPE base. canon_b: residual Canon layer on concat[q, k, v] (m = 3d) before RoPE.
    """

    def __init__(self, dim: int, num_heads: int = 8, rope_dim: int | None = None, rope_theta: float = 10000.0,
                 canon_b: bool = False, canon_kernel: int = 4, rope_heads: float = 1.0, canon_activation: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} must be divisible by num_heads {num_heads}')
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        rope_dim = self.head_dim if rope_dim is None else rope_dim
        if rope_dim < 0 or rope_dim > self.head_dim or rope_dim % 2:
            raise ValueError(f'rope_dim must be an even number in 0..head_dim={self.head_dim} (0 = NoPE), got {rope_dim}')
        n_rope = rope_heads * num_heads
        if not 0 < rope_heads <= 1 or abs(n_rope - round(n_rope)) > 1e-9:
            raise ValueError(f'rope_heads must be a fraction in (0, 1] giving a whole number of the {num_heads} heads '
                             f'(e.g. 0.5), got {rope_heads!r}')
        self.rope_heads = int(round(n_rope))                               # heads 0..rope_heads-1 rotate
        self.rope_dim, self.rope_theta = rope_dim, rope_theta
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)   # = concat[q_proj, k_proj, v_proj]
        self.canon_b = Canon(3 * dim, canon_kernel, activation=canon_activation) if canon_b else None
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d). ``cache``: ``None`` for a whole sequence, else a dict (``{}`` to start) holding the
        Canon-B window and the keys / values so far (after RoPE, at their absolute positions); updated in place,
        so the next call continues the sequence (prefill, then one token at a time). ``mask``: optional (B,
        past + T) attention mask, 1 = token, 0 = padding: padded keys are not attended to and RoPE counts
        positions over real tokens (so left padding does not shift them)."""
        qkv = apply_cached(self.canon_b, self.qkv(x), cache, 'canon_b', mask)  # (B, T, 3d)
        q, k, v = rearrange(qkv, 'b t (three h e) -> three b h t e', three=3, h=self.num_heads)
        past = cache['k'].shape[2] if cache is not None and 'k' in cache else 0
        t = q.shape[2]
        if mask is not None and tuple(mask.shape) != (x.shape[0], past + t):
            raise ValueError(f'attention mask must be (B, past + T) = ({x.shape[0]}, {past + t}) (1 = token, '
                             f'0 = padding), got shape {tuple(mask.shape)}')
        positions = None if mask is None else (mask.long().cumsum(-1) - 1).clamp_min(0)[:, past:]  # (B, T)
        q, k = self.rope(torch.stack([q, k]), past, positions)             # one set of angles for both
        if cache is not None:
            if past:
                k, v = torch.cat([cache['k'], k], 2), torch.cat([cache['v'], v], 2)   # (B, H, past + T, hd)
            cache['k'], cache['v'] = k, v
        if mask is not None:  # causal and key padding; every query also sees itself, so no row is empty (NaN)
            causal = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(past)       # (T, past + T)
            own = F.pad(torch.eye(t, dtype=torch.bool, device=x.device), (past, 0))                # (T, past + T)
            allowed = (causal & mask.bool()[:, None, None, :]) | own                             # (B, 1, T, past + T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        elif past:  # query i sits at absolute position past + i and sees keys 0..past + i
            causal = torch.ones(t, k.shape[2], dtype=torch.bool, device=x.device).tril(past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(rearrange(y, 'b h t e -> b t (h e)'))

    def rope(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """RoPE on (..., H, T, hd) at absolute positions offset.. offset + T - 1 (or per-sequence ``positions``
        (B, T)): the first ``rope_dim`` dims of the first ``rope_heads`` heads rotate, the other heads are NoPE."""
        if self.rope_heads == self.num_heads:
            return apply_rope(x, self.rope_dim, self.rope_theta, offset, positions)
        n = self.rope_heads
        return torch.cat([apply_rope(x[..., :n, :, :], self.rope_dim, self.rope_theta, offset, positions),
                          x[..., n:, :, :]], dim=-3)

    def extra_repr(self) -> str:
        return (f'num_heads={self.num_heads}, head_dim={self.head_dim}, rope_dim={self.rope_dim}, '
                f'rope_heads={self.rope_heads}')


# ------------------------------------------------------------------------------------ gated linear attn
def gla_recurrent(q, k, v, log_a, state=None):
    """Token-by-token GLA: S_t = diag(a_t) S_{t-1} + k_t^T v_t, o_t = q_t S_t.

    q, k, log_a: (B, H, T, dk); v: (B, H, T, dv); state: (B, H, dk, dv). Returns (o, final state).
    """
    b, h, t, dk = q.shape
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state
    out = []
    for i in range(t):
        s = s * log_a[:, :, i, :, None].exp() + k[:, :, i, :, None] * v[:, :, i, None, :]
        out.append(torch.einsum('bhk,bhkv->bhv', q[:, :, i], s))
    return torch.stack(out, 2), s


_SAFE_LOG_SPAN = 60.0  # e^60 ~ 1e26: far from fp32 overflow (3e38) after multiplying by O(1) queries and keys


def _gla_intra_factorised(q, k, q_in, decay_in, cum, causal):
    """Inside a chunk, decays factorised onto q and k (total log-decay under 60). -> attn (X, C, C), k_out.
    (The branches of :func:`gla_chunked`'s ``torch.cond``: same operands, the chunk total sliced inside (a cond
    takes no aliased inputs), the causal mask built outside (at a static size).)"""
    total = cum[:, -1:]
    k_back = k / decay_in                                               # k_s e^{-b_s} <= k_s e^{60}: no overflow
    attn = torch.bmm(q_in, k_back.transpose(1, 2)).tril()               # (BHN, C, C), s <= t
    return attn, (k_back * total.exp()).contiguous()                    # k_s decayed to the chunk end


def _gla_intra_exact(q, k, q_in, decay_in, cum, causal):
    """Gates too strong for the factorised form: the decay from s to t per key channel, exp(b_t - b_s), s <= t."""
    total = cum[:, -1:]
    rel = (cum[:, :, None, :] - cum[:, None, :, :]).masked_fill(~causal[..., None], float('-inf')).exp()
    attn = (q[:, :, None] * k[:, None] * rel).sum(-1)                  # sum_e q_te k_se rel_tse: (BHN, C, C)
    return attn, (k * (total - cum).exp()).contiguous()  # both branches' outputs contiguous (one cond layout)


def gla_chunked(q, k, v, log_a, chunk: int = 32, state=None):
    """Chunk-parallel GLA, equal to ``gla_recurrent``.

    All chunks at once: masked attention with decays inside each chunk and each chunk's own contribution to
    the state, as batched matmuls over (batch, head, chunk); then the only sequential part, the state recurrence
    across chunks (T / chunk elementwise steps); then one batched matmul of the queries with the states entering
    their chunks. Inside a chunk the decays are factorised onto q and k (q_t e^{b_t} . k_s e^{-b_s}) when the
    chunk's total log-decay stays under 60; for stronger gates the decay ratios exp(b_t - b_s) are formed
    explicitly, so nothing overflows however strong the gates are. ``torch.bmm`` on 3-d views (not ``@`` on 5-d
    tensors, which copies transposed operands) and an in-place ``baddbmm_`` for intra + inter. Under compile and
    export the choice is a ``torch.cond`` (an ``If`` in ONNX), so the graph keeps both forms.
    """
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    if pad:  # zero keys/values and zero log-decay leave the state unchanged
        q, k, v, log_a = (F.pad(z, (0, 0, 0, pad)) for z in (q, k, v, log_a))
    n = q.shape[2] // chunk
    q, k, v, log_a = (rearrange(z, 'b h (n c) e -> (b h n) c e', c=chunk) for z in (q, k, v, log_a))
    cum = log_a.cumsum(1)                                               # b_t: within-chunk cumsum, (BHN, C, dk)
    total = cum[:, -1:]                                                 # log-decay over the whole chunk, (BHN, 1, dk)
    decay_in = cum.exp()
    q_in = q * decay_in                                                 # q_t decayed from the chunk start
    safe = -total.min() < _SAFE_LOG_SPAN
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()   # s <= t
    if torch.compiler.is_compiling():  # a graph keeps both forms (If in ONNX); eager reads the flag
        # contiguous operands: inductor checks a cond's inputs against the strides it traced them with
        ops = tuple(t.contiguous() for t in (q, k, q_in, decay_in, cum, causal))
        attn, k_out = torch.cond(safe, _gla_intra_factorised, _gla_intra_exact, ops)
    else:
        attn, k_out = (_gla_intra_factorised if safe else _gla_intra_exact)(q, k, q_in, decay_in, cum, causal)
    kv = rearrange(torch.bmm(k_out.transpose(1, 2), v), '(b h n) e f -> b h n e f', b=b, h=h)  # each chunk's state
    chunk_decay = rearrange(total.exp(), '(b h n) 1 e -> b h n e 1', b=b, h=h)
    s = q.new_zeros(b, h, dk, dv) if state is None else state
    entering = []                                                       # the state entering each chunk
    for i in range(n):                                                  # the only sequential part: elementwise
        entering.append(s)
        s = s * chunk_decay[:, :, i] + kv[:, :, i]
    entering = rearrange(torch.stack(entering, 2), 'b h n e f -> (b h n) e f')
    o = torch.bmm(q_in, entering).baddbmm_(attn, v)                     # inter-chunk + intra-chunk, (BHN, C, dv)
    o = rearrange(o, '(b h n) c f -> b h (n c) f', b=b, h=h)[:, :, :t]
    return o, s


@register('sequence_mixer', 'gla', example=dict(dim=32, num_heads=2), **_EX)
class GatedLinearAttention(nn.Module):
    """GLA token mixer: q, k at ``expand_k * d``, v at ``expand_v * d``, per-key-channel forget gate
    log a = logsigmoid(W2 W1 x + b) / 16 (low rank 16), Canon-b SiLU short conv on q, k, v, per-head RMSNorm,
    swish output gate. ``canon_b=True`` adds a residual Canon on concat[q, k, v] before the short conv."""

    def __init__(self, dim: int, num_heads: int = 4, expand_k: float = 0.5, expand_v: float = 1.0,
                 gate_low_rank_dim: int = 16, gate_logit_normalizer: float = 16.0, short_conv: bool = True,
                 conv_kernel: int = 4, canon_b: bool = False, canon_kernel: int = 4, chunk_size: int = 32,
                 canon_activation: bool = False):
        super().__init__()
        self.key_dim, self.value_dim = int(dim * expand_k), int(dim * expand_v)
        if self.key_dim % num_heads or self.value_dim % num_heads:
            raise ValueError(f'key dim {self.key_dim} and value dim {self.value_dim} must divide by num_heads {num_heads}')
        self.num_heads, self.normalizer, self.chunk_size = num_heads, gate_logit_normalizer, chunk_size
        qkv_dim = 2 * self.key_dim + self.value_dim
        self.qkv = nn.Linear(dim, qkv_dim, bias=False)
        self.canon_b = Canon(qkv_dim, canon_kernel, activation=canon_activation) if canon_b else None
        self.short_conv = ShortConv(qkv_dim, conv_kernel) if short_conv else None
        self.gk = nn.Sequential(nn.Linear(dim, gate_low_rank_dim, bias=False), nn.Linear(gate_low_rank_dim, self.key_dim))
        self.g = nn.Linear(dim, self.value_dim, bias=False)
        self.norm = nn.RMSNorm(self.value_dim // num_heads, eps=1e-5)
        self.proj = nn.Linear(self.value_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d). ``cache``: ``None`` for a whole sequence, else a dict (``{}`` to start) holding the
        Canon-B and short-conv windows and the (B, H, dk, dv) state; updated in place (prefill, then decoding).
        ``mask``: optional (B, L >= T) attention mask (1 = token, 0 = padding); a padded step adds nothing to the
        state and does not decay it."""
        qkv = apply_cached(self.canon_b, self.qkv(x), cache, 'canon_b', mask)  # (B, T, 2dk + dv)
        qkv = apply_cached(self.short_conv, qkv, cache, 'conv', mask)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        log_a = F.logsigmoid(self.gk(x)) / self.normalizer
        k, log_a = zero_padding(k, mask), zero_padding(log_a, mask)         # padded steps: S_t = S_{t-1}
        h = self.num_heads
        q, k, log_a = (rearrange(z, 'b t (h e) -> b h t e', h=h) for z in (q, k, log_a))
        v = rearrange(v, 'b t (h e) -> b h t e', h=h)
        q = q * q.shape[-1] ** -0.5
        state = None if cache is None else cache.get('state')
        if cache is not None and x.shape[1] == 1:    # one decoding step: the recurrence itself
            o, state = gla_recurrent(q, k, v, log_a, state)
        else:
            o, state = gla_chunked(q, k, v, log_a, self.chunk_size, state)
        if cache is not None:
            cache['state'] = state
        o = rearrange(self.norm(o), 'b h t e -> b t (h e)')
        return self.proj(o * F.silu(self.g(x)))


# -------------------------------------------------------------------------------------------- Mamba2
def ssd_recurrent(x, dt, a, bm, cm, state=None):
    """Token-by-token SSD: h_t = exp(dt_t a) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t.

    x: (B, T, H, P); dt: (B, T, H) (after softplus); a: (H,) negative; bm, cm: (B, T, N).
    Returns y (B, T, H, P) and the final state (B, H, P, N).
    """
    b, t, h, p = x.shape
    s = x.new_zeros(b, h, p, bm.shape[-1]) if state is None else state
    out = []
    for i in range(t):
        decay = (dt[:, i] * a).exp()                                   # (B, H)
        s = s * decay[..., None, None] + torch.einsum('bh,bhp,bn->bhpn', dt[:, i], x[:, i], bm[:, i])
        out.append(torch.einsum('bhpn,bn->bhp', s, cm[:, i]))
    return torch.stack(out, 1), s


def ssd_chunked(x, dt, a, bm, cm, chunk: int = 64, state=None):
    """Chunked SSD (Mamba2's "state space duality" form), equal to ``ssd_recurrent``.

    All chunks at once: a decay-masked C B^T attention inside each chunk (batched over batch, head, chunk) and
    each chunk's own contribution to the state; then the only sequential part, the state recurrence across
    chunks (elementwise, T / chunk steps); then C times the states entering each chunk. B and C are shared by
    the heads, so the state products run for all heads in one matmul per chunk, with heads x head_dim as the
    matrix width (bigger, fewer matmuls than one per head)."""
    b, t, h, p = x.shape
    pad = (-t) % chunk
    if pad:  # dt = 0 and x = 0 on the padding: no decay, no input
        x, bm, cm = F.pad(x, (0, 0, 0, 0, 0, pad)), F.pad(bm, (0, 0, 0, pad)), F.pad(cm, (0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
    n = x.shape[1] // chunk
    x = rearrange(x * dt[..., None], 'b (n c) h p -> b n c h p', c=chunk)   # dt folded into the input
    cum = rearrange(dt * a, 'b (n c) h -> b n c h', c=chunk).cumsum(2)    # log-decay from the chunk start
    bm, cm = (rearrange(z, 'b (n c) s -> (b n) c s', c=chunk) for z in (bm, cm))
    # intra-chunk: y_t = sum_{s <= t} e^{cum_t - cum_s} (C_t . B_s) x_s, per head
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    seg = rearrange(cum, 'b n c h -> b h n c')
    decay = (seg[..., :, None] - seg[..., None, :]).masked_fill(~mask, float('-inf')).exp()  # (B, H, N, C, C)
    scores = rearrange(torch.bmm(cm, bm.transpose(1, 2)), '(b n) t s -> b 1 n t s', b=b)    # C_t . B_s
    intra = (decay * scores) @ rearrange(x, 'b n c h p -> b h n c p')        # (B, H, N, C, P)
    # each chunk's own state, all heads at once: B^T (x e^{cum_end - cum_s}), (BN, S, H P)
    to_end = (cum[:, :, -1:] - cum).exp()                                  # (B, N, C, H)
    own = torch.bmm(bm.transpose(1, 2), rearrange(x * to_end[..., None], 'b n c h p -> (b n) c (h p)'))
    own = rearrange(own, '(b n) s (h p) -> b n s h p', b=b, h=h)
    chunk_decay = rearrange(cum[:, :, -1].exp(), 'b n h -> b n 1 h 1')
    s = x.new_zeros(b, bm.shape[-1], h, p) if state is None else rearrange(state, 'b h p s -> b s h p')
    entering = []                                                          # the state entering each chunk
    for i in range(n):                                                     # the only sequential part: elementwise
        entering.append(s)
        s = s * chunk_decay[:, i] + own[:, i]
    entering = rearrange(torch.stack(entering, 1), 'b n s h p -> (b n) s (h p)')
    inter = rearrange(torch.bmm(cm, entering), '(b n) c (h p) -> b n c h p', b=b, h=h) * cum.exp()[..., None]
    y = rearrange(intra, 'b h n c p -> b (n c) h p') + rearrange(inter, 'b n c h p -> b (n c) h p')
    return y[:, :t], rearrange(s, 'b s h p -> b h p s')


@register('sequence_mixer', 'mamba2', example=dict(dim=32, head_dim=16, d_state=8), **_EX)
class Mamba2Mixer(nn.Module):
    """Mamba2 mixer: in_proj -> [z, x, B, C, dt]; Canon-b SiLU conv on (x, B, C); chunked SSD with a scalar
    decay per head and D skip; y * silu(z) through a gated RMSNorm; out_proj. ``canon_b=True`` adds a residual
    Canon on the whole in_proj output (m = 2*expand*d + 2*d_state + heads, as the paper's 4d + o(d))."""

    def __init__(self, dim: int, expand: int = 2, head_dim: int = 64, d_state: int = 64, short_conv: bool = True,
                 conv_kernel: int = 4, canon_b: bool = False, canon_kernel: int = 4, chunk_size: int = 64,
                 dt_min: float = 1e-3, dt_max: float = 0.1, canon_activation: bool = False):
        super().__init__()
        self.d_inner, self.d_state = expand * dim, d_state
        if self.d_inner % head_dim:
            raise ValueError(f'expand * dim = {self.d_inner} must divide by head_dim {head_dim}')
        self.num_heads, self.head_dim, self.chunk_size = self.d_inner // head_dim, head_dim, chunk_size
        self.dt_min, self.dt_max = dt_min, dt_max
        in_dim = 2 * self.d_inner + 2 * d_state + self.num_heads
        self.in_proj = nn.Linear(dim, in_dim, bias=False)
        self.canon_b = Canon(in_dim, canon_kernel, activation=canon_activation) if canon_b else None
        self.short_conv = ShortConv(self.d_inner + 2 * d_state, conv_kernel) if short_conv else None
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.D = nn.Parameter(torch.empty(self.num_heads))
        self.norm = nn.RMSNorm(self.d_inner, eps=1e-5)
        self.out_proj = nn.Linear(self.d_inner, dim, bias=False)
        self.reset_ssm_parameters()

    def reset_ssm_parameters(self) -> None:
        """Mamba2's init: dt log-uniform in [dt_min, dt_max] (stored through softplus^-1), A ~ U[1, 16], D = 1."""
        with torch.no_grad():
            dt = torch.exp(torch.rand(self.num_heads, device=self.dt_bias.device)
                           * (math.log(self.dt_max) - math.log(self.dt_min)) + math.log(self.dt_min))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))          # inverse softplus
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
            self.D.fill_(1.0)

    def forward(self, u: torch.Tensor, cache: dict | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """u: (B, T, d). ``cache``: ``None`` for a whole sequence, else a dict (``{}`` to start) holding the
        Canon-B and conv1d windows and the (B, H, P, N) SSM state; updated in place (prefill, then decoding).
        ``mask``: optional (B, L >= T) attention mask (1 = token, 0 = padding); a padded step has dt = 0, so it
        neither decays nor feeds the state."""
        zxbcdt = apply_cached(self.canon_b, self.in_proj(u), cache, 'canon_b', mask)  # (B, T, 2 d_inner + 2 N + H)
        z, xbc, dt = zxbcdt.split([self.d_inner, self.d_inner + 2 * self.d_state, self.num_heads], dim=-1)
        xbc = apply_cached(self.short_conv, xbc, cache, 'conv', mask)
        x, bm, cm = xbc.split([self.d_inner, self.d_state, self.d_state], dim=-1)
        x = rearrange(x, 'b t (h p) -> b t h p', p=self.head_dim)
        dt = zero_padding(F.softplus(dt + self.dt_bias), mask)              # (B, T, H)
        state = None if cache is None else cache.get('state')
        if cache is not None and u.shape[1] == 1:    # one decoding step: the recurrence itself
            y, state = ssd_recurrent(x, dt, -self.A_log.exp(), bm, cm, state)
        else:
            y, state = ssd_chunked(x, dt, -self.A_log.exp(), bm, cm, self.chunk_size, state)
        if cache is not None:
            cache['state'] = state
        y = y + x * self.D[:, None]
        y = rearrange(y, 'b t h p -> b t (h p)')
        return self.out_proj(self.norm(y * F.silu(z)))
