"""COCO-style detection metrics: mAP@[.5:.95], mAP50 and the rest of COCOeval's twelve numbers.

Scoring is COCOeval's own (101-point interpolated precision, greedy matching by score, IoU 0.50:0.05:0.95,
100 detections per image, crowd boxes ignored), run by faster-coco-eval (C++, the default) or by pycocotools
(the official implementation). Both build the ground truth in memory; nothing is written to disk. Training
runs accumulate mAP with torchmetrics' ``MeanAveragePrecision`` (the same faster-coco-eval scoring, gathered
across processes by torchmetrics; ``recipes/detection.py``); ``coco_map`` scores whole prediction sets (a
``predictions.json``, the tests' references).

    >>> from zoo.eval.detection import coco_map
    >>> coco_map(preds, targets)['map50']      # preds/targets: one dict per image (xyxy pixel boxes)

Inputs, one dict per image: predictions ``{'boxes': (N, 4) xyxy, 'scores': (N,), 'labels': (N,)}``; targets
``{'boxes': (M, 4) xyxy, 'labels': (M,)}`` with optional ``'iscrowd'`` (M,) and ``'area'`` (M,) (default: the box
area). Tensors or arrays. Labels are contiguous class indices; ``categories`` maps them to COCO category ids
when the output must name a dataset's own ids.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence

import numpy as np

__all__ = ['STATS', 'IOU_THRESHOLDS', 'REC_THRESHOLDS', 'coco_map', 'coco_ground_truth', 'coco_detections']

# The twelve numbers of COCOeval.stats, in order.
STATS = ('map', 'map50', 'map75', 'map_small', 'map_medium', 'map_large',
         'mar_1', 'mar_10', 'mar_100', 'mar_small', 'mar_medium', 'mar_large')
BACKENDS = ('faster_coco_eval', 'pycocotools')
# COCOeval's own thresholds, in float64 as its Params builds them: an evaluator given float32 ones (torchmetrics'
# default) scores a pair at IoU 0.75 differently from COCOeval now and then.
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1, endpoint=True).tolist()
REC_THRESHOLDS = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1, endpoint=True).tolist()


def _np(x, dtype=np.float64, shape=None) -> np.ndarray:
    if hasattr(x, 'detach'):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=dtype)
    return a.reshape(shape) if shape is not None else a


def coco_ground_truth(targets: Sequence[dict], num_classes: int | None = None, categories: Sequence[int] | None = None,
                      image_ids: Sequence[int] | None = None, sizes: Sequence[tuple[int, int]] | None = None) -> dict:
    """Targets -> a COCO-format ground-truth dict (images, annotations with ``area`` and ``iscrowd``, categories).

    ``categories[label]`` is the category id of a label (default: the label itself); ``sizes`` are (H, W).
    """
    ids = list(image_ids) if image_ids is not None else list(range(len(targets)))
    labels_seen = sorted({int(v) for t in targets for v in _np(t['labels'], np.int64).ravel()})
    n = num_classes if num_classes is not None else (len(categories) if categories is not None
                                                      else (labels_seen[-1] + 1 if labels_seen else 1))
    cat_of = list(categories) if categories is not None else list(range(n))
    images, anns = [], []
    for k, (img_id, t) in enumerate(zip(ids, targets)):
        h, w = sizes[k] if sizes is not None else (0, 0)
        images.append({'id': int(img_id), 'height': int(h), 'width': int(w)})
        boxes = _np(t['boxes'], shape=(-1, 4))
        labels = _np(t['labels'], np.int64).ravel()
        crowd = _np(t.get('iscrowd', np.zeros(len(labels))), np.int64).ravel()
        wh = boxes[:, 2:] - boxes[:, :2]
        area = _np(t['area']).ravel() if t.get('area') is not None else wh[:, 0] * wh[:, 1]
        for b, (bw, bh), l, c, a in zip(boxes, wh, labels, crowd, area):
            if not 0 <= l < len(cat_of):
                raise ValueError(f'target label {l} of image {img_id} is outside 0..{len(cat_of) - 1}')
            anns.append({'id': len(anns) + 1, 'image_id': int(img_id), 'category_id': int(cat_of[l]),
                         'bbox': [float(b[0]), float(b[1]), float(bw), float(bh)], 'area': float(a),
                         'iscrowd': int(c)})
    return {'images': images, 'annotations': anns, 'categories': [{'id': int(c), 'name': str(c)} for c in cat_of]}


def coco_detections(preds: Sequence[dict], categories: Sequence[int] | None = None,
                    image_ids: Sequence[int] | None = None) -> list[dict]:
    """Predictions -> COCO results: ``{'image_id', 'category_id', 'bbox': [x, y, w, h], 'score'}`` per box."""
    ids = list(image_ids) if image_ids is not None else list(range(len(preds)))
    out = []
    for img_id, p in zip(ids, preds):
        boxes = _np(p['boxes'], shape=(-1, 4))
        for b, s, l in zip(boxes, _np(p['scores']).ravel(), _np(p['labels'], np.int64).ravel()):
            out.append({'image_id': int(img_id), 'category_id': int(categories[l] if categories is not None else l),
                        'bbox': [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])],
                        'score': float(s)})
    return out


def coco_map(preds: Sequence[dict], targets: Sequence[dict], num_classes: int | None = None,
             categories: Sequence[int] | None = None, backend: str = 'faster_coco_eval') -> dict[str, float]:
    """COCOeval's bbox numbers (``STATS``) for the predictions against the targets.

    Categories without ground truth do not enter the means (COCOeval's rule); a category with ground truth
    and no prediction counts as 0. No predictions at all gives 0 everywhere.
    """
    if backend not in BACKENDS:
        raise ValueError(f'unknown mAP backend {backend!r}; expected one of {", ".join(BACKENDS)}')
    if len(preds) != len(targets):
        raise ValueError(f'{len(preds)} predictions but {len(targets)} targets (one dict per image each)')
    gt = coco_ground_truth(targets, num_classes, categories)
    dets = coco_detections(preds, categories)
    if not dets or not gt['annotations']:
        return dict.fromkeys(STATS, 0.0)
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet):  # both libraries print their progress
        if backend == 'faster_coco_eval':
            from faster_coco_eval import COCO, COCOeval_faster
            coco_gt = COCO(gt)
            ev = COCOeval_faster(coco_gt, coco_gt.loadRes(dets), 'bbox', print_function=lambda *a, **k: None)
        else:
            from pycocotools.coco import COCO
            from pycocotools.cocoeval import COCOeval
            coco_gt = COCO()
            coco_gt.dataset = gt
            coco_gt.createIndex()
            ev = COCOeval(coco_gt, coco_gt.loadRes(dets), 'bbox')
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    # as COCOeval reports them: -1 where an area range holds no ground truth
    return {k: float(v) for k, v in zip(STATS, ev.stats)}
