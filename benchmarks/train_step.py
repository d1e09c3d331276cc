"""One training step (forward, loss, backward, AdamW) of a zoo model in float32 / bf16 autocast, contiguous /
channels-last weights, eager / ``torch.compile``: what ``--trainer.precision bf16-mixed``, ``--model.channels_last
true`` and ``--compile`` buy a recipe on this CPU (docs/runtimes.md, "Training"; docs/segmentation.md).

Every mode trains its own copy of the same initial weights on the same random batch; the modes are timed
interleaved in one process by ``zoo.eval.profile.interleave`` (medians). A segmenter or detector trains through
``forward_raw`` and its head's loss (segmentation: random class ids; detection: 1-4 random boxes per image), a
classifier through cross-entropy on its logits. The CPU and ``uptime`` are printed with the table.

    python -m benchmarks.train_step --model semfpn_seg --model-args '{"backbone": "resnet18", "backbone_kwargs":
        {"widths": [32, 64, 128, 256]}, "neck_channels": 64, "channels": 64}' --num-classes 7 --batch-size 4
        --img-size 256 --threads 2 --repeats 10
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch
import torch.nn.functional as F

import zoo
from benchmarks.family_table import uptime
from zoo.eval.profile import interleave, machine

MODES = ('fp32', 'fp32-cl', 'bf16', 'bf16-cl', 'compile', 'compile-cl', 'compile-bf16-cl')


def make_step(model: torch.nn.Module, mode: str, x: torch.Tensor, target: torch.Tensor):
    """A closure running one training step of ``model`` (a private copy, set up for ``mode``)."""
    model = copy.deepcopy(model).train()
    if '-cl' in mode:
        model = model.to(memory_format=torch.channels_last)
    if mode.startswith('compile'):
        model.compile()  # a DenseModel compiles backbone, neck and head, as `zoo fit --compile` does
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dense = hasattr(model, 'forward_raw')

    def step() -> None:
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled='bf16' in mode):
            loss = model.head.loss(model.forward_raw(x), target)[0] if dense else F.cross_entropy(model(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--model', default='semfpn_seg')
    ap.add_argument('--model-args', default='{}', help='JSON keyword arguments of zoo.create')
    ap.add_argument('--num-classes', type=int, default=7)
    ap.add_argument('--batch-size', type=int, default=4)
    ap.add_argument('--img-size', type=int, default=256)
    ap.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    ap.add_argument('--repeats', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=2, help='untimed steps per mode (the compiled ones compile here)')
    ap.add_argument('--threads', type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = zoo.create(args.model, num_classes=args.num_classes, **json.loads(args.model_args))
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    if zoo.model_info(args.model).task == 'segmentation':
        target = torch.randint(0, args.num_classes, (args.batch_size, args.img_size, args.img_size))
    elif zoo.model_info(args.model).task == 'detection':  # 1-4 random boxes per image, 16-128 px wide
        target = []
        for _ in range(args.batch_size):
            n = int(torch.randint(1, 5, ()))
            xy = torch.rand(n, 2) * (args.img_size - 128)
            target.append({'boxes': torch.cat([xy, xy + 16 + torch.rand(n, 2) * 112], 1),
                           'labels': torch.randint(0, args.num_classes, (n,))})
    elif hasattr(model, 'forward_raw'):
        raise SystemExit(f'{args.model}: only segmenters, detectors and classifiers have a target here')
    else:
        target = torch.randint(0, args.num_classes, (args.batch_size,))
    steps = {mode: make_step(model, mode, x, target) for mode in args.modes}
    print(f'uptime before: {uptime()}')
    times = interleave(steps, repeats=args.repeats, warmup=args.warmup)
    print(f'uptime after: {uptime()}')
    print(f'{args.model}, batch {args.batch_size}, {args.img_size} px, {torch.get_num_threads()} threads, '
          f'CPU: {machine()["cpu_model"]}')
    base = statistics.median(times[args.modes[0]])
    print(f'| mode | ms / step | images/s | vs {args.modes[0]} |\n|---|---|---|---|')
    for mode in args.modes:
        ms = statistics.median(times[mode])
        print(f'| {mode} | {ms:.1f} | {1000 * args.batch_size / ms:.1f} | {base / ms:.2f}x |')


if __name__ == '__main__':
    main()
