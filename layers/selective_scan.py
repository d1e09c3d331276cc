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
  entering states, reading y. Decays and inputs are formed per step (cache-sized). About 2 sqrt(L) steps.
- ``'stored'``: the same passes with every decay exp(d A) and input d B u formed up front (one
  exponential per element, but (L, N, D) tensors through memory): measured slower on the CPU.
- ``'segsum'``: inside a chunk, ``h_t = sum_{s<=t} exp(S_t - S_s) * dBu_s`` as a masked (T x T) product
  (exponents never positive); same carry. Work grows with T.

VMamba's ``selective_scan_easy`` computes ``exp(S_t) * cumsum(dBu_s / exp(S_s))``: the division
overflows (exp(-S) -> inf) on long chunks or large |A| and yields NaN. Nothing here divides by a decay.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ['selective_scan', 'selective_scan_ref', 'selective_scan_chunked', 'selective_scan_stored',
           'selective_scan_segsum']


def _auto_chunk(length: int) -> int:
    """The chunk size when none is given: the power of two nearest 2 sqrt(L), within [16, 256].

    Chosen by measurement (eval/scan_bench.py, docs/mamba_yolo.md): at the T model's stride-4 stage at
    320 px (L = 6400) chunks of 128 and 256 were fastest (32: 0.82x, 64: 0.73x of chunk 128's speed, under
    load); 2 T + L / T steps alone would favour sqrt(L), but the per-step work shrinks with T.
    """
    return int(min(256, max(16, 2 ** round(math.log2(max(1.0, 2 * math.sqrt(length)))))))


def _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus):
    """Check shapes, upcast, apply bias + softplus. Returns tensors in the compute dtype and the groups."""
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
    groups = B.shape[1]
    if kd % groups:
        raise ValueError(f'channels ({kd}) must be a multiple of the B/C groups ({groups})')
    dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
    u, delta, A, B, C = (t.to(dtype) for t in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    D = D.to(dtype) if D is not None else None
    return u, delta, A, B, C, D, groups


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


def _chunk_inputs(u, delta, A, B, C, groups, chunk):
    """Pad L to a multiple of ``chunk``; build the decays and inputs time-major, states before channels.

    Returns decay, dbu: (T, B, G, nc, N, Dg); C: (T, B, G, nc, 1, N); nc. Every step then reads one
    contiguous slab, and the broadcasts run along the channel axis (vectorised), not along N.
    Padded positions get delta = 0 (decay 1, input 0) and come after every real position.
    """
    bsz, kd, length = u.shape
    pad = (-length) % chunk
    if pad:
        u, delta = F.pad(u, (0, pad)), F.pad(delta, (0, pad))
        B, C = F.pad(B, (0, pad)), F.pad(C, (0, pad))
    nc, dg = (length + pad) // chunk, kd // groups
    # (B, G*Dg, nc*T) -> (T, B, G, nc, 1, Dg)
    d = delta.reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(4)
    du = (delta * u).reshape(bsz, groups, dg, nc, chunk).permute(4, 0, 1, 3, 2).unsqueeze(4)
    # (B, G, N, nc*T) -> (T, B, G, nc, N)
    Bt = B.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2)
    Ct = C.reshape(bsz, groups, -1, nc, chunk).permute(4, 0, 1, 3, 2)
    At = A.reshape(groups, dg, A.shape[1]).transpose(1, 2).unsqueeze(1)   # (G, 1, N, Dg)
    decay = torch.exp(d.contiguous() * At)                     # (T, B, G, nc, N, Dg), in (0, 1]
    dbu = du.contiguous() * Bt.contiguous().unsqueeze(-1)      # (T, B, G, nc, N, Dg)
    return decay, dbu, Ct.contiguous().unsqueeze(4), nc


def selective_scan_chunked(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """Exact chunked scan (the default): a pass inside all chunks at once, a carry across chunks, a second pass.

    Pass 1 runs every chunk from a zero state to its end state; the carry turns those into the state
    entering each chunk (L / T small steps, with the chunk's total decay exp(A * sum d)); pass 2 re-runs
    every chunk from its true entering state and reads y. Each step advances one position of all chunks
    together on (B, G, nc, N, Dg) tensors built inside the step from the small per-position inputs, so
    no (B, KD, L, N) tensor is formed (cache-sized work; two exponentials per element instead of one, which
    measured faster than storing them, see :func:`selective_scan_stored`). 2 T + L / T Python steps; only
    decays in (0, 1] are multiplied.
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


def selective_scan_stored(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """Exact chunked scan with every decay and input formed up front ((T, B, G, nc, N, Dg) tensors).

    Pass 1 runs every chunk from a zero state to its end state (and multiplies up the chunk's decay);
    the carry turns those into the state entering each chunk (L / T small steps); pass 2 re-runs every
    chunk from its true entering state and reads y. Every step advances one position of all chunks
    together on (B, G, nc, N, Dg) tensors: 2 T + L / T Python steps, only products of decays in (0, 1].
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    bsz, kd, length = u.shape
    chunk = min(chunk_size or _auto_chunk(length), length)
    decay, dbu, Ct, nc = _chunk_inputs(u, delta, A, B, C, groups, chunk)
    # pass 1: every chunk from a zero state; span = the decay across the whole chunk
    decays, inputs = decay.unbind(0), dbu.unbind(0)
    h, span = inputs[0], decays[0]                               # (B, G, nc, N, Dg)
    for dec_t, in_t in zip(decays[1:], inputs[1:]):
        h = torch.addcmul(in_t, dec_t, h)
        span = span * dec_t
    # carry: state entering chunk c = span[c-1] * entering[c-1] + end[c-1]
    entering = [torch.zeros_like(h[:, :, 0])]
    for h_c, span_c in list(zip(h.unbind(2), span.unbind(2)))[:-1]:
        entering.append(torch.addcmul(h_c, span_c, entering[-1]))
    h = torch.stack(entering, dim=2)                             # (B, G, nc, N, Dg)
    # pass 2: every chunk from its true entering state; y_t = sum_n C_t[n] h_t[n]
    ys = []
    for dec_t, in_t, c_t in zip(decays, inputs, Ct.unbind(0)):
        h = torch.addcmul(in_t, dec_t, h)
        ys.append(torch.matmul(c_t, h))                        # (B, G, nc, 1, N) @ (.., N, Dg) -> (.., 1, Dg)
    y = torch.cat(ys, dim=-2)                                    # (B, G, nc, T, Dg)
    y = y.permute(0, 1, 4, 2, 3).reshape(bsz, kd, nc * chunk)[..., :length]  # -> (B, G*Dg, nc*T)
    return _finish(y, u, D, out_dtype)


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


_METHODS = {'chunked': selective_scan_chunked, 'stored': selective_scan_stored, 'sequential': selective_scan_ref,
            'segsum': selective_scan_segsum}


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
    u's dtype. ``method`` is ``'chunked'`` (default), ``'sequential'`` (the reference), ``'segsum'`` or
    ``'cuda'`` (mamba-ssm's kernel, if installed and the tensors are on a GPU; else an error).
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
