"""Selective-scan and Mamba-YOLO speed on the CPU, timed interleaved in one process (issue 17's targets).

Three subcommands, one target each (run from the repository root; ``--threads`` sets torch's threads):

    python -m benchmarks.scan_bench scan    # (a) the scan at mamba_yolo_t's stride-4 stage: forward and
                                            #     forward + backward vs the sequential reference, chunk sweep
    python -m benchmarks.scan_bench model   # (b) mamba_yolo_t at 320 / 640 px, batch 1, eval: chunked scan vs
                                            #     the per-step loop scan vs a conv-backbone YOLO of equal MACs
    python -m benchmarks.scan_bench share   # (c) the share of mamba_yolo_t's eval time inside SS2D and inside
                                            #     the selective scan

Times on a shared machine move; ratios of candidates measured interleaved (A, B, A, B, ...) in one process
(``zoo.eval.profile.interleave``) are what to compare. Errors are measured against the sequential scan in
float64 ("truth"), for the float32 reference and every candidate alike.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch import nn

from zoo.eval.profile import count_macs, interleave, make_step
from zoo.layers.selective_scan import _auto_chunk, selective_scan

# The conv-backbone comparison of `model`: YOLOv8's PAFPN neck and head (the same as every zoo detector) on a
# basic-block ResNet at Mamba-YOLO-T's widths (32/64/128/256), depths (3, 3, 3, 2) chosen so that its MACs
# match mamba_yolo_t's: 8.22 vs 8.41 GMACs at 640 px, 2.05 vs 2.10 at 320 (FlopCounter: conv, linear, matmul),
# 5.24 M vs 6.13 M parameters, 80 classes.
CONV_YOLO = dict(backbone='resnet18', backbone_kwargs=dict(widths=(32, 64, 128, 256), layers=(3, 3, 3, 2)))


class ScanCase(nn.Module):
    """One selective scan with SS2D's shapes; the scan inputs are parameters so 'train' mode times backward.

    A = -exp(A_log) with A_log ~ U(0, 1): a different decay per channel and state, as after training
    (the official init, A = -1 everywhere, runs the same code at the same speed).
    """

    def __init__(self, method: str, chunk_size=None, kd: int = 256, groups: int = 4, d_state: int = 16,
                 length: int = 6400, dtype=torch.float32, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.method, self.chunk_size = method, chunk_size
        p = dict(dtype=dtype)
        self.delta = nn.Parameter(torch.randn(1, kd, length, generator=g).to(**p) * 0.5)
        self.A_log = nn.Parameter(torch.rand(kd, d_state, generator=g).to(**p))
        self.B = nn.Parameter(torch.randn(1, groups, d_state, length, generator=g).to(**p))
        self.C = nn.Parameter(torch.randn(1, groups, d_state, length, generator=g).to(**p))
        self.D = nn.Parameter(torch.ones(kd, **p))
        self.bias = nn.Parameter(torch.randn(kd, generator=g).to(**p))

    def forward(self, u):
        return selective_scan(u, self.delta, -self.A_log.exp(), self.B, self.C, self.D, self.bias, True,
                              method=self.method, chunk_size=self.chunk_size)


def _median_ms(times) -> float:
    return round(statistics.median(times), 1)


def _print(row: dict) -> dict:
    print(' | '.join(f'{k}={v}' for k, v in row.items()), flush=True)
    return row


def scan_rows(size: int = 320, stride: int = 4, chunks=(32, 64, 128, 256, 512), repeats: int = 5,
              modes=('inference', 'train'), baseline: bool = True, width: int = 32) -> list[dict]:
    """Every chunk size of the default scan (and the previous autograd-traced one) vs the sequential reference,
    at the SS2D of ``mamba_yolo_t``'s stage with the given stride: batch 1, KD = 4 directions x 2C channels
    in 4 groups, N = 16, L = (size / stride)^2."""
    c = width * stride // 4                       # T widths: 32, 64, 128, 256 at strides 4..32
    kd, length = 4 * 2 * c, (size // stride) ** 2
    auto = _auto_chunk(length)
    cases = {'sequential': ScanCase('sequential', kd=kd, length=length)}
    for ch in chunks:
        cases[f'chunked/{ch}' + ('*' if ch == auto else '')] = ScanCase('chunked', ch, kd=kd, length=length)
    if baseline:
        cases[f'chunked_autograd/{auto}'] = ScanCase('chunked_autograd', auto, kd=kd, length=length)
    u = torch.randn(1, kd, length, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        truth = ScanCase('sequential', kd=kd, length=length, dtype=torch.float64)(u.double())
        err = {k: (m(u).double() - truth).abs().max().item() for k, m in cases.items()}
    rows = []
    print(f'# L={length} KD={kd} N=16 groups=4 batch=1 float32; auto chunk={auto} (*); err = max |y - y_float64|, '
          f'max |y_float64| = {truth.abs().max().item():.1f}')
    for mode in modes:
        times = interleave({k: make_step(m, u, mode) for k, m in cases.items()}, repeats=repeats, warmup=1)
        base = statistics.median(times['sequential'])
        for k, t in times.items():
            rows.append(_print(dict(mode='forward' if mode == 'inference' else 'forward+backward', case=k,
                                    median_ms=_median_ms(t), speedup=round(base / statistics.median(t), 1),
                                    max_abs_err=f'{err[k]:.1e}')))
    return rows


def _mamba(method: str, name: str = 'mamba_yolo_t'):
    import zoo
    torch.manual_seed(0)
    return zoo.create(name, scan_method=method).eval()


def model_rows(sizes=(320, 640), repeats: int = 5, loop_repeats: int = 1, conv: bool = True) -> list[dict]:
    """``mamba_yolo_t`` eval latency (batch 1): chunked scan vs the per-step loop scan vs a conv-backbone YOLO
    of equal MACs (``CONV_YOLO``), interleaved per size. The loop-scan model is timed ``loop_repeats`` times
    (about 10 s per forward at 640 px), the others ``repeats`` times."""
    import zoo
    rows = []
    fast = {'mamba_yolo_t': _mamba('chunked')}
    if conv:
        torch.manual_seed(0)
        fast['conv_yolo'] = zoo.create('yolo_det', num_classes=80, **CONV_YOLO).eval()
    slow = {'mamba_yolo_t/loop': _mamba('sequential')}
    for size in sizes:
        x = torch.randn(1, 3, size, size)
        steps = {k: make_step(m, x, 'inference') for k, m in {**fast, **slow}.items()}
        times = interleave({k: steps[k] for k in fast}, repeats=0, warmup=1)      # warm-up of the fast ones
        for k, t in interleave(steps, repeats=loop_repeats, warmup=0).items():
            times[k] = t
        for k, t in interleave({k: steps[k] for k in fast}, repeats=max(0, repeats - loop_repeats), warmup=0).items():
            times[k] += t
        ref = statistics.median(times['mamba_yolo_t'])
        for k, t in times.items():
            macs = count_macs(fast[k], (3, size, size)) / 1e9 if k in fast else None   # the loop model: same MACs
            rows.append(_print(dict(size=size, model=k, median_ms=_median_ms(t), repeats=len(t),
                                    vs_mamba_yolo_t=round(statistics.median(t) / ref, 2),
                                    gmacs=round(macs, 2) if macs else '')))
    return rows


def share_rows(sizes=(320, 640), repeats: int = 3, name: str = 'mamba_yolo_t') -> list[dict]:
    """Share of ``mamba_yolo_t``'s eval forward spent inside SS2D modules and inside the selective scan itself
    (timed with forward hooks and a wrapper around the scan function: wall time, one thread per default)."""
    from zoo.layers import mamba
    model = _mamba('chunked', name)
    spent = {'ss2d': 0.0, 'scan': 0.0}
    stack = []

    def pre(_m, _x):
        stack.append(time.perf_counter())

    def post(_m, _x, _y):
        spent['ss2d'] += time.perf_counter() - stack.pop()

    def timed_scan(*a, **kw):
        t0 = time.perf_counter()
        out = selective_scan(*a, **kw)
        spent['scan'] += time.perf_counter() - t0
        return out

    hooks = [h for m in model.modules() if isinstance(m, mamba.SS2D)
             for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    rows = []
    with _patched(mamba, 'selective_scan', timed_scan), torch.inference_mode():
        for size in sizes:
            x = torch.randn(1, 3, size, size)
            model(x)
            total, ss2d, scan = 0.0, 0.0, 0.0
            for _ in range(repeats):
                spent.update(ss2d=0.0, scan=0.0)
                t0 = time.perf_counter()
                model(x)
                total += time.perf_counter() - t0
                ss2d, scan = ss2d + spent['ss2d'], scan + spent['scan']
            rows.append(_print(dict(size=size, median_ms=round(total / repeats * 1000, 1),
                                    ss2d_share=round(ss2d / total, 3), scan_share=round(scan / total, 3))))
    for h in hooks:
        h.remove()
    return rows


@contextlib.contextmanager
def _patched(module, name, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--threads', type=int, default=1, help='torch threads (default 1)')
    sub = p.add_subparsers(dest='cmd', required=True)
    s = sub.add_parser('scan', help='(a) the scan vs the sequential reference at a stage of mamba_yolo_t')
    s.add_argument('--size', type=int, default=320)
    s.add_argument('--stride', type=int, default=4)
    s.add_argument('--chunks', type=int, nargs='+', default=[32, 64, 128, 256, 512])
    s.add_argument('--modes', nargs='+', default=['inference', 'train'], choices=['inference', 'train'])
    s.add_argument('--repeats', type=int, default=5)
    s.add_argument('--no-baseline', action='store_true', help='skip the previous autograd-traced chunked scan')
    m = sub.add_parser('model', help='(b) mamba_yolo_t latency: chunked vs loop scan vs a conv YOLO of equal MACs')
    m.add_argument('--sizes', type=int, nargs='+', default=[320, 640])
    m.add_argument('--repeats', type=int, default=5)
    m.add_argument('--loop-repeats', type=int, default=1, help='repeats of the slow loop-scan model')
    m.add_argument('--no-conv', action='store_true')
    h = sub.add_parser('share', help="(c) the share of mamba_yolo_t's time inside SS2D and the scan")
    h.add_argument('--sizes', type=int, nargs='+', default=[320, 640])
    h.add_argument('--repeats', type=int, default=3)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f'# threads={torch.get_num_threads()} torch={torch.__version__}', flush=True)
    if a.cmd == 'scan':
        return scan_rows(a.size, a.stride, a.chunks, a.repeats, a.modes, not a.no_baseline)
    if a.cmd == 'model':
        return model_rows(a.sizes, a.repeats, a.loop_repeats, not a.no_conv)
    return share_rows(a.sizes, a.repeats)


if __name__ == '__main__':
    main()
