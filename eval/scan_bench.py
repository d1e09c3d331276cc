"""Selective-scan candidates and Mamba-YOLO latency on the CPU, timed interleaved in one process.

1. The scans (``zoo.layers.selective_scan``) at the sizes one SS2D of ``mamba_yolo_t`` sees: batch 1,
   K * D_inner channels in K = 4 groups, N = 16 states, L = (H/s)(W/s) at stride s of the input.
   Forward (inference mode) and forward + backward, each candidate and chunk size against the
   sequential reference, with the error to it.
2. ``mamba_yolo_t`` (eval, batch 1) at 320 / 640 px with the chunked scan vs the sequential scan.
3. The share of ``mamba_yolo_t``'s eval time spent inside SS2D.

Times on a shared machine move; ratios measured interleaved (A, B, A, B, ...) in one process are what
to compare. Run from the repository root::

    python -m zoo.eval.scan_bench --sizes 320 --stride 4 --chunks 32 64 128 --repeats 5
    python -m zoo.eval.scan_bench --model --sizes 320 640 --repeats 3
    python -m zoo.eval.scan_bench --share --sizes 320 640 --repeats 3
"""
from __future__ import annotations

import argparse
import functools

import torch
from torch import nn

from zoo.eval.profile import benchmark
from zoo.layers.selective_scan import selective_scan


class ScanCase(nn.Module):
    """One selective scan with SS2D's shapes; the scan inputs are parameters so 'train' mode times backward."""

    def __init__(self, method: str, chunk_size=None, kd: int = 256, groups: int = 4, d_state: int = 16,
                 length: int = 6400, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.method, self.chunk_size = method, chunk_size
        self.delta = nn.Parameter(torch.randn(1, kd, length, generator=g) * 0.5)
        self.A_log = nn.Parameter(torch.zeros(kd, d_state))      # Mamba-YOLO's init: A = -1
        self.B = nn.Parameter(torch.randn(1, groups, d_state, length, generator=g))
        self.C = nn.Parameter(torch.randn(1, groups, d_state, length, generator=g))
        self.D = nn.Parameter(torch.ones(kd))
        self.bias = nn.Parameter(torch.randn(kd, generator=g))

    def forward(self, u):
        return selective_scan(u, self.delta, -self.A_log.exp(), self.B, self.C, self.D, self.bias, True,
                              method=self.method, chunk_size=self.chunk_size)


def scan_rows(size: int, stride: int, chunks, methods, repeats: int, modes=('inference', 'train'), width: int = 32):
    """Time every (method, chunk) at the stage of ``mamba_yolo_t`` with the given stride."""
    c = width * stride // 4                       # T widths: 32, 64, 128, 256 at strides 4..32
    kd, length = 4 * 2 * c, (size // stride) ** 2   # K = 4 directions of D_inner = 2C
    cases = {'sequential': ScanCase('sequential', kd=kd, length=length)}
    for m in methods:
        for ch in chunks:
            cases[f'{m}/{ch}'] = ScanCase(m, ch, kd=kd, length=length)
    u = torch.randn(1, kd, length, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = cases['sequential'](u)
        err = {k: (m(u) - ref).abs().max().item() for k, m in cases.items()}
    rows = []
    for mode in modes:
        res = benchmark(cases, input_size=tuple(u.shape[1:]), warmup=1, repeats=repeats, mode=mode,
                        inputs={k: u for k in cases})
        base = res['sequential'].median_ms
        for k, lat in res.items():
            rows.append(dict(L=length, KD=kd, mode=mode, case=k, median_ms=round(lat.median_ms, 1),
                             speedup=round(base / lat.median_ms, 1), max_abs_err=err[k]))
            print(' | '.join(map(str, rows[-1].values())), flush=True)
    return rows


def model_rows(sizes, repeats: int):
    """``mamba_yolo_t`` eval latency, chunked vs sequential scan, interleaved per size."""
    import zoo
    rows = []
    for size in sizes:
        models = {}
        for method in ('chunked', 'sequential'):
            torch.manual_seed(0)
            models[method] = zoo.create('mamba_yolo_t', scan_method=method).eval()
        res = benchmark(models, input_size=(3, size, size), warmup=1, repeats=repeats)
        base = res['sequential'].median_ms
        for k, lat in res.items():
            rows.append(dict(model='mamba_yolo_t', size=size, scan=k, median_ms=round(lat.median_ms, 1),
                             speedup=round(base / lat.median_ms, 1)))
            print(' | '.join(map(str, rows[-1].values())), flush=True)
    return rows


def ss2d_share(sizes, repeats: int):
    """Share of ``mamba_yolo_t``'s eval forward spent inside SS2D modules (timed with forward hooks)."""
    import time
    import zoo
    from zoo.layers.mamba import SS2D
    rows = []
    model = zoo.create('mamba_yolo_t').eval()
    spent = [0.0]

    def pre(_m, _x):
        spent.append(time.perf_counter())

    def post(_m, _x, _y):
        spent[0] += time.perf_counter() - spent.pop()

    for m in model.modules():
        if isinstance(m, SS2D):
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)
    for size in sizes:
        x = torch.randn(1, 3, size, size)
        totals, inside = [], []
        with torch.inference_mode():
            model(x)
            for _ in range(repeats):
                spent[0] = 0.0
                t0 = time.perf_counter()
                model(x)
                totals.append(time.perf_counter() - t0)
                inside.append(spent[0])
        share = sum(inside) / sum(totals)
        rows.append(dict(model='mamba_yolo_t', size=size, ss2d_share=round(share, 3)))
        print(' | '.join(map(str, rows[-1].values())), flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--sizes', type=int, nargs='+', default=[320])
    p.add_argument('--stride', type=int, default=4)
    p.add_argument('--chunks', type=int, nargs='+', default=[32, 64, 128])
    p.add_argument('--methods', nargs='+', default=['chunked', 'stored'],
                   help="candidates besides the sequential reference ('segsum' forms T x T per chunk: small chunks only)")
    p.add_argument('--modes', nargs='+', default=['inference', 'train'])
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--model', action='store_true', help='time mamba_yolo_t instead of the bare scans')
    p.add_argument('--share', action='store_true', help="the share of mamba_yolo_t's time spent in SS2D")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    columns = ('model | size | ss2d_share' if a.share else 'model | size | scan | median_ms | speedup' if a.model
               else 'L | KD | mode | case | median_ms | speedup | max_abs_err')
    print(f'threads={torch.get_num_threads()}; columns: {columns}')
    if a.share:
        rows = ss2d_share(a.sizes, a.repeats)
    elif a.model:
        rows = model_rows(a.sizes, a.repeats)
    else:
        rows = [r for s in a.sizes for r in scan_rows(s, a.stride, a.chunks, a.methods, a.repeats, a.modes)]
    return rows


if __name__ == '__main__':
    main()
