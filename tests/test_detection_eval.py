"""COCO mAP: our numbers equal pycocotools' COCOeval run directly on the same detections.

The reference side builds its COCO objects here, by hand, with the pycocotools API (ground truth in
memory with ``area`` and ``iscrowd``, detections as [x, y, w, h] result dicts), independently of
``zoo.eval.detection``'s conversion.
"""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from zoo.eval.detection import STATS, coco_map

pytest.importorskip('pycocotools')
pytest.importorskip('faster_coco_eval')


def _case(seed=0, n_images=12, n_classes=4):
    """Several images and classes, crowds of overlapping boxes, misses, false positives, a crowd region,
    duplicates and an image without objects."""
    g = torch.Generator().manual_seed(seed)
    preds, targets = [], []
    for i in range(n_images):
        n = 0 if i == 3 else int(torch.randint(1, 12, (1,), generator=g))
        xy = torch.rand(n, 2, generator=g) * 300
        wh = torch.rand(n, 2, generator=g) * 120 + 4  # small, medium and large boxes
        boxes = torch.cat((xy, xy + wh), 1)
        labels = torch.randint(0, n_classes, (n,), generator=g)
        crowd = torch.zeros(n, dtype=torch.long)
        if i == 5 and n:
            crowd[0] = 1
        targets.append({'boxes': boxes, 'labels': labels, 'iscrowd': crowd})
        keep = torch.rand(n, generator=g) > 0.2  # ~20 % misses
        jitter = torch.randn(int(keep.sum()), 4, generator=g) * wh[keep].repeat(1, 2) * 0.08
        p_boxes = boxes[keep] + jitter
        p_labels = labels[keep].clone()
        flip = torch.rand(len(p_labels), generator=g) < 0.1  # some wrong classes
        p_labels[flip] = (p_labels[flip] + 1) % n_classes
        fp_xy = torch.rand(3, 2, generator=g) * 300  # false positives
        fp = torch.cat((fp_xy, fp_xy + torch.rand(3, 2, generator=g) * 60 + 5), 1)
        dup = p_boxes[:2] + 1.0  # duplicates of the first detections
        preds.append({'boxes': torch.cat((p_boxes, fp, dup)),
                      'scores': torch.rand(len(p_boxes) + 3 + len(dup), generator=g),
                      'labels': torch.cat((p_labels, torch.randint(0, n_classes, (3,), generator=g), p_labels[:2]))})
    return preds, targets


