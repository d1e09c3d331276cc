"""Mamba's selective scan in pure PyTorch: a sequential reference and an exact chunked scan.

Paper: Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces" (arXiv 2312.00752);
the semantics are those of ``selective_scan_ref`` in https://github.com/state-spaces/mamba, which the
VMamba / Mamba-YOLO CUDA kernels (https://github.com/HZAI-ZJNU/Mamba-YOLO) also compute. For every
channel ``d`` (of ``KD = G * Dg`` channels in ``G`` groups sharing B and C) and state ``n`` (of ``N``):

    d_t = softplus(delta_t + delta_bias)                 (when delta_softplus)
    h_t = exp(d_t * A[d, n]) * h_{t-1} + d_t * B[g, n, t] * u_t
    y_t = sum_n C[g, n, t] * h_t[n]  +  D[d] * u_t

accumulated in float32 (float64 stays float64) and returned in the input dtype.

The decay ``exp(d_t * A)`` differs per channel *and* per state, so Mamba2's "decay is a scalar per
head" matrix form does not apply. Candidates (measured in ``eval/scan_bench.py``, docs/mamba_yolo.md):

- ``'sequential'``: the reference, one Python step per position (L steps).
- ``'chunked'`` (default): the sequence is cut into chunks of ``T``; a sequential pass runs *inside*
  every chunk at once (T steps on tensors holding all chunks) to get each chunk's end state, the states
  are carried across chunks (L/T cheap steps), and a second pass re-runs the chunks from their true
  entering states, reading y. Decays and inputs are formed per step (cache-sized), in place, on
  position-major slabs. About 2 sqrt(L) steps. It is one operator, ``torch.ops.zoo.selective_scan``
  (``torch.library.custom_op``, with a fake implementation), whose backward is a second one,
  ``zoo::selective_scan_backward``, written by hand (the adjoint is a reverse linear recurrence, chunked the
  same way). ``torch.compile`` (with or without freezing, training included) and ``torch.export`` capture the
  scan as that one opaque node: the eager code runs inside the graph, its loops are never traced, and a pt2 file
  holds the node (the operators are registered when ``zoo.layers`` is imported). ONNX cannot hold it: ONNX export
  writes it out first as the ``'loop'`` form of :mod:`zoo.layers.selective_scan_graph` (the same two passes as
  ``torch.scan`` loops, ONNX ``Scan``; the ``'parallel'`` log-depth form is there too).
- ``'chunked_autograd'``: the same passes as plain tensor ops under autograd (the previous default; the
  A/B baseline of the benchmark and a check of the hand-written backward).
- ``'segsum'``: inside a chunk, ``h_t = sum_{s<=t} exp(S_t - S_s) * dBu_s`` as a masked (T x T) product
  (exponents never positive); same carry. Work grows with T.

VMamba's ``selective_scan_easy`` computes ``exp(S_t) * cumsum(dBu_s / exp(S_s))``: the division
overflows (exp(-S) -> inf) on long chunks or large |A| and yields NaN. Nothing here divides by a decay.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ['selective_scan', 'selective_scan_ref', 'selective_scan_chunked', 'selective_scan_chunked_autograd',
           'selective_scan_segsum']


def _auto_chunk(length: int) -> int:
    """The chunk size when none is given: one chunk up to L = 128, else the power of two nearest 2 sqrt(L)
    within [16, 256].

    Chosen by measurement (``python -m zoo.eval.scan_bench scan --stride 4|8|16|32``, docs/mamba_yolo.md):
    the chunked scan is flat within noise from 32 to 512 at L = 6400 (stride 4 at 320 px) and best near
    2 sqrt(L) at L = 1600 and 400; at L = 100 one chunk (no first pass, no carry) was fastest.
    """
    if length <= 128:
        return max(1, length)
    return int(min(256, max(16, 2 ** round(math.log2(2 * math.sqrt(length))))))


def _check(u, delta, A, B, C, D, delta_bias):
    """Check shapes and upcast to the compute dtype (float64 stays float64, else float32).

    Returns u, delta, A, B, C (grouped: (B, G, N, L)), D, delta_bias."""
    if u.ndim != 3 or delta.shape != u.shape:
        raise ValueError(f'u and delta must both be (batch, channels, length); got {tuple(u.shape)} and '
                         f'{tuple(delta.shape)}')
    bsz, kd, length = u.shape
    if A.shape[0] != kd or A.ndim != 2:
        raise ValueError(f'A must be (channels={kd}, d_state); got {tuple(A.shape)}')
    n = A.shape[1]
    if B.ndim == 3:  # (B, N, L): one group
        B, C = B.unsqueeze(1), C.unsqueeze(1)
    if B.ndim != 4 or B.shape[0] != bsz or B.shape[2] != n or B.shape[3] != length or C.shape != B.shape:
        raise ValueError(f'B and C must be (batch={bsz}, groups, d_state={n}, length={length}); got '
                         f'{tuple(B.shape)} and {tuple(C.shape)}')
    if kd % B.shape[1]:
        raise ValueError(f'channels ({kd}) must be a multiple of the B/C groups ({B.shape[1]})')
    dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
    return tuple(t.to(dtype) if t is not None else None for t in (u, delta, A, B, C, D, delta_bias))


def _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus):
    """:func:`_check`, then bias + softplus (F.softplus, as mamba-ssm). Returns the tensors and the groups."""
    u, delta, A, B, C, D, delta_bias = _check(u, delta, A, B, C, D, delta_bias)
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    return u, delta, A, B, C, D, B.shape[1]


def _finish(y, u, D, out_dtype):
    if D is not None:
        y = y + D[:, None] * u
    return y.to(out_dtype)


def selective_scan_ref(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False):
    """The sequential reference (one step per position). Shapes as :func:`selective_scan`."""
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    bsz, kd, length = u.shape
    dg = kd // groups
    # (B, G, N, L) -> (B, KD, N, L): each group's B/C serves its Dg channels
    Bx, Cx = B.repeat_interleave(dg, dim=1), C.repeat_interleave(dg, dim=1)
    decay = torch.exp(delta[..., None] * A[:, None, :])          # (B, KD, L, N)
    dbu = (delta * u)[..., None] * Bx.transpose(2, 3)            # (B, KD, L, N)
    h = u.new_zeros(bsz, kd, A.shape[1])
    ys = []
    # unbind, not indexing: the backward of L index ops would form L full-size zero gradients
    for dec_t, dbu_t, c_t in zip(decay.unbind(2), dbu.unbind(2), Cx.unbind(-1)):
        h = dec_t * h + dbu_t
        ys.append(torch.einsum('bdn,bdn->bd', h, c_t))
    y = torch.stack(ys, dim=-1)                                  # (B, KD, L)
    return _finish(y, u, D, out_dtype)


def _to_chunks(u, delta, A, B, C, groups, chunk):
    """Pad L to a multiple of ``chunk`` and lay everything out as (T, B, G, nc, Dg, N) for step slicing.

    Padded positions get delta = 0: decay 1 and input 0, and they come after every real position.
    """
    bsz, kd, length = u.shape
    pad = (-length) % chunk
    if pad:
        u, delta = F.pad(u, (0, pad)), F.pad(delta, (0, pad))
        B, C = F.pad(B, (0, pad)), F.pad(C, (0, pad))
    nc = (length + pad) // chunk
    dg = kd // groups
    # (B, G*Dg, nc*T) -> (T, B, G, nc, Dg, 1)
    d6 = delta.reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2)[..., None]
    du6 = (delta * u).reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2)[..., None]
    A6 = A.reshape(groups, 1, dg, A.shape[1])                       # (G, 1, Dg, N)
    # (B, G, N, nc*T) -> (T, B, G, nc, 1, N)
    B6 = B.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2)[..., None, :]
    C6 = C.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2)   # (T, B, G, nc, N)
    dA = d6 * A6                                                 # (T, B, G, nc, Dg, N), all <= 0
    dbu = du6 * B6                                               # (T, B, G, nc, Dg, N)
    return dA, dbu, C6, nc, dg, length


def _carry_and_read(h_local, dA, C6, length, bsz, kd):
    """Given the within-chunk states ``h_local`` (started from zero), add the carried state and read y.

    h_local, dA: (T, B, G, nc, Dg, N); C6: (T, B, G, nc, N). Returns y (B, KD, L).
    """
    steps, nc = dA.shape[0], dA.shape[3]
    S = torch.cumsum(dA, dim=0)                                  # decay since the chunk start, <= 0
    chunk_decay = torch.exp(S[-1])                               # (B, G, nc, Dg, N)
    # carry: the state entering chunk c is h_in[c] = exp(S_end[c-1]) * h_in[c-1] + h_local_end[c-1]
    h_in = [torch.zeros_like(chunk_decay[:, :, 0])]
    for c in range(nc - 1):
        h_in.append(torch.addcmul(h_local[-1, :, :, c], chunk_decay[:, :, c], h_in[-1]))
    h_in = torch.stack(h_in, dim=2)                              # (B, G, nc, Dg, N)
    h = torch.addcmul(h_local, torch.exp(S), h_in)               # (T, B, G, nc, Dg, N)
    y = torch.matmul(h, C6[..., None]).squeeze(-1)               # (T, B, G, nc, Dg)
    # (T, B, G, nc, Dg) -> (B, G*Dg, nc*T)
    y = y.permute(1, 2, 4, 3, 0).reshape(bsz, kd, nc * steps)
    return y[..., :length]


# ------------------------------------------------------------------------- the fast chunked scan
# Everything below works on a "step layout": position p = c T + t (chunk c, step t) of a (B, R, L) tensor
# is stored at [t, c] of a contiguous (T, nc, B, R) tensor (:func:`_steps`), so one step of the loops
# (position t of every chunk) reads one contiguous slab [t]. The recurrence runs on (nc, B, G, N, Dg) slabs: states before
# channels, so the broadcasts (a step size per channel, a B_t per state) run along the contiguous channel
# axis, and the contractions over N or Dg are batched matrix products on views. Slabs are preallocated and
# written in place (out=): on a CPU the cost is memory traffic and allocation, not arithmetic.

_LOG2E, _LN2 = 1.4426950408889634, 0.6931471805599453


def _steps(x: torch.Tensor, chunk: int, groups: int, state: bool = False) -> torch.Tensor:
    """(B, R, L) or (B, G, N, L) -> (T, nc, B, G, 1, R/G), or (T, nc, B, G, R/G, 1) if ``state``; contiguous,
    zero-padded to nc T positions. One copy of whole rows when ``x`` is position-major in memory (SS2D's
    layout); a (.., L)-contiguous ``x`` is first turned position-major by a blocked 2-D transpose."""
    b, length = x.shape[0], x.shape[-1]
    if x.stride(-1) == 1 and length > 1:
        src = x.reshape(-1, length).t().contiguous().view(length, *x.shape[:-1])   # b ... l -> l b ...
    else:
        src = x.movedim(-1, 0)                                   # b ... l -> l b ... (a view)
    full, rem = divmod(length, chunk)
    out = x.new_empty((chunk, full + (rem > 0)) + src.shape[1:])
    if full:                                                     # (nc T) b ... -> T nc b ...
        out[:, :full].copy_(src[:full * chunk].unflatten(0, (full, chunk)).transpose(0, 1))
    if rem:
        out[:rem, full].copy_(src[full * chunk:])
        out[rem:, full].zero_()
    r = out[0, 0, 0].numel() // groups
    return out.view(*out.shape[:3], groups, *((r, 1) if state else (1, r)))


def _zero_padding_(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero the padded positions (after ``length``) of a step tensor (T, nc, ...), in place."""
    rem = length - (x.shape[1] - 1) * x.shape[0]
    if rem < x.shape[0]:
        x[rem:, -1] = 0
    return x


