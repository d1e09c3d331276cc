"""The selective scan in ONNX Runtime: the graph forms ``zoo::selective_scan`` can be written out as for ONNX export
(:mod:`zoo.layers.selective_scan_graph`), timed on single scan calls at mamba_yolo_t's sizes at 640 px.

    python -m benchmarks.scan_onnx                 # the four stages (L = 160², 80², 40², 20²; K D = 256 .. 2048)
    python -m benchmarks.scan_onnx --smoke         # tiny sizes, one round (a check that every path runs)

Every candidate goes the way ``zoo.export`` goes: ``torch.export`` of a module calling the scan operator,
``run_decompositions`` with the candidate as the operator's decomposition, ``torch.onnx.export``, an ORT session
(2 threads). Each is checked against the eager chunked scan in float64 (max |delta|) and timed interleaved with the
eager scan in one process (``zoo.eval.profile.interleave``); medians in ms.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import statistics
import tempfile
import warnings
from unittest import mock

import torch
from zoo._runtime import ort_session_options
from zoo.eval.profile import interleave
from zoo.layers import selective_scan_graph
from zoo.layers.selective_scan import selective_scan
from zoo.layers.selective_scan_graph import selective_scan_loop, selective_scan_parallel

# (L, K*D) of mamba_yolo_t's SS2D scans at 640 px (K = 4 directions, N = 16, G = 4 groups of B/C)
STAGES = ((25600, 256), (6400, 512), (1600, 1024), (400, 2048))
# form and chunk; None: the eager scan's chunk (``_auto_chunk``: 2 sqrt(L) within [16, 256], what ONNX export uses)
CANDIDATES = {'parallel/16': (selective_scan_parallel, 16), 'loop/32': (selective_scan_loop, 32),
              'loop/64': (selective_scan_loop, 64), 'loop/auto': (selective_scan_loop, None)}


class _Scan(torch.nn.Module):
    def __init__(self, A, D, bias):
        super().__init__()
        self.A, self.D, self.bias = A, D, bias

    def forward(self, u, delta, B, C):
        return selective_scan(u, delta, self.A, B, C, self.D, self.bias, delta_softplus=True)


def _inputs(length, kd, n=16, groups=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {'u': torch.randn(1, kd, length, generator=g), 'delta': torch.randn(1, kd, length, generator=g) - 2,
            'B': torch.randn(1, groups, n, length, generator=g), 'C': torch.randn(1, groups, n, length, generator=g),
            'A': -torch.exp(torch.rand(kd, n, generator=g)), 'D': torch.randn(kd, generator=g),
            'bias': torch.randn(kd, generator=g) * 0.5}


def _session(module, args, form, chunk, path):
    import onnxruntime as ort

    def decomposed(u, delta, A, B, C, D, delta_bias, delta_softplus, auto):
        return form(u, delta, A, B, C, D, delta_bias, delta_softplus, chunk_size=chunk or auto)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter('ignore')
        with mock.patch.object(selective_scan_graph, '_scan_graph', decomposed):
            ep = selective_scan_graph.decompose(torch.export.export(module, args), args)
        torch.onnx.export(ep, args, dynamo=True, optimize=False, verbose=False, report=False).save(path)
    # zoo's session options (no thread pool spinning after a call, which would slow the eager scan timed next)
    sess = ort.InferenceSession(path, ort_session_options(threads=2), providers=['CPUExecutionProvider'])
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    return lambda: sess.run(None, feed)[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--smoke', action='store_true')
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--only', nargs='*', default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument('--stages', nargs='*', type=int, default=[0, 1, 2, 3], help='indices into STAGES')
    a = parser.parse_args(argv)
    torch.set_num_threads(2)
    stages, repeats = (((40, 16), (7, 32)), 1) if a.smoke else ([STAGES[i] for i in a.stages], a.repeats)
    print('| L | K*D | ' + ' | '.join(['eager chunked', *a.only]) + ' |  (ms, medians; max |delta| vs float64)')
    for length, kd in stages:
        t = _inputs(length, kd)
        module = _Scan(t['A'], t['D'], t['bias'])
        args = (t['u'], t['delta'], t['B'], t['C'])
        truth = selective_scan(**{k: v.double() for k, v in t.items() if k not in ('A', 'D', 'bias')},
                               A=t['A'].double(), D=t['D'].double(), delta_bias=t['bias'].double())
        fns, err = {'eager chunked': functools.partial(torch.no_grad()(module), *args)}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for name in a.only:
                form, chunk = CANDIDATES[name]
                fns[name] = _session(module, args, form, chunk, f'{tmp}/{name.replace("/", "_")}.onnx')
            for name, fn in fns.items():
                out = fn()
                err[name] = (torch.as_tensor(out).double() - truth).abs().max().item()
            times = interleave(fns, repeats=repeats, warmup=1)
        cells = [f'{statistics.median(times[k]):.1f} ({err[k]:.1e})' for k in fns]
        print(f'| {length} | {kd} | ' + ' | '.join(cells) + ' |', flush=True)


if __name__ == '__main__':
    main()