def _pycocotools_reference(preds, targets, n_classes):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    images, anns, dets = [], [], []
    for img_id, (p, t) in enumerate(zip(preds, targets)):
        images.append({'id': img_id})
        for b, l, c in zip(t['boxes'].tolist(), t['labels'].tolist(), t['iscrowd'].tolist()):
            w, h = b[2] - b[0], b[3] - b[1]
            anns.append({'id': len(anns) + 1, 'image_id': img_id, 'category_id': l, 'bbox': [b[0], b[1], w, h],
                         'area': w * h, 'iscrowd': c})
        for b, s, l in zip(p['boxes'].tolist(), p['scores'].tolist(), p['labels'].tolist()):
            dets.append({'image_id': img_id, 'category_id': l, 'bbox': [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                         'score': s})
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {'images': images, 'annotations': anns,
                      'categories': [{'id': c, 'name': str(c)} for c in range(n_classes)]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(dets), 'bbox')
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return dict(zip(STATS, ev.stats))


@pytest.mark.parametrize('backend', ['faster_coco_eval', 'pycocotools'])
@pytest.mark.parametrize('seed', [0, 1])
def test_map_equals_pycocotools(backend, seed):
    preds, targets = _case(seed)
    ref = _pycocotools_reference(preds, targets, 4)
    ours = coco_map(preds, targets, num_classes=4, backend=backend)
    assert 0.1 < ref['map'] < 0.9, 'the case should be neither trivial nor hopeless'
    for k in STATS:
        assert ours[k] == pytest.approx(ref[k], abs=1e-9), k


def test_ground_truth_as_predictions_scores_one_and_shifts_drop_it():
    _, targets = _case(2)
    targets = [{k: v for k, v in t.items() if k != 'iscrowd'} for t in targets]
    perfect = [{'boxes': t['boxes'], 'labels': t['labels'], 'scores': torch.ones(len(t['labels']))} for t in targets]
    r = coco_map(perfect, targets)
    assert r['map'] == pytest.approx(1.0) and r['map50'] == pytest.approx(1.0)
    shifted = [{**p, 'boxes': p['boxes'] + (p['boxes'][:, 2:] - p['boxes'][:, :2]).repeat(1, 2) * 0.15}
               for p in perfect]
    s = coco_map(shifted, targets)
    assert s['map'] < 0.9 and s['map50'] == pytest.approx(1.0)  # IoU ~0.74: still a hit at 0.5, not at 0.75+
    far = [{**p, 'boxes': p['boxes'] + 500} for p in perfect]
    assert coco_map(far, targets)['map'] == 0.0


def test_the_recipes_metric_equals_pycocotools_accumulated_and_empty():
    """torchmetrics' MeanAveragePrecision (faster-coco-eval), which the detection recipe accumulates batch by batch,
    equals pycocotools' COCOeval of the whole set; no prediction at all scores 0."""
    from zoo.recipes.detection import coco_metric

    preds, targets = _case(3)
    m = coco_metric()
    for k in range(0, len(preds), 5):
        m.update(preds[k:k + 5], targets[k:k + 5])
    ours, ref = m.compute(), coco_map(preds, targets, num_classes=4, backend='pycocotools')
    for mine, theirs in (('map', 'map'), ('map_50', 'map50'), ('map_75', 'map75'), ('mar_100', 'mar_100')):
        assert float(ours[mine]) == pytest.approx(ref[theirs], abs=1e-6), mine
    m.reset()
    empty = [{'boxes': torch.zeros(0, 4), 'scores': torch.zeros(0), 'labels': torch.zeros(0, dtype=torch.long)}] * 2
    m.update(empty, targets[:2])
    assert float(m.compute()['map']) <= 0.0


def test_bad_inputs():
    preds, targets = _case(0, n_images=2)
    with pytest.raises(ValueError, match='backend'):
        coco_map(preds, targets, backend='nope')
    with pytest.raises(ValueError, match='2 targets'):
        coco_map(preds[:1], targets)
    targets[0]['labels'][0] = 3
    with pytest.raises(ValueError, match='label 3 of image 0 is outside 0..1'):
        coco_map(preds, targets, num_classes=2)
    assert np.isfinite(coco_map(preds, targets)['map'])


# --- crowd regions --------------------------------------------------------------------------------------------

def _with_crowd_regions(preds, targets, seed=0):
    """Two crowd regions per image, clear of every object (x, y > 440), each with three high-scored detections
    inside it: COCOeval ignores those detections (neither true nor false positives)."""
    g = torch.Generator().manual_seed(seed)
    crowd_preds, crowd_targets = [], []
    for p, t in zip(preds, targets):
        xy = 450 + torch.rand(2, 2, generator=g) * 200
        regions = torch.cat((xy, xy + 60 + torch.rand(2, 2, generator=g) * 80), 1)  # (2, 4) xyxy
        classes = torch.randint(0, 4, (2,), generator=g)
        crowd_targets.append({'boxes': torch.cat((t['boxes'], regions)), 'labels': torch.cat((t['labels'], classes)),
                              'iscrowd': torch.cat((t['iscrowd'], torch.ones(2, dtype=torch.long)))})
        inside = []
        for r in regions:  # sub-boxes: IoU with a crowd region is intersection / detection area, here 1
            a = r[:2] + torch.rand(3, 2, generator=g) * 20
            inside.append(torch.cat((a, torch.minimum(a + 10 + torch.rand(3, 2, generator=g) * 30, r[2:])), 1))
        crowd_preds.append({'boxes': torch.cat((p['boxes'], *inside)),
                            'scores': torch.cat((p['scores'], 0.9 + 0.1 * torch.rand(6, generator=g))),
                            'labels': torch.cat((p['labels'], classes.repeat_interleave(3)))})
    return crowd_preds, crowd_targets


@pytest.mark.parametrize('backend', ['faster_coco_eval', 'pycocotools'])
def test_detections_on_crowd_regions_are_ignored_as_cocoeval_does(backend):
    preds, targets = _case(4)
    preds, targets = _with_crowd_regions(preds, targets)
    ref = _pycocotools_reference(preds, targets, 4)
    ours = coco_map(preds, targets, num_classes=4, backend=backend)
    for k in STATS:
        assert ours[k] == pytest.approx(ref[k], abs=1e-9), k
    # the detections inside crowd regions change nothing ...
    plain = [{k: v[:-6] for k, v in p.items()} for p in preds]  # the last six of each image are in crowds
    assert coco_map(plain, targets, num_classes=4, backend=backend)['map'] == pytest.approx(ours['map'])
    # ... while without the crowd regions in the ground truth they are false positives
    no_crowd = [{k: v[~t['iscrowd'].bool()] for k, v in t.items()} for t in targets]
    assert coco_map(preds, no_crowd, num_classes=4, backend=backend)['map'] < ours['map'] - 0.02


def _write_coco_with_crowds(root, seed=0):
    """A COCO folder (``annotations/instances_val.json`` + ``val/*.png``) of non-square images with objects and
    crowd regions, and detections in the files' pixels: jittered objects, misses, wrong classes, false
    positives, and detections inside the crowd regions."""
    from torchvision.io import write_png
    rng = np.random.default_rng(seed)
    (root / 'val').mkdir(parents=True)
    (root / 'annotations').mkdir()
    images, anns, dets = [], [], []
    for i, (h, w) in enumerate([(120, 200), (200, 90), (160, 160), (100, 260), (240, 180), (130, 130)], start=1):
        write_png(torch.zeros(3, h, w, dtype=torch.uint8), str(root / 'val' / f'{i}.png'))
        images.append({'id': i, 'file_name': f'{i}.png', 'height': h, 'width': w})
        for k in range(int(rng.integers(1, 7))):
            side = [3, 10, 10, w / 2.5, w / 1.2][k % 5]  # tiny (about 1.5 px in the network input), small ... large
            bw, bh = min(rng.uniform(0.6, 1) * side, w - 1), min(rng.uniform(0.6, 1) * side * h / w, h - 1)
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            crowd = int(k < 2 and i % 2 == 1)  # crowd regions in every other image
            cat = int(rng.choice([1, 4, 9]))
            anns.append({'id': len(anns) + 1, 'image_id': i, 'category_id': cat, 'bbox': [x, y, bw, bh],
                         'area': bw * bh * 0.7, 'iscrowd': crowd})
            for _ in range(3 if crowd else int(rng.random() > 0.2)):  # several inside a crowd; ~20 % misses
                jx, jy, jw, jh = rng.normal(0, 0.08, 4) * [bw, bh, bw, bh]
                x1, y1 = max(x + jx, 0.0), max(y + jy, 0.0)  # inside the image, as a detector's boxes are
                x2, y2 = min(x + jx + bw + jw, w), min(y + jy + bh + jh, h)
                dets.append({'image_id': i, 'category_id': cat if rng.random() > 0.1 else 4,
                             'bbox': [x1, y1, x2 - x1, y2 - y1], 'score': float(rng.random())})
        for _ in range(2):  # false positives
            x, y = rng.uniform(0, w - 20), rng.uniform(0, h - 20)
            dets.append({'image_id': i, 'category_id': int(rng.choice([1, 4, 9])), 'bbox': [x, y, 15.0, 15.0],
                         'score': float(rng.random())})
    cats = [{'id': c, 'name': f'c{c}'} for c in (9, 1, 4)]
    (root / 'annotations' / 'instances_val.json').write_text(json.dumps(
        {'images': images, 'annotations': anns, 'categories': cats}))
    return dets


@pytest.mark.parametrize('backend', ['faster_coco_eval', 'pycocotools'])
def test_coco_folder_with_crowds_validates_like_cocoeval_on_the_file(tmp_path, backend):
    """The loader carries ``iscrowd``, the annotations' ``area`` and every box in the file's pixels to the
    evaluator: validation mAP as the recipe computes it (DataModule -> collate -> predictions on the
    letterboxed images mapped back by the head's ``unletterbox`` -> the recipe's ground truth -> torchmetrics'
    MeanAveragePrecision) equals pycocotools' COCOeval of the same detections on the original annotation file in
    all the numbers, the small / medium / large ones included (their areas are the file's ``area`` field, 0.7 of
    the box here, as a segment's would be)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from zoo.datasets import CocoDetectionDataModule
    from zoo.layers.detect import unletterbox
    from zoo.recipes.detection import _file_targets, coco_metric

    dets = _write_coco_with_crowds(tmp_path)
    ann = json.loads((tmp_path / 'annotations' / 'instances_val.json').read_text())
    assert sum(a['iscrowd'] for a in ann['annotations']) >= 4
    dm = CocoDetectionDataModule(str(tmp_path), train_split='val', img_size=128, augment=None, batch_size=4)
    dm.setup()
    metric = coco_metric(backend)
    label_of = {c: i for i, c in enumerate(dm.categories)}
    for _, targets in dm.val_dataloader():
        preds = []
        for t in targets:  # the file's detections, letterboxed like the image (x * scale + pad), then mapped back
            mine = [d for d in dets if d['image_id'] == t['image_id']]
            xywh = torch.tensor([d['bbox'] for d in mine], dtype=torch.float64).reshape(-1, 4)
            xyxy = torch.cat((xywh[:, :2], xywh[:, :2] + xywh[:, 2:]), 1)
            (sx, sy), (px, py) = t['scale'], t['pad']
            boxes = xyxy * torch.tensor([sx, sy, sx, sy]) + torch.tensor([px, py, px, py])
            preds.append({'boxes': unletterbox(boxes.float(), t), 'scores': torch.tensor([d['score'] for d in mine]),
                          'labels': torch.tensor([label_of[d['category_id']] for d in mine])})
        metric.update(preds, _file_targets(targets))
    ours = metric.compute()

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(tmp_path / 'annotations' / 'instances_val.json'))
        ev = COCOeval(gt, gt.loadRes(dets), 'bbox')
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    ref = dict(zip(STATS, ev.stats))
    assert 0.1 < ref['map'] < 0.9
    assert min(ref[k] for k in ('map_small', 'map_medium', 'map_large')) >= 0, 'every size range should hold objects'
    for k in STATS:
        assert float(ours[k.replace('map50', 'map_50').replace('map75', 'map_75')]) == pytest.approx(ref[k],
                                                                                                     abs=1e-6), k


# --- the backbone table reads each backbone's mAP from the results database ------------------------------------

def test_backbone_table_reads_the_trained_map_of_each_architecture(tmp_path, capsys):
    """``detection_bench backbones`` measures the detectors its configs build (tiny sizes here; no timing is
    asserted) and takes mAP from the newest finished fit run of the same architecture and dataset."""
    import zoo
    from benchmarks import detection_bench as bench
    from zoo.eval.profile import fingerprint
    from zoo.eval.results import ResultsDB

    name, args = bench.read_config('resnet_shapes_det.yaml')
    fp = fingerprint(zoo.create(name, num_classes=6, **args))
    db = ResultsDB(f'sqlite:///{tmp_path / "r.db"}')
    for value, status, dataset in ((0.5, 'finished', 'shapes_det'), (0.6, 'finished', 'shapes_det'),
                                   (0.9, 'failed', 'shapes_det'), (0.95, 'finished', 'digits_det')):
        rid = db.start_run(name, task='detection', stage='fit', dataset=dataset, arch_fingerprint=fp, max_epochs=6)
        db.log_metrics(rid, {'val/map': value, 'val/map50': value + 0.3}, final=True)
        db.finish_run(rid, status)
    tiny = dict(sizes=(64,), batches=(1,), repeats=2, train_batch=2, train_size=64, train_steps=2)
    rows, info = bench.backbone_table(['resnet_shapes_det.yaml', 'poolformer_shapes_det.yaml'],
                                      db=str(tmp_path / 'r.db'), **tiny)
    res, pool = rows
    assert res['config'] == 'resnet_shapes_det' and res['val/map'] == 0.6 and res['val/map50'] == pytest.approx(0.9)
    assert res['mAP per ms (b1 64)'] == pytest.approx(0.6 / res['ms b1 64']) and res['run (epochs)'] == '2 (6)'
    assert np.isnan(pool['val/map']) and pool['run (epochs)'] == 'none'  # not trained
    assert res['params (M)'] != pool['params (M)'] and res['ms b1 64 IQR'] >= 0 and res['train img/s (b2, 64)'] > 0
    assert {'load_before', 'load_after', 'threads'} <= set(info)
    assert bench.main(['backbones', 'nope.yaml']) == 2
    assert 'config not found: nope.yaml' in capsys.readouterr().err
