"""Detection benchmarks: the detector on three zoo backbones of similar MACs, and COCO mAP evaluation speed.

    python -m benchmarks.detection_bench backbones --db zoo-results.db   # the backbone table (issue 16)
    python -m benchmarks.detection_bench eval                            # faster-coco-eval vs pycocotools

``backbones``: one row per detection config (default: ``poolformer_shapes_det``, ``metaformer_shapes_det`` and
``resnet_shapes_det`` in ``recipes/configs/detection/``: the same YOLOv8 neck, head, data and schedule on three
backbones of 0.7-0.8 GMACs at 256 px). Each detector is built from its config's ``model.init_args`` with
``zoo.create``; the columns are parameters, MACs (at the training size), training throughput (images/s of one optimisation step:
forward, YOLOv8 loss, backward and AdamW step on batch 16 at 256 px, random images with three boxes each; data
loading not included), eval-forward latency at batch 1 and 16, 256 and 640 px (NMS not included), each as the
median and the interquartile range, and the final ``val/map`` / ``val/map50`` of the newest finished
``zoo fit`` run of that architecture in the results database (matched by architecture fingerprint and
dataset), with mAP per millisecond of batch-1 latency. The three detectors are timed interleaved (A, B, C, A,
B, C, ...: machine noise hits them alike); the 1-minute load average before and after is printed with the
table. Train first with ``zoo fit -c <config> --db <same db>`` (docs/detection.md gives the sequence).

``eval``: 5,000 predictions on 500 images (10 classes) scored by faster-coco-eval and by pycocotools,
interleaved, median and IQR of ``--repeats``; both must give the same numbers.

Measures and reads only; nothing here trains (that is ``zoo fit``'s job).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

import zoo

from zoo.eval.detection import coco_map
from zoo.eval.profile import benchmark, count_macs, fingerprint, interleave
from zoo.eval.results.schema import ResultsDBError

BACKBONE_CONFIGS = ('poolformer_shapes_det.yaml', 'metaformer_shapes_det.yaml', 'resnet_shapes_det.yaml')


class BenchError(ValueError):
    """Bad input to the benchmark (a missing or non-detection config, an unreadable database)."""


def _iqr(times: list[float]) -> float:
    if len(times) < 4:
        return 0.0
    q = statistics.quantiles(times, n=4)
    return q[2] - q[0]


def config_dir() -> Path:
    """``recipes/configs/detection`` of the installed package (found without importing the recipes)."""
    from importlib.util import find_spec
    return Path(find_spec('zoo.recipes').submodule_search_locations[0]) / 'configs' / 'detection'


def read_config(path: str | Path) -> tuple[str, dict]:
    """A detection config -> (model name, model_args). A bare file name is looked up in the package configs."""
    import yaml
    p = Path(path)
    if not p.is_file() and not p.parent.name and (config_dir() / p.name).is_file():
        p = config_dir() / p.name
    if not p.is_file():
        raise BenchError(f'config not found: {path} (expected a YAML file such as '
                         f'recipes/configs/detection/{BACKBONE_CONFIGS[0]})')
    cfg = yaml.safe_load(p.read_text()) or {}
    init = ((cfg.get('model') or {}).get('init_args') or {})
    name = init.get('name')
    if not name or zoo.model_info(name).task != 'detection':
        raise BenchError(f'{p}: model.init_args.name must name a detection model (e.g. yolo_det), got {name!r}')
    return name, dict(init.get('model_args') or {})


def train_step(model: torch.nn.Module, batch: int, size: int):
    """One optimisation step of the detector on a fixed random batch (forward, loss, backward, AdamW)."""
    loss_fn = model.head.loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.rand(batch, 3, size, size)
    box = torch.tensor([[0.1, 0.1, 0.3, 0.4], [0.5, 0.5, 0.9, 0.8], [0.2, 0.6, 0.35, 0.75]]) * size
    targets = [{'boxes': box, 'labels': torch.tensor([0, 1, 2]) % model.num_classes}] * batch

    def step():
        model.train()
        loss, _ = loss_fn(model.forward_raw(x), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def existing_db(db) -> str | None:
    """The database URL for ``db`` (see ``results.resolve_url``), or None when disabled or a missing SQLite file."""
    from zoo.eval.results import resolve_url
    url = resolve_url(db)
    if url is None or (url.startswith('sqlite:///') and not Path(url[len('sqlite:///'):]).is_file()):
        return None
    return url


def trained_map(db, name: str, model: torch.nn.Module, dataset: str | None, epochs: int | None) -> dict:
    """Final val/map and val/map50 of the newest finished fit run of this architecture (or empty)."""
    from zoo.eval.results import open_db
    if existing_db(db) is None:
        return {}  # nothing trained yet (reading must not create a database)
    df = open_db(db).runs(model=name, task='detection', stage='fit', status='finished',
                          arch_fingerprint=fingerprint(model), dataset=dataset, max_epochs=epochs)
    if df.empty or 'val/map' not in df:
        return {}
    last = df.dropna(subset=['val/map']).tail(1)
    if last.empty:
        return {}
    r = last.iloc[0]
    return {'run': int(r['id']), 'epochs': r['max_epochs'], 'runs': len(df), 'map': float(r['val/map']),
            'map50': float(r.get('val/map50', float('nan')))}


def backbone_table(configs=BACKBONE_CONFIGS, db=None, dataset: str | None = 'shapes_det', epochs: int | None = None,
                   num_classes: int = 6, threads: int | None = None, repeats: int = 20, sizes=(256, 640),
                   batches=(1, 16), train_batch: int = 16, train_size: int = 256, train_steps: int = 10):
    """Rows of the backbone table and the conditions they were measured under (see the module docstring)."""
    if threads is not None:
        torch.set_num_threads(threads)
    models, names = {}, {}
    for c in configs:
        name, args = read_config(c)
        label = Path(c).stem
        torch.manual_seed(0)
        models[label], names[label] = zoo.create(name, num_classes=num_classes, **args), name
    load_before = os.getloadavg()[0]
    rows = {label: {'config': label, 'params (M)': sum(p.numel() for p in m.parameters()) / 1e6,
                    f'GMACs@{train_size}': count_macs(m, (3, train_size, train_size)) / 1e9}
            for label, m in models.items()}
    # training throughput, interleaved; then inference latency, interleaved per (size, batch)
    steps = {label: train_step(m, train_batch, train_size) for label, m in models.items()}
    for label, times in interleave(steps, repeats=train_steps, warmup=2).items():
        rates = [train_batch / (t / 1000) for t in times]
        rows[label][f'train img/s (b{train_batch}, {train_size})'] = statistics.median(rates)
        rows[label][f'train img/s (b{train_batch}, {train_size}) IQR'] = _iqr(rates)
    for size in sizes:
        for batch in batches:
            n = repeats if batch == 1 else max(5, repeats // 2)
            lats = benchmark(models, input_size=(3, size, size), batch_size=batch, warmup=2, repeats=n)
            for label, lat in lats.items():
                rows[label][f'ms b{batch} {size}'] = lat.median_ms
                rows[label][f'ms b{batch} {size} IQR'] = lat.iqr_ms
    load_after = os.getloadavg()[0]
    b, s = min(batches), sizes[0]
    for label, m in models.items():
        found = trained_map(db, names[label], m, dataset, epochs)
        row = rows[label]
        row['val/map'], row['val/map50'] = found.get('map', float('nan')), found.get('map50', float('nan'))
        row[f'mAP per ms (b{b} {s})'] = row['val/map'] / row[f'ms b{b} {s}']
        row['run (epochs)'] = f"{found['run']} ({found['epochs']})" if found else 'none'
    info = {'torch': torch.__version__, 'threads': torch.get_num_threads(), 'load_before': load_before,
            'load_after': load_after, 'repeats': repeats, 'train_steps': train_steps}
    return list(rows.values()), info


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


def eval_table(repeats: int = 5, n_images: int = 500, n_preds: int = 5000):
    """faster-coco-eval vs pycocotools on the same predictions, interleaved."""
    preds, targets = synthetic_predictions(n_images, n_preds)
    stats = {}

    def score(backend):
        def fn():
            stats[backend] = coco_map(preds, targets, num_classes=10, backend=backend)
        return fn
    load_before = os.getloadavg()[0]
    times = interleave({b: score(b) for b in ('faster_coco_eval', 'pycocotools')}, repeats=repeats, warmup=1)
    info = {'load_before': load_before, 'load_after': os.getloadavg()[0], 'repeats': repeats,
            'predictions': sum(len(p['labels']) for p in preds), 'images': len(preds)}
    rows = [{'backend': b, 'seconds': statistics.median(t) / 1000, 'seconds IQR': _iqr(t) / 1000,
             'mAP': stats[b]['map'], 'mAP50': stats[b]['map50']} for b, t in times.items()]
    return rows, info


def _markdown(rows: list[dict]) -> str:
    """A markdown table; a column ``X IQR`` is shown inside column ``X`` as ``median (IQR)``."""
    cols = [c for c in rows[0] if not c.endswith(' IQR')]
    fmt = lambda v: ('-' if v != v else f'{v:.3g}') if isinstance(v, float) else str(v)  # NaN: not measured
    cell = lambda r, c: fmt(r[c]) + (f' ({fmt(r[c + " IQR"])})' if c + ' IQR' in r else '')
    lines = ['| ' + ' | '.join(c + (' (IQR)' if c + ' IQR' in rows[0] else '') for c in cols) + ' |',
             '|' + '---|' * len(cols)]
    lines += ['| ' + ' | '.join(cell(r, c) for c in cols) + ' |' for r in rows]
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='python -m benchmarks.detection_bench', description=__doc__.split('\n\n')[0])
    sub = ap.add_subparsers(dest='command', required=True)
    bb = sub.add_parser('backbones', help='params, MACs, training images/s, latency and trained mAP per backbone')
    bb.add_argument('configs', nargs='*', default=list(BACKBONE_CONFIGS),
                    help=f'detection configs (default: {", ".join(BACKBONE_CONFIGS)})')
    bb.add_argument('--db', help='results database to read the mAP from (default $ZOO_DB or ./zoo-results.db)')
    bb.add_argument('--dataset', default='shapes_det', help='dataset of the runs to read (default shapes_det)')
    bb.add_argument('--epochs', type=int, help='only runs with this max_epochs budget')
    bb.add_argument('--num-classes', type=int, default=6, help='classes of the detectors (shapes_det: 6)')
    bb.add_argument('--threads', type=int)
    bb.add_argument('--repeats', type=int, default=20, help='timed rounds at batch 1 (half, at least 5, at batch 16)')
    bb.add_argument('--sizes', type=int, nargs='+', default=[256, 640])
    bb.add_argument('--batches', type=int, nargs='+', default=[1, 16])
    bb.add_argument('--train-batch', type=int, default=16)
    bb.add_argument('--train-size', type=int, default=256)
    bb.add_argument('--train-steps', type=int, default=10)
    ev = sub.add_parser('eval', help='faster-coco-eval vs pycocotools on 5,000 predictions, 500 images')
    ev.add_argument('--repeats', type=int, default=5)
    args = ap.parse_args(argv)
    try:
        if args.command == 'backbones':
            if any(s % 32 for s in [*args.sizes, args.train_size]):
                raise BenchError(f'sizes must be multiples of 32 (the detector strides), got '
                                 f'{[*args.sizes, args.train_size]}')
            rows, info = backbone_table(args.configs, args.db, args.dataset, args.epochs, args.num_classes,
                                        args.threads, args.repeats, tuple(args.sizes), tuple(args.batches),
                                        args.train_batch, args.train_size, args.train_steps)
            if existing_db(args.db) is None:
                print(f'detection_bench: no results database at {args.db or os.environ.get("ZOO_DB", "the default")}'
                      f' (train first, docs/detection.md); the mAP columns stay empty', file=sys.stderr)
            print(f"detection backbones: torch {info['torch']}, threads {info['threads']}, 1-min load "
                  f"{info['load_before']:.2f} before / {info['load_after']:.2f} after, {info['repeats']} rounds at "
                  f"batch 1, {info['train_steps']} training steps; latency medians with their IQR")
        else:
            rows, info = eval_table(args.repeats)
            print(f"COCO evaluation of {info['predictions']} predictions on {info['images']} images: 1-min load "
                  f"{info['load_before']:.2f} before / {info['load_after']:.2f} after, {info['repeats']} rounds, "
                  f"interleaved")
    except (BenchError, KeyError, ResultsDBError) as e:
        print(f'detection_bench: {e.args[0] if e.args else e}', file=sys.stderr)
        return 2
    print(_markdown(rows))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
