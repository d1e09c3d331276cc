"""The selective scan as a graph of plain tensor ops, for exporters that cannot keep zoo's scan operator (ONNX).

``torch.compile`` and ``torch.export`` capture the eager chunked scan (:mod:`zoo.layers.selective_scan`) as one
operator, ``torch.ops.zoo.selective_scan``. An ONNX file cannot hold it: :func:`decompose` exports the model with
the operator written out as ``'loop'``. Both forms here are exact (equal to ``selective_scan_ref`` within float32
rounding) and never divide by a decay.

- ``'loop'`` (what ONNX export writes): the eager chunked scan's two passes as ``torch.scan`` loops
  (``torch._higher_order_ops.scan``, a prototype in torch 2.14; ONNX ``Scan``): every step advances one position of all chunks at once, so no (B, K*D, N, L) state tensor is ever
  formed; the carry across the chunks' end states is log-depth. 2 T loop steps of a few ops, at the eager
  scan's T (about 2 sqrt(L)).
- ``'parallel'``: log-depth (Hillis-Steele) scans inside chunks of 16 and across them, then one update of every
  position from its chunk's entering state: a graph of a few dozen nodes with no loop, but it materialises the
  (B, K*D, N, L) states several times (several times the loop's arithmetic and memory traffic).

Paper and semantics as :mod:`zoo.layers.selective_scan` (Gu & Dao, arXiv 2312.00752;
https://github.com/state-spaces/mamba; https://github.com/HZAI-ZJNU/Mamba-YOLO).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ._torch_compat import higher_order_scan
from .selective_scan import _finish, _prepare

__all__ = ['decompose', 'selective_scan_loop', 'selective_scan_parallel']


def _pad_chunks(u, delta, B, C, chunk):
    """Pad L to a multiple of ``chunk`` with delta = 0 (decay 1, input 0, after every real position)."""
    pad = (-u.shape[-1]) % chunk
    if pad:
        u, delta, B, C = (F.pad(t, (0, pad)) for t in (u, delta, B, C))
    return u, delta, B, C, u.shape[-1] // chunk


def _linear_scan(w: torch.Tensor, h: torch.Tensor, dim: int, need_w: bool = True):
    """Inclusive scan of h_t <- exp(w_t) h_{t-1} + h_t along ``dim`` in ceil(log2 n) steps (Hillis-Steele).

    Before step k, h_t sums the inputs of the window (t - k, t] and w_t the log-decays of that window (clipped at
    the start), so h_t + exp(w_t) h_{t-k} covers (t - 2k, t]. Every decay is exp of a window sum of log-decays
    (never a difference of cumulative sums: no cancellation, all <= 1 here). Returns (w, h): the log-decay from
    the start to t (if ``need_w``) and the states."""
    n, k = h.shape[dim], 1
    while k < n:
        head = (h.narrow(dim, 0, k),)
        h = torch.cat(head + (torch.addcmul(h.narrow(dim, k, n - k), torch.exp(w.narrow(dim, k, n - k)),
                                            h.narrow(dim, 0, n - k)),), dim)
        if need_w or 2 * k < n:
            w = torch.cat((w.narrow(dim, 0, k), w.narrow(dim, k, n - k) + w.narrow(dim, 0, n - k)), dim)
        k *= 2
    return w, h


def selective_scan_parallel(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """Exact scan as a fixed, small graph (the form ``torch.compile``, ``torch.export`` and ONNX capture).

    The chunked scan's Python loops (2 T + L / T steps) unroll into thousands of graph nodes when traced. Here
    both levels are log-depth scans of plain tensor ops: inside chunks of T (all chunks at once), then across the
    chunks' end states, then one update of every position from its chunk's entering state; about
    3 (log2 T + log2 (L / T)) ops whatever L. It materialises the (B, KD, N, L) states (several copies during the
    in-chunk scan), so its memory grows with the batch: the eager default stays ``'chunked'``.
    """
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    u0 = u
    bsz, kd, length = u.shape
    n, dg = A.shape[1], kd // groups
    chunk = min(chunk_size or 16, length)
    u, delta, B, C, nc = _pad_chunks(u, delta, B, C, chunk)
    # (B, G*Dg, nc*T) -> (B, G, nc, T, Dg, 1); (B, G, N, nc*T) -> (B, G, nc, T, 1, N)
    d = delta.reshape(bsz, groups, dg, nc, chunk).permute(0, 1, 3, 4, 2).unsqueeze(-1)
    du = (delta * u).reshape(bsz, groups, dg, nc, chunk).permute(0, 1, 3, 4, 2).unsqueeze(-1)
    Bs = B.reshape(bsz, groups, n, nc, chunk).permute(0, 1, 3, 4, 2).unsqueeze(-2)
    Cs = C.reshape(bsz, groups, n, nc, chunk).permute(0, 1, 3, 4, 2).unsqueeze(-1)     # (B, G, nc, T, N, 1)
    w = d * A.reshape(groups, 1, 1, dg, n)                      # log-decay per step (B, G, nc, T, Dg, N), <= 0
    S, h = _linear_scan(w, du * Bs, dim=3)                      # from each chunk's start (zero state)
    # the state at the end of every chunk, carried across chunks; the state entering chunk c is the one before
    _, ends = _linear_scan(S[:, :, :, -1], h[:, :, :, -1], dim=2, need_w=False)   # (B, G, nc, Dg, N)
    enter = F.pad(ends[:, :, :-1], (0, 0, 0, 0, 1, 0))          # chunk 0 enters from zero
    h = torch.addcmul(h, torch.exp(S), enter.unsqueeze(3))      # (B, G, nc, T, Dg, N)
    y = torch.matmul(h, Cs).squeeze(-1)                         # sum_n h C: (B, G, nc, T, Dg)
    # (B, G, nc, T, Dg) -> (B, G*Dg, nc*T)
    y = y.permute(0, 1, 4, 2, 3).reshape(bsz, kd, nc * chunk)[..., :length]
    return _finish(y, u0, D, out_dtype)



def selective_scan_loop(u, delta, A, B, C, D=None, delta_bias=None, delta_softplus=False, chunk_size=None):
    """Exact chunked scan as two ``torch.scan`` loops (ONNX ``Scan``) over the T steps of all chunks at once.

    Pass 1 runs chunks 0 .. nc-2 from zero to their end states; a log-depth scan across those gives the state
    entering every chunk; pass 2 re-runs every chunk from its entering state and reads y_t = C_t . h_t per step.
    The loops carry (nc, B, G, N, Dg) slabs: the (B, KD, N, L) states are never formed, as in the eager scan.
    """
    scan = higher_order_scan()
    out_dtype = u.dtype
    u, delta, A, B, C, D, groups = _prepare(u, delta, A, B, C, D, delta_bias, delta_softplus)
    u0 = u
    bsz, kd, length = u.shape
    n, dg = A.shape[1], kd // groups
    chunk = min(chunk_size or 32, length)
    u, delta, B, C, nc = _pad_chunks(u, delta, B, C, chunk)
    # (B, G*Dg, nc*T) -> (T, nc, B, G, 1, Dg); (B, G, N, nc*T) -> (T, nc, B, G, N, 1)
    d = delta.reshape(bsz, groups, dg, nc, chunk).permute(4, 3, 0, 1, 2).unsqueeze(-2)
    du = d * u.reshape(bsz, groups, dg, nc, chunk).permute(4, 3, 0, 1, 2).unsqueeze(-2)
    Bs = B.reshape(bsz, groups, n, nc, chunk).permute(4, 3, 0, 1, 2).unsqueeze(-1)
    Cs = C.reshape(bsz, groups, n, nc, chunk).permute(4, 3, 0, 1, 2).unsqueeze(-1)
    At = A.reshape(groups, dg, n).transpose(1, 2).contiguous()  # (G, N, Dg); the loops carry it (no closures)

    def advance(carry, x):                                       # h <- exp(d A) h + (d u) B, every chunk
        h, a = carry
        h = torch.exp(x[0] * a) * h + x[1] * x[2]
        return (h, a.clone()), ((x[3] * h).sum(-2, keepdim=True) if len(x) > 3 else h.new_zeros(1))

    enter = u.new_zeros((1, bsz, groups, n, dg))
    if nc > 1:
        (ends, _), _ = scan(advance, (u.new_zeros((nc - 1, bsz, groups, n, dg)), At), (d[:, :-1], du[:, :-1], Bs[:, :-1]))
        span = d[:, :-1].sum(0) * At                             # log-decay across each chunk, (nc-1, B, G, N, Dg)
        _, ends = _linear_scan(span, ends, dim=0, need_w=False)
        enter = torch.cat((enter, ends), 0)                      # chunk 0 enters from zero
    _, y = scan(advance, (enter, At), (d, du, Bs, Cs))           # (T, nc, B, G, 1, Dg)
    # (T, nc, B, G, 1, Dg) -> (B, G*Dg, nc*T)
    y = y.squeeze(-2).permute(2, 3, 4, 1, 0).reshape(bsz, kd, nc * chunk)[..., :length]
    return _finish(y, u0, D, out_dtype)


def _scan_graph(u, delta, A, B, C, D, delta_bias, delta_softplus, chunk):
    """``zoo::selective_scan`` as plain tensor ops: ``'loop'`` at the eager scan's chunk (2 sqrt(L) within
    [16, 256]; in ONNX Runtime faster than 32 or 64 at L = 6400 and 25600, equal at 1600, benchmarks/scan_onnx.py)."""
    return selective_scan_loop(u, delta, A, B, C, D, delta_bias, delta_softplus, chunk_size=chunk)


@contextlib.contextmanager
def _written_out():
    """Within: :func:`zoo.layers.selective_scan.selective_scan_chunked` traces as ``'loop'``, not the operator."""
    from . import selective_scan
    selective_scan._GRAPH_FORM = _scan_graph
    try:
        yield
    finally:
        selective_scan._GRAPH_FORM = None


def decompose(model, args: tuple, dynamic_shapes=None) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` (a module, or an ``ExportedProgram`` such as a loaded pt2 file) with zoo's scan
    operator written out as :func:`selective_scan_loop`: what ONNX export takes.

    Traced by dynamo (``torch.export``): ``run_decompositions`` of the operator into ``torch.scan`` loops fails with a
    dynamic batch (torch 2.14). A program's graph is traced again with its scan nodes calling the loop form.
    """
    if isinstance(model, torch.export.ExportedProgram):
        if all(n.target is not torch.ops.zoo.selective_scan.default for n in model.graph.nodes):
            return model
        model = model.module()
        for node in model.graph.find_nodes(op='call_function', target=torch.ops.zoo.selective_scan.default):
            node.target = _scan_graph
        model.recompile()
    with _written_out():
        return torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
