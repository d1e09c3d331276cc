"""Detection benchmarks: the detector on three zoo backbones of similar MACs, and COCO mAP evaluation speed.

    python -m zoo.eval.detection_bench                 # both tables, markdown
    python -m zoo.eval.detection_bench --only eval     # faster-coco-eval vs pycocotools only
    python -m zoo.eval.detection_bench --threads 2 --repeats 10

Table 1, per backbone under the same YOLOv8 neck and head (6 classes): parameters, MACs at 256 px, training
throughput (images/s: forward, YOLOv8 loss, backward and AdamW step on batch 16 at 256 px, random images with
three boxes each) and inference latency (eval forward, batch 1 and 16, 256 and 640 px; NMS not included).
mAP per millisecond needs the mAP of a training run of each (``zoo fit -c recipes/configs/detection/...``).

Table 2: evaluation of 5,000 predictions on 500 images (10 classes) by faster-coco-eval and by pycocotools
(median of ``repeats``), the same numbers from both.

Measures only; nothing here trains a model to convergence (that is the recipes' job).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import zoo
from zoo.detection import DetectionLoss

from .detection import coco_map
from .profile import benchmark, count_macs

# Three backbones of similar cost under the same neck and head (about 0.6-0.7 GMACs at 256 px in all).
DETECTORS = {
    'poolformer (pooling mixer)': dict(backbone='poolformer_tiny', neck_channels=(64, 128, 256),
                                       backbone_kwargs=dict(dims=(32, 64, 128, 256), depths=(1, 1, 3, 1))),
    'metaformer (pool, pool, attention, attention)': dict(
        backbone='metaformer_tiny', neck_channels=(64, 128, 256),
        backbone_kwargs=dict(dims=(32, 64, 128, 256), depths=(1, 1, 3, 1),
                             token_mixer=['pooling', 'pooling', 'attention', 'attention'])),
    'resnet (basic blocks 1-1-2-1)': dict(backbone='resnet_tiny', neck_channels=(64, 128, 256),
                                          backbone_kwargs=dict(stem='imagenet', widths=(32, 64, 128, 256),
                                                               layers=(1, 1, 2, 1))),
}


def train_images_per_s(model, batch: int = 16, size: int = 256, steps: int = 5, warmup: int = 2) -> float:
    model.train()
    loss_fn = DetectionLoss(model.head)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.rand(batch, 3, size, size)
    box = torch.tensor([[0.1, 0.1, 0.3, 0.4], [0.5, 0.5, 0.9, 0.8], [0.2, 0.6, 0.35, 0.75]]) * size
    targets = [{'boxes': box, 'labels': torch.tensor([0, 1, 2])}] * batch
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss, _ = loss_fn(model(x), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def detector_table(threads: int | None = None, repeats: int = 10, num_classes: int = 6) -> list[dict]:
    if threads is not None:
        torch.set_num_threads(threads)
    rows = []
    for label, kw in DETECTORS.items():
        model = zoo.create('yolo_det', num_classes=num_classes, **kw)
        row = {'backbone': label, 'params (M)': sum(p.numel() for p in model.parameters()) / 1e6,
               'GMACs@256': count_macs(model, (3, 256, 256)) / 1e9,
               'train img/s (b16, 256)': train_images_per_s(model)}
        model.eval()
        for size in (256, 640):
            for batch in (1, 16):
                lat = benchmark({label: model}, input_size=(3, size, size), batch_size=batch, warmup=2,
                                repeats=repeats if batch == 1 else max(3, repeats // 3))[label]
                row[f'ms b{batch} {size}'] = lat.median_ms
        rows.append(row)
    return rows


def synthetic_predictions(n_images: int = 500, n_preds: int = 5000, n_classes: int = 10, seed: int = 0):
    """Ground truth of ~5 boxes per image and ``n_preds`` noisy predictions spread over the images."""
    g = torch.Generator().manual_seed(seed)
    targets, preds = [], []
    per_image = n_preds // n_images
    for _ in range(n_images):
        n = int(torch.randint(1, 10, (1,), generator=g))
        xy = torch.rand(n, 2, generator=g) * 500
        boxes = torch.cat((xy, xy + torch.rand(n, 2, generator=g) * 120 + 8), 1)
        labels = torch.randint(0, n_classes, (n,), generator=g)
        targets.append({'boxes': boxes, 'labels': labels})
        idx = torch.randint(0, n, (per_image,), generator=g)
        p = boxes[idx] + torch.randn(per_image, 4, generator=g) * 6
        preds.append({'boxes': p, 'scores': torch.rand(per_image, generator=g),
                      'labels': torch.where(torch.rand(per_image, generator=g) < 0.8, labels[idx],
                                            torch.randint(0, n_classes, (per_image,), generator=g))})
    return preds, targets


def eval_table(repeats: int = 5) -> list[dict]:
    preds, targets = synthetic_predictions()
    rows = []
    for backend in ('faster_coco_eval', 'pycocotools'):
        times, stats = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            stats = coco_map(preds, targets, num_classes=10, backend=backend)
            times.append(time.perf_counter() - t0)
        rows.append({'backend': backend, 'seconds (median)': statistics.median(times), 'mAP': stats['map'],
                     'mAP50': stats['map50']})
    return rows


def _markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    fmt = lambda v: f'{v:.3g}' if isinstance(v, float) else str(v)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    lines += ['| ' + ' | '.join(fmt(r[c]) for c in cols) + ' |' for r in rows]
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--only', choices=('detectors', 'eval'), default=None)
    ap.add_argument('--threads', type=int, default=None)
    ap.add_argument('--repeats', type=int, default=10)
    args = ap.parse_args(argv)
    if args.only in (None, 'detectors'):
        print(_markdown(detector_table(args.threads, args.repeats)))
        print()
    if args.only in (None, 'eval'):
        print(_markdown(eval_table(max(1, args.repeats // 2))))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
