"""ConvBN Tune mode vs Eval and Deploy on a fine-tuning step of torchvision's ResNet-50 (CPU).

For each mode: the bytes autograd keeps for backward (distinct non-parameter tensors, counted with
``torch.autograd.graph.saved_tensors_hooks``: ``zoo.eval.profile.saved_bytes``), the peak resident memory of a
fresh process during one step (VmHWM reset before the step, minus the RSS before it), and the step time (forward,
cross-entropy, backward, SGD step: ``zoo.eval.profile.train_step``), interleaved across modes in one process, median
over repeats. ``mmengine`` is mmengine's efficient ConvBN (``turn_on_efficient_conv_bn_eval``) on the same model, for
reference. Every ``zoo fit`` of the ConvBN fine-tuning recipe measures the first and the last of these on its own
trained network and data (``zoo.eval.profile.convbn_probe``, logged as ``train/saved_backward_vs_eval`` and
``train/step_time_vs_eval``).

    python -m benchmarks.convbn_bench --batch 32 --size 224 --repeats 5
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from zoo.eval.profile import (interleave, peak_memory_mb, reset_peak_memory, resident_memory_mb, saved_bytes,
                              train_step)

MODES = ('eval', 'tune', 'mmengine', 'deploy')
ROOT = Path(__file__).resolve().parents[1]       # the checkout: the child runs as `python -m benchmarks.convbn_bench`


def build(mode: str, seed: int = 0) -> nn.Module:
    """torchvision ResNet-50 (random weights, non-trivial BN statistics) with every Conv+BN pair in ``mode``."""
    import torchvision
    from zoo.layers.convbn import set_mode
    torch.manual_seed(seed)
    model = torchvision.models.resnet50(weights=None)
    for m in model.modules():  # fine-tuning starts from trained statistics, not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_var.uniform_(0.5, 2.0)
            m.running_mean.uniform_(-0.2, 0.2)
    if mode == 'mmengine':
        from mmengine.model.efficient_conv_bn_eval import turn_on_efficient_conv_bn_eval_for_single_model
        model.eval()  # mmengine's path applies while BN is in eval
        turn_on_efficient_conv_bn_eval_for_single_model(model)
    else:
        set_mode(model, mode)
    return model


def peak_rss_child(mode: str, batch: int, size: int) -> None:
    """Run in a fresh process: RSS growth of one training step over the model and data alone (MiB)."""
    torch.set_num_threads(1)
    model = build(mode).train() if mode != 'mmengine' else build(mode)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))
    step = train_step(model, x, y)
    step()  # first step allocates optimizer state; measure the second
    base = resident_memory_mb()
    reset_peak_memory()  # the kernel's peak-RSS mark (VmHWM) to now
    step()
    peak = peak_memory_mb()
    print(json.dumps({'peak_mib': peak, 'step_mib': peak - base}))


def rss_of(mode: str, batch: int, size: int) -> dict:
    out = subprocess.run([sys.executable, '-m', 'benchmarks.convbn_bench', '--_child', mode, '--batch', str(batch),
                          '--size', str(size)], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--batch', type=int, default=32)
    ap.add_argument('--size', type=int, default=224)
    ap.add_argument('--repeats', type=int, default=5)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--no-rss', action='store_true', help='skip the per-mode peak-memory subprocesses')
    ap.add_argument('--rss-only', action='store_true', help='only the per-mode peak-memory subprocesses')
    ap.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES),
                    help='the modes to compare (default: all; eval, the baseline of the ratios, is always included)')
    ap.add_argument('--_child', default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return peak_rss_child(args._child, args.batch, args.size)
    torch.set_num_threads(args.threads)
    modes = [m for m in MODES if m == 'eval' or m in args.modes]
    if args.rss_only:
        for m in modes:
            print(m, rss_of(m, args.batch, args.size))
        return {}
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 1000, (args.batch,), generator=torch.Generator().manual_seed(0))
    models = {m: build(m) for m in modes}
    for name, model in models.items():
        if name != 'mmengine':
            model.train()  # what a training loop does; the modes are sticky
    res = {m: {'saved_mib': saved_bytes(copy.deepcopy(models[m]) if m == 'deploy' else models[m], x, y) / 2**20}
           for m in modes}
    with torch.no_grad():  # all modes compute the same function (deploy: folded once)
        ref = models['eval'](x)
        for m in modes:
            res[m]['max_diff_vs_eval'] = (models[m](x) - ref).abs().max().item()
    steps = {m: train_step(models[m], x, y) for m in modes}
    for m, times in interleave(steps, args.repeats, warmup=1).items():
        res[m]['step_s'] = statistics.median(times) / 1e3
    if not args.no_rss:
        for m in modes:
            res[m].update(rss_of(m, args.batch, args.size))
    e = res['eval']
    print(f'ResNet-50 (torchvision, random weights) fine-tuning step, batch {args.batch}, {args.size}x{args.size}, '
          f'CPU, {args.threads} thread(s), median of {args.repeats}')
    print(f'{"mode":10s} {"saved MiB":>10s} {"x eval":>7s} {"step s":>8s} {"x eval":>7s} {"peak MiB":>9s} '
          f'{"x eval":>7s} {"max|diff|":>10s}')
    for m in modes:
        r = res[m]
        peak = f'{r["step_mib"]:9.0f} {r["step_mib"] / max(e["step_mib"], 1e-9):7.3f}' if 'step_mib' in r else f'{"-":>9s} {"-":>7s}'
        print(f'{m:10s} {r["saved_mib"]:10.1f} {r["saved_mib"] / e["saved_mib"]:7.3f} {r["step_s"]:8.3f} '
              f'{r["step_s"] / e["step_s"]:7.3f} {peak} {r["max_diff_vs_eval"]:10.2e}')
    return res


if __name__ == '__main__':
    main()
