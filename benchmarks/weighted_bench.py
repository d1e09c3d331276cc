"""Weighted vs standard convolution: ResNet-18 forward + backward time on CPU at 32x32 and 224x224.

Both models have the same weights and layout; the weighted one has ``den=[0.7]`` in every 3x3 conv
(``Phi`` precomputed, one weight-sized multiply per conv per step). Interleaved in one process,
median over repeats, ratio weighted / standard.

    python -m benchmarks.weighted_bench --repeats 7
"""
from __future__ import annotations

import argparse
import statistics

import torch

import zoo

from zoo.eval.profile import interleave


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--repeats', type=int, default=7)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--settings', default='32:cifar:64,224:imagenet:8',
                    help='comma-separated size:stem:batch triples')
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = {}
    for setting in args.settings.split(','):
        size, stem, batch = setting.split(':')
        size, batch = int(size), int(batch)
        torch.manual_seed(0)
        std = zoo.create('resnet18', stem=stem, num_classes=10).train()
        wtd = zoo.create('resnet18', stem=stem, num_classes=10, conv_layer='weighted', den=[0.7]).train()
        wtd.load_state_dict(std.state_dict(), strict=False)
        x = torch.randn(batch, 3, size, size)

        def step(m):
            m.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
        times = interleave({'standard': lambda: step(std), 'weighted': lambda: step(wtd)}, args.repeats, warmup=1)
        s, w = statistics.median(times['standard']) / 1e3, statistics.median(times['weighted']) / 1e3
        out[size] = (s, w)
        print(f'ResNet-18 {stem} stem {size}x{size} batch {batch}: standard {s * 1e3:.1f} ms, weighted {w * 1e3:.1f} ms, '
              f'ratio {w / s:.3f} (median of {args.repeats}, {args.threads} thread)', flush=True)
    return out


if __name__ == '__main__':
    main()