def _from_steps(y: torch.Tensor, length: int) -> torch.Tensor:
    """(T, nc, B, G, ., .) -> (B, R, L): the inverse of :func:`_steps`, padding dropped. The result is a
    transposed view of (L, B, R) memory (position-major, as SS2D reads it), not a contiguous tensor."""
    steps, nc, b = y.shape[:3]
    flat = y.transpose(0, 1).reshape(nc * steps, b, -1)[:length]   # T nc b g x y -> l b r
    return flat.permute(1, 2, 0)


def _decay(d_t, A2, out):
    """exp(d A) as exp2(d A log2 e): torch's exp2 measured ~4x faster than exp on this CPU (float32)."""
    return torch.mul(d_t, A2, out=out).exp2_()


def _mats(x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
    """Step tensor (T, nc, B, G, a, b) -> (T, M, a, b) (or a slab (nc, B, G, a, b) -> (M, a, b)), M = nc B G:
    a view for torch.bmm, the last two dims swapped if ``transpose`` (made once, outside the loops)."""
    x = x.flatten(-5, -3)
    return x.transpose(-1, -2) if transpose else x


def _chunk_ends(d, du, Bs, A2):
    """Pass 1: every chunk from a zero state to its end state, all chunks per step. -> (nc, B, G, N, Dg)."""
    slab = d.shape[1:4] + A2.shape[-2:]
    h, e = d.new_zeros(slab), d.new_empty(slab)
    if not len(h):
        return h
    for d_t, du_t, b_t in zip(d, du, Bs):
        h.mul_(_decay(d_t, A2, e)).addcmul_(du_t, b_t)          # h = exp(d A) h + (d u) B
    return h


def _carry(ends, span, reverse=False):
    """The state entering every chunk (nc of them) from nc - 1 chunk-local end states (L / T small steps).

    Forward, ``ends``/``span`` of chunks 0 .. nc-2: enter[c] = span[c-1] enter[c-1] + ends[c-1].
    Reverse (adjoints, from the right), ``ends``/``span`` of chunks 1 .. nc-1 (row i is chunk i + 1):
    enter[c] = span[c+1] enter[c+1] + ends[c+1]. ``span`` is the decay across a whole chunk.
    """
    nc = ends.shape[0] + 1
    enter = ends.new_zeros((nc,) + ends.shape[1:])
    for c in (range(nc - 2, -1, -1) if reverse else range(1, nc)):
        torch.addcmul(ends[c if reverse else c - 1], span[c if reverse else c - 1], enter[c + 1 if reverse else c - 1],
                      out=enter[c])
    return enter


def _chunk_states(d, du, Bs, Cs, A2, enter, states=None):
    """Pass 2: every chunk from its true entering state. Returns y (T, nc, B, G, 1, Dg), y_t = C_t . h_t,
    or, given ``states`` (T, nc, B, G, N, Dg), fills it with every h_t instead (for the backward)."""
    h, e = enter.clone(), torch.empty_like(enter)
    # per-step views made once (unbind): indexing tensors inside the loop costs a call per index
    if states is not None:
        for d_t, du_t, b_t, s_t in zip(d.unbind(0), du.unbind(0), Bs.unbind(0), states.unbind(0)):
            h = torch.mul(h, _decay(d_t, A2, e), out=s_t).addcmul_(du_t, b_t)
        return None
    y = d.new_empty(d.shape)
    hm = _mats(h)
    for d_t, du_t, b_t, c_t, y_t in zip(d.unbind(0), du.unbind(0), Bs.unbind(0), _mats(Cs, transpose=True).unbind(0),
                                        _mats(y).unbind(0)):
        h.mul_(_decay(d_t, A2, e)).addcmul_(du_t, b_t)
        torch.bmm(c_t, hm, out=y_t)                              # (M, 1, N) @ (M, N, Dg) -> (M, 1, Dg)
    return y


def _softplus_(x: torch.Tensor) -> torch.Tensor:
    """softplus in place with Mamba's threshold (x > 20 kept as is): max(x, log(1 + exp(min(x, 20)))), which
    is log(1 + exp(x)) up to 20 and x above. F.softplus's log1p is not vectorised on the CPU (measured 5x
    slower); the two differ by less than one ulp of 1. (exp2(x log2 e) was faster but measurably less
    accurate here: the rounding of x log2 e shifts softplus by up to |x| eps.)"""
    t = torch.clamp(x, max=20).exp_().add_(1).log_()
    return torch.maximum(x, t, out=x)


def _layout(u, delta, A, B, C, delta_bias, delta_softplus: bool, chunk: int):
    """The inputs in step layout (compute dtype, B/C grouped): the step sizes d (bias, softplus, zero on the
    padding: decay 1, input 0), u, d u, B, C, A log2 e as (G, N, Dg), and the decay across each whole chunk."""
    groups = B.shape[1]
    d = _steps(delta, chunk, groups)                             # (T, nc, B, G, 1, Dg)
    if delta_bias is not None:
        d.add_(delta_bias.view(groups, 1, -1))
    if delta_softplus:
        _softplus_(d)
    _zero_padding_(d, u.shape[-1])
    us = _steps(u, chunk, groups)
    du = us * d
    Bs, Cs = (_steps(x, chunk, groups, state=True) for x in (B, C))   # (T, nc, B, G, N, 1)
    A2 = (A * _LOG2E).view(groups, -1, A.shape[1]).transpose(1, 2).contiguous()   # (G, N, Dg)
    span = torch.exp2(d.sum(0) * A2)                            # (nc, B, G, N, Dg)
    return us, d, du, Bs, Cs, A2, span


def _position_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` laid out as :func:`_from_steps` returns it (the last dim outermost in memory, the others contiguous),
    copied only if it is not. The custom ops' outputs must have the strides their fake implementations promise."""
    out = x.new_empty((x.shape[-1],) + x.shape[:-1]).movedim(0, -1)
    return x if x.stride() == out.stride() else out.copy_(x)


@torch.library.custom_op('zoo::selective_scan', mutates_args=())
def _scan_op(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor | None, delta_bias: torch.Tensor | None, delta_softplus: bool,
             chunk: int) -> torch.Tensor:
    """The chunked scan as one operator (compute dtype, B/C grouped (B, G, N, L)): y (B, KD, L), position-major.

    Pass 1 runs every chunk but the last from a zero state to its end state; the carry turns those into the
    states entering the chunks; pass 2 re-runs every chunk from its true entering state and reads y."""
    length = u.shape[-1]
    _, d, du, Bs, Cs, A2, span = _layout(u, delta, A, B, C, delta_bias, delta_softplus, chunk)
    enter = _carry(_chunk_ends(d[:, :-1], du[:, :-1], Bs[:, :-1], A2), span[:-1])
    y = _position_major(_from_steps(_chunk_states(d, du, Bs, Cs, A2, enter), length))
    if D is not None:
        y.addcmul_(u, D[:, None])
    return y


@_scan_op.register_fake
def _(u, delta, A, B, C, D, delta_bias, delta_softplus, chunk):
    return u.new_empty((u.shape[-1],) + u.shape[:-1]).movedim(0, -1)


@torch.library.custom_op('zoo::selective_scan_backward', mutates_args=())
def _scan_backward_op(gy: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, D: torch.Tensor | None, delta_bias: torch.Tensor | None,
                      delta_softplus: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                 torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hand-written backward of ``zoo::selective_scan``: gradients of u, delta, A, B, C, D, delta_bias (the
    last two zeros when the input is None). The step layouts and the states entering the chunks are recomputed
    (copies and pass 1: a fraction of the backward's work, and the forward keeps one output, which ONNX export
    can decompose).

    It recomputes the states h_t (one (L, N, KD) buffer) and runs the adjoint, itself a linear recurrence in
    reverse, gh_t = C_t gy_t + exp(d_{t+1} A) gh_{t+1}, chunked the same way, reading every gradient per step:
    dC_t = sum_d gy h_t; d(du)_t = sum_n B_t gh_t; dB_t = sum_d gh_t du_t; with w_t = gh_t exp(d_t A) h_{t-1},
    dd_t = sum_n A w_t and dA = sum_t d_t w_t; then the chain through du = d u, softplus and the D skip."""
    length, groups = u.shape[-1], B.shape[1]
    us, d, du, Bs, Cs, A2, span = _layout(u, delta, A, B, C, delta_bias, delta_softplus, chunk)
    enter = _carry(_chunk_ends(d[:, :-1], du[:, :-1], Bs[:, :-1], A2), span[:-1])
    g = _steps(gy, chunk, groups)                                # (T, nc, B, G, 1, Dg)
    states = d.new_empty((d.shape[0],) + enter.shape)           # (T, nc, B, G, N, Dg): every h_t
    _chunk_states(d, du, Bs, Cs, A2, enter, states)
    # reverse pass 1: the adjoint each chunk passes to the left, from zero beyond its end (chunk 0's is never
    # used). k is the adjoint arriving at position t from the right; gh_t = k + C_t gy_t, then k = exp(d_t A) gh_t
    k, e = torch.zeros_like(enter[1:]), torch.empty_like(enter[1:])
    if len(k):
        for d_t, c_t, g_t in zip(d[:, 1:].unbind(0)[::-1], Cs[:, 1:].unbind(0)[::-1], g[:, 1:].unbind(0)[::-1]):
            k.addcmul_(c_t, g_t).mul_(_decay(d_t, A2, e))
    k, e = _carry(k, span[1:], reverse=True), torch.empty_like(enter)
    gh, w, dA = torch.empty_like(k), torch.empty_like(k), torch.zeros_like(k)
    g_d, g_du, g_B, g_C = torch.empty_like(d), torch.empty_like(du), torch.empty_like(Bs), torch.empty_like(Cs)
    ghm = _mats(gh)
    per_step = zip(d.unbind(0), Cs.unbind(0), g.unbind(0), _mats(Bs, transpose=True).unbind(0),
                   _mats(du, transpose=True).unbind(0), _mats(states).unbind(0), _mats(g, transpose=True).unbind(0),
                   (enter,) + states.unbind(0)[:-1], _mats(g_du).unbind(0), _mats(g_B).unbind(0),
                   _mats(g_C).unbind(0), g_d.unbind(0))
    for d_t, c_t, g_t, bm_t, dum_t, sm_t, gm_t, h_prev, g_du_t, g_B_t, g_C_t, g_d_t in list(per_step)[::-1]:
        _decay(d_t, A2, e)
        torch.addcmul(k, c_t, g_t, out=gh)                       # gh_t, the whole adjoint of h_t
        torch.bmm(bm_t, ghm, out=g_du_t)                         # sum_n B_t[n] gh_t[n, :]
        torch.bmm(ghm, dum_t, out=g_B_t)                         # sum_d gh_t[:, d] du_t[d]
        torch.bmm(sm_t, gm_t, out=g_C_t)                         # sum_d h_t[:, d] gy_t[d]
        torch.mul(gh, e, out=k)                                  # passed on to position t - 1
        torch.mul(k, h_prev, out=w)                              # gh_t exp(d_t A) h_{t-1}
        dA.addcmul_(w, d_t)
        torch.sum(w.mul_(A2), dim=-2, keepdim=True, out=g_d_t)
    # d exp2(d A2) / dd = ln2 A2 exp2(d A2); du = d u
    g_d.mul_(_LN2).addcmul_(g_du, us)
    g_u = _position_major(_from_steps(g_du.mul_(d), length))
    if D is not None:
        g_u.addcmul_(gy, D[:, None])
    if delta_softplus:  # softplus' = sigmoid = 1 - exp(-softplus), 1 above the threshold
        g_d.mul_(torch.where(d > 20, 1.0, -torch.exp(-d) + 1))
    g_A = (dA.sum((0, 1)) * (_LN2 * _LOG2E)).transpose(1, 2).reshape(-1, A2.shape[1])  # g n d -> (g d) n
    g_bias = g_d.sum((0, 1, 2)).reshape(-1) if delta_bias is not None else u.new_zeros(u.shape[1])
    g_D = (gy * u).sum((0, 2)) if D is not None else u.new_zeros(u.shape[1])
    # (B, G N, L) -> (B, G, N, L), position-major
    g_B, g_C = (_position_major(_from_steps(x, length).unflatten(1, (groups, -1))) for x in (g_B, g_C))
    return (g_u, _position_major(_from_steps(g_d, length)), g_A.contiguous(), g_B, g_C, g_D.contiguous(),
            g_bias.contiguous())


@_scan_backward_op.register_fake
def _(gy, u, delta, A, B, C, D, delta_bias, delta_softplus, chunk):
    def pm(x):
        return x.new_empty((x.shape[-1],) + x.shape[:-1]).movedim(0, -1)
    kd = u.shape[1]
    return pm(u), pm(u), A.new_empty(A.shape), pm(B), pm(B), u.new_empty(kd), u.new_empty(kd)


def _scan_setup(ctx, inputs, output):
    u, delta, A, B, C, D, delta_bias, delta_softplus, chunk = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, delta_bias)
    ctx.setup = delta_softplus, chunk


def _scan_backward(ctx, gy):
    u, delta, A, B, C, D, delta_bias = ctx.saved_tensors
    grads = torch.ops.zoo.selective_scan_backward(gy, u, delta, A, B, C, D, delta_bias, *ctx.setup)
    return (*grads[:5], grads[5] if D is not None else None, grads[6] if delta_bias is not None else None, None, None)


_scan_op.register_autograd(_scan_backward, setup_context=_scan_setup)


_GRAPH_FORM = None  # set by zoo.layers.selective_scan_graph while exporting a graph without zoo's operators


def selective_scan_chunked(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """Exact chunked scan (the default): a pass inside all chunks at once, a carry across chunks, a second pass.

    Pass 1 runs every chunk from a zero state to its end state; the carry turns those into the state
    entering each chunk (L / T small steps, with the chunk's total decay exp(A sum d)); pass 2 re-runs
    every chunk from its true entering state and reads y. Each step advances one position of all chunks
    together on (nc, B, G, N, Dg) slabs (cache-sized; no (B, KD, L, N) tensor in the forward), written in
    place. 2 T + L / T Python steps; only decays in (0, 1] are multiplied. One operator,
    ``torch.ops.zoo.selective_scan``, with a hand-written backward (``zoo::selective_scan_backward``): what
    ``torch.compile`` and ``torch.export`` capture, as one opaque node.
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D, bias = _check(u, delta, A, B, C, D, delta_bias)
    length = u.shape[-1]
    chunk = min(chunk_size or _auto_chunk(length), length)
    if _GRAPH_FORM is not None:  # exporting for ONNX (selective_scan_graph.decompose): plain tensor ops
        return _GRAPH_FORM(u, delta, A, B, C, D, bias, delta_softplus, chunk).to(out_dtype)
    return torch.ops.zoo.selective_scan(u, delta, A, B, C, D, bias, delta_softplus, chunk).to(out_dtype)


def selective_scan_chunked_autograd(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """The previous default: :func:`selective_scan_chunked`'s passes written as autograd-traced tensor ops.

    Kept as the A/B baseline of ``eval/scan_bench.py`` and as an independent check of the hand-written
    backward (tests). Autograd records every step's tensors, so its backward is slow and memory-hungry.
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    bsz, kd, length = u.shape
    chunk = min(chunk_size or _auto_chunk(length), length)
    pad = (-length) % chunk
    u0 = u
    if pad:
        u, delta = F.pad(u, (0, pad)), F.pad(delta, (0, pad))
        B, C = F.pad(B, (0, pad)), F.pad(C, (0, pad))
    nc, dg = (length + pad) // chunk, kd // groups
    # (B, G*Dg, nc*T) -> (T, B, G, nc, 1, Dg); (B, G, N, nc*T) -> (T, B, G, nc, N, 1) and (T, B, G, nc, 1, N)
    d = delta.reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(4).contiguous()
    du = (delta * u).reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(4).contiguous()
    Bt = B.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(-1).contiguous()
    Ct = C.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(4).contiguous()
    At = A.reshape(groups, dg, A.shape[1]).transpose(1, 2).unsqueeze(1)   # (G, 1, N, Dg)
    # pass 1: every chunk from a zero state to its end state
    # unbind, not indexing, in every loop: the backward of an index op forms a full-size zero gradient
    steps = list(zip(d.unbind(0), du.unbind(0), Bt.unbind(0)))
    h = steps[0][1] * steps[0][2]                                # (B, G, nc, N, Dg)
    for d_t, du_t, b_t in steps[1:]:
        h = torch.addcmul(du_t * b_t, torch.exp(d_t * At), h)
    span = torch.exp(d.sum(0) * At)                              # decay across each whole chunk
    # carry: state entering chunk c = span[c-1] * entering[c-1] + end[c-1]
    entering = [torch.zeros_like(h[:, :, 0])]
    for h_c, span_c in list(zip(h.unbind(2), span.unbind(2)))[:-1]:
        entering.append(torch.addcmul(h_c, span_c, entering[-1]))
    h = torch.stack(entering, dim=2)                             # (B, G, nc, N, Dg)
    # pass 2: every chunk from its true entering state; y_t = sum_n C_t[n] h_t[n]
    ys = []
    for (d_t, du_t, b_t), c_t in zip(steps, Ct.unbind(0)):
        h = torch.addcmul(du_t * b_t, torch.exp(d_t * At), h)
        ys.append(torch.matmul(c_t, h))                        # (.., 1, N) @ (.., N, Dg) -> (.., 1, Dg)
    y = torch.cat(ys, dim=-2)                                    # (B, G, nc, T, Dg)
    y = y.permute(0, 1, 4, 2, 3).reshape(bsz, kd, nc * chunk)[..., :length]  # -> (B, G*Dg, nc*T)
    return _finish(y, u0, D, out_dtype)


def selective_scan_segsum(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=16):
    """Exact chunked scan with segment sums inside chunks (a masked T x T product per chunk and state)."""
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    bsz, kd, length = u.shape
    chunk = min(chunk_size, length)
    dA, dbu, C6, nc, dg, length = _to_chunks(u, delta, A, B, C, groups, chunk)
    S = torch.cumsum(dA, dim=0)                                  # (T, ..., N)
    diff = S[:, None] - S[None, :]                               # (t, s, ...): S_t - S_s
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=u.device).tril()
    causal = causal.view(chunk, chunk, *([1] * (diff.ndim - 2)))
    # mask before exp so the (positive) exponents above the diagonal are never formed
    weights = torch.exp(diff.masked_fill(~causal, float('-inf')))
    h_local = (weights * dbu[None]).sum(1)                       # sum over s: (T, B, G, nc, Dg, N)
    y = _carry_and_read(h_local, dA, C6, length, bsz, kd)
    return _finish(y, u, D, out_dtype)


_METHODS = {'chunked': selective_scan_chunked, 'chunked_autograd': selective_scan_chunked_autograd,
            'sequential': selective_scan_ref, 'segsum': selective_scan_segsum}


def _cuda_kernel():
    try:  # optional: mamba-ssm's CUDA kernel, only ever on a GPU and never required
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except Exception:
        return None
    return selective_scan_fn


def selective_scan(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=True, method: str = 'chunked',
                   chunk_size=None):
    """Mamba's selective scan.

    u, delta: (batch, KD, L); A: (KD, N); B, C: (batch, G, N, L) shared by the KD/G channels of each
    group (or (batch, N, L) for one group); D, delta_bias: (KD,) or None. Returns (batch, KD, L) in
    u's dtype. ``method`` is ``'chunked'`` (default), ``'chunked_autograd'``, ``'sequential'`` (the reference),
    ``'segsum'`` or ``'cuda'`` (mamba-ssm's kernel, if installed and the tensors are on a GPU; else an error).
    The chunked result is a transposed view of position-major (L, batch, KD) memory: ``reshape``, not ``view``.
    Inputs in that layout (as SS2D passes them) are read without a transpose.
    """
    if method == 'cuda':
        fn = _cuda_kernel()
        if fn is None or not u.is_cuda:
            raise RuntimeError("method='cuda' needs the mamba-ssm package and CUDA tensors; use 'chunked'")
        return fn(u, delta, A, B, C, D, None, delta_bias, delta_softplus)
    if method not in _METHODS:
        raise ValueError(f"unknown scan method {method!r}; expected one of {', '.join([*_METHODS, 'cuda'])}")
    kw = {} if method == 'sequential' else {'chunk_size': chunk_size or (16 if method == 'segsum' else None)}
    return _METHODS[method](u, delta, A, B, C, D, delta_bias, delta_softplus, **kw)
