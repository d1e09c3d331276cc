"""Per-block INT8 sensitivity (issue 45, item 2): each block kind of a trained network quantized alone.

For every block kind that owns convolutions or linear layers (the kinds ``zoo profile`` names: token mixer, channel
mixer, stem, downsample, ...), the network runs in ONNX Runtime int8 (QDQ, U8S8, calibrated on the first 256
training images) with only that kind's Conv / Gemm / MatMul ops quantized, beside the float32 ONNX Runtime graph
and the whole network in int8 (``zoo.eval.breakdown.int8_sensitivity``). Reported per kind: top-1 on the run's
test split and its drop from float32, the median latency at the given batch (one interleaved timer) and the speed-up
over float32, the largest logit difference on the timed batch.

    python -m benchmarks.int8_blocks --ckpt runs/.../best-*.ckpt [...] --batch-size 16

``--model NAME`` instead times a registered model's random initialisation (no accuracy: calibrated on random
inputs), what ``zoo profile NAME --int8`` prints.
"""
from __future__ import annotations

import argparse

import torch

RUNTIME = 'onnxruntime-int8'


def top1(net, loader) -> float:
    correct = total = 0
    with torch.inference_mode():
        for x, y in loader:
            correct += int((net(x).argmax(-1) == y).sum())
            total += len(y)
    return correct / total


def _timed_batch(loader, batch_size: int) -> torch.Tensor:
    """The first ``batch_size`` test images (repeated when the split is smaller)."""
    xs, n = [], 0
    while n < batch_size:
        for x, _ in loader:
            xs.append(x)
            n += len(x)
            if n >= batch_size:
                break
    return torch.cat(xs)[:batch_size]


def from_checkpoint(ckpt: str, batch_size: int, repeats: int) -> tuple[str, list[dict]]:
    from zoo._quantize import training_calibration
    from zoo.eval.breakdown import int8_sensitivity
    from zoo.recipes.export import trained_run

    net, created, dm = trained_run(ckpt)
    if dm is None:
        raise ValueError(f'{ckpt}: its run has no config.yaml with a DataModule (needed for the test split)')
    torch.manual_seed(0)  # the training loader's shuffle picks the calibration images: the same ones every run
    calibration = training_calibration(dm)
    dm.setup('test')
    x = _timed_batch(dm.test_dataloader(), batch_size)
    rows = int8_sensitivity(net, x, calibration, evaluate=lambda n: top1(n, dm.test_dataloader()), runtime=RUNTIME,
                            repeats=repeats)
    return created['name'], rows


def from_model(name: str, batch_size: int, repeats: int, img_size: int | None) -> tuple[str, list[dict]]:
    import zoo
    from zoo import tasks
    from zoo.eval.breakdown import int8_sensitivity

    torch.manual_seed(0)
    net = zoo.create(name).eval()
    x = tasks.example_input(net, tasks.input_size(name, img_size=img_size), batch_size)
    return name, int8_sensitivity(net, x, [x], runtime=RUNTIME, repeats=repeats)


def cli(argv=None) -> int:
    from zoo.eval.breakdown import int8_table
    from zoo.eval.profile import load_average, machine

    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--ckpt', nargs='*', default=[], help='zoo fit checkpoints (their runs give the data)')
    p.add_argument('--model', nargs='*', default=[], help='registered models, random weights (timing only)')
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--img-size', type=int, help='--model only: image size (default: the model\'s)')
    p.add_argument('--repeats', type=int, default=30)
    p.add_argument('--threads', type=int)
    args = p.parse_args(argv)
    if not args.ckpt and not args.model:
        p.error('give --ckpt FILE ... or --model NAME ...')
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f'CPU: {machine()["cpu_model"]}, {torch.get_num_threads()} threads, load {load_average()}')
    results = [from_checkpoint(c, args.batch_size, args.repeats) for c in args.ckpt]
    results += [from_model(m, args.batch_size, args.repeats, args.img_size) for m in args.model]
    print(int8_table(results))
    print(f'load after: {load_average()}')
    return 0


if __name__ == '__main__':
    raise SystemExit(cli())
