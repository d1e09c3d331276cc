"""COCO mAP: our numbers equal pycocotools' COCOeval run directly on the same detections.

The reference side builds its COCO objects here, by hand, with the pycocotools API (ground truth in
memory with ``area`` and ``iscrowd``, detections as [x, y, w, h] result dicts), independently of
``zoo.eval.detection``'s conversion.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from zoo.eval.detection import STATS, MeanAveragePrecision, coco_map

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


def test_accumulator_equals_one_shot_and_empty_predictions():
    preds, targets = _case(3)
    m = MeanAveragePrecision(num_classes=4)
    for k in range(0, len(preds), 5):
        m.update(preds[k:k + 5], targets[k:k + 5])
    assert len(m) == len(preds)
    assert m.compute() == coco_map(preds, targets, num_classes=4)
    m.reset()
    empty = [{'boxes': torch.zeros(0, 4), 'scores': torch.zeros(0), 'labels': torch.zeros(0, dtype=torch.long)}] * 2
    m.update(empty, targets[:2])
    assert m.compute()['map'] == 0.0


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
