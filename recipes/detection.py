"""Object detection as a Lightning system: the step logic around any ``task='detection'`` model.

The model is a :class:`zoo.dense.DenseModel` whose head owns the loss and the prediction (``yolo_det`` on any
``features_only`` backbone, ``mamba_yolo_*``): training calls ``model.head.loss(maps, targets)``; evaluation
``model.head.predict(maps, targets)``, which decodes, runs NMS (conf 0.001, IoU 0.7, 300 detections, as
YOLOv8 validates) and maps boxes back to each file's pixels with the letterbox metadata the data wrote.
COCO mAP is torchmetrics' ``MeanAveragePrecision`` with faster-coco-eval (equal to pycocotools, crowd regions
and COCO's annotation areas included; ``tests/test_detection_eval.py``), logged as ``val/map``
(mAP@[.5:.95]), ``val/map50`` and ``val/map75``. Optimizer, schedule and EMA: :class:`ZooSystem`.

After each validation a PNG grid of a few validation images is written to ``<run>/val_predictions/``
(:class:`zoo.recipes.dense.DenseSystem`): ground truth beside the predictions (class colours, score above
``plot_conf``), in the network's input pixels. ``zoo predict``
writes each test image, as its file, with its boxes (``predictions/<image_id>.png``) and ``predictions.json``
in COCO results format (:class:`DetectionWriter`).

``distill: {teacher: DETECTOR, checkpoint: PATH, kind: logit | feature}`` distils a trained detector
(``recipes/distill.py``): ``logit``, its class scores per anchor as soft targets at a temperature (the same strides
and input size); ``feature``, one neck output of the student (``level``) through a 1x1-convolution adapter, matched
(MSE) to the teacher's at the same level. DeiT's ``hard`` labels are a classifier's.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from . import optim
from .dense import DenseSystem, DenseWriter
from .distill import Distill, Distiller, dense_forward

__all__ = ['Detection', 'DetectionWriter', 'coco_metric', 'draw_predictions']

# distinct colours for up to 20 classes, then they repeat
_PALETTE = ['#FF3838', '#2C99A8', '#FF9D97', '#FF701F', '#FFB21D', '#CFD231', '#48F90A', '#92CC17', '#3DDB86',
            '#1A9334', '#00D4BB', '#00C2FF', '#344593', '#6473FF', '#0018EC', '#8438FF', '#520085', '#CB38FF',
            '#FF95C8', '#FF37C7']


def draw_predictions(image: torch.Tensor, det: dict, names: list[str] | None = None, conf: float = 0.25,
                     width: int = 2) -> torch.Tensor:
    """A float [0, 1] (3, H, W) image with the boxes of ``det`` (score >= ``conf``) drawn -> uint8 (3, H, W)."""
    from torchvision.utils import draw_bounding_boxes
    img = (image.detach().float().clamp(0, 1) * 255).to(torch.uint8).cpu()
    keep = det['scores'] >= conf if 'scores' in det else torch.ones(len(det['labels']), dtype=torch.bool)
    boxes, labels = det['boxes'][keep].detach().float().cpu(), det['labels'][keep].cpu()
    if len(boxes) == 0:
        return img
    text = [names[int(l)] if names and int(l) < len(names) else str(int(l)) for l in labels]
    if 'scores' in det:
        text = [f'{t} {s:.2f}' for t, s in zip(text, det['scores'][keep].tolist())]
    return draw_bounding_boxes(img, boxes, text, colors=[_PALETTE[int(l) % len(_PALETTE)] for l in labels],
                               width=width)


def coco_metric(backend: str = 'faster_coco_eval'):
    """torchmetrics' ``MeanAveragePrecision`` set up to equal COCOeval: xyxy boxes, COCO's own float64 IoU and
    recall thresholds (``zoo.eval.detection``)."""
    from torchmetrics.detection import MeanAveragePrecision

    from zoo.eval.detection import IOU_THRESHOLDS, REC_THRESHOLDS

    metric = MeanAveragePrecision(box_format='xyxy', iou_type='bbox', backend=backend, iou_thresholds=IOU_THRESHOLDS,
                                  rec_thresholds=REC_THRESHOLDS)
    metric.warn_on_many_detections = False  # COCOeval's 100 per image, as intended (validation NMS keeps 300)
    return metric


def _file_targets(targets: list[dict]) -> list[dict]:
    """Ground truth as COCOeval on the annotation file sees it: every box in the file's pixels (float64), crowd
    flags and COCO's annotation areas (small / medium / large are areas in the file)."""
    out = []
    for t in targets:
        g = {'boxes': t['file_boxes'].double(), 'labels': t['labels'], 'iscrowd': t['iscrowd'].int()}
        if 'area' in t:
            g['area'] = t['area']
        out.append(g)
    return out


class Detection(DenseSystem):
    """Train, validate, test and predict with any registered detector.

    Args:
        name: a registered detection model (``yolo_det``, ``yolo_det_tiny``, ``mamba_yolo_t``, ...);
            ``model_args`` go to ``zoo.create`` (``{'backbone': 'resnet18', 'neck': 'xss_pafpn'}``); loss gains
            and NMS defaults are the head's (``model_args: {head_kwargs: {box_gain: 7.5}}``).
        conf, iou, max_det: NMS for validation and test (YOLOv8's validation: 0.001, 0.7, 300).
        plot_images: how many validation images the per-validation PNG grid shows (0: none).
        plot_conf: the score from which boxes are drawn (validation grids, ``zoo predict`` pictures).
        predict_conf: the score from which ``zoo predict`` keeps a detection in ``predictions.json`` (0.001:
            every detection, for COCOeval).
        distill: distillation from a trained detector (:class:`zoo.recipes.distill.Distill` with ``kind: logit``,
            the class scores, or ``feature``, whose ``level`` indexes the neck's outputs, ``-1`` the coarsest).
        Everything else: :class:`ZooSystem` (default AdamW lr 2e-3, weight decay 5e-4, betas (0.937, 0.999);
        warm-up 1 epoch, cosine to 2e-5).
    """

    task = 'detection'
    ema_warmup = True
    grid_columns = 4  # two images a row, each as a pair: truth, prediction

    def __init__(self, name: str = 'yolo_det', conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
                 plot_images: int = 8, plot_conf: float = 0.25, predict_conf: float = 0.25,
                 distill: Optional[Distill] = None,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=2e-3, weight_decay=5e-4,
                                                                                 betas=(0.937, 0.999)),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(opt, warmup_epochs=1.0,
                                                                                               min_lr=2e-5),
                 **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        self.num_classes = self.model.num_classes
        self.val_metric, self.test_metric = coco_metric(), coco_metric()
        self.distiller = None
        if distill is not None:
            self.distiller = Distiller(distill, self.model, self.sizes, self.task, dense_forward,
                                       kinds=('logit', 'feature'))
            self.hparams['distill'] = self.distiller.record()

    def training_step(self, batch, batch_idx):
        x, targets = batch
        if self.distiller is None:
            loss, parts = self.model.head.loss(self.model.forward_raw(x), targets)
            self.log_train(loss / len(x), **{f'{k}_loss': v for k, v in parts.items()})
            return loss
        maps, neck = self.distiller.student_outputs(self.model, x)
        task_loss, parts = self.model.head.loss(maps, targets)  # summed over the batch's images
        # the head's loss is a sum over images, the feature MSE a mean: the batch size puts them on one scale
        loss, kd = self.distiller.loss(task_loss / len(x), x, maps, neck)
        self.log_train(loss, **{f'{k}_loss': v for k, v in parts.items()}, kd_loss=kd)
        return loss * len(x)

    # -- the task's part of DenseSystem's evaluation -------------------------------------------------------
    def _nms(self) -> dict:
        return dict(conf=self.hparams.conf, iou=self.hparams.iou, max_det=self.hparams.max_det)

    def infer(self, model, x, targets):
        maps = model.forward_raw(x)
        loss, _ = model.head.loss(maps, targets)  # summed over the batch's images
        return loss / len(x), model.head.predict(maps, targets, **self._nms()), maps  # boxes in file pixels

    def update_metric(self, metric, predictions, targets) -> None:
        # in float64, as COCOeval reads a results file: float32 widths move IoUs at a threshold now and then
        metric.update([{**d, 'boxes': d['boxes'].double()} for d in predictions], _file_targets(targets))

    def metric_rows(self, split: str, stats: dict) -> list[tuple[str, float, bool]]:
        return [(ours, stats[theirs], ours != 'map75')
                for ours, theirs in (('map', 'map'), ('map50', 'map_50'), ('map75', 'map_75'))]

    def plot_sample(self, model, x, targets, maps, n: int):
        shown = model.head.predict([m[:n] for m in maps], **self._nms())  # no metadata: boxes in input pixels
        return (x[:n].cpu(), [{k: v.cpu() for k, v in d.items()} for d in shown],
                [{'boxes': t['boxes'].as_subclass(torch.Tensor).cpu(), 'labels': t['labels'].cpu()}
                 for t in targets[:n]])

    def grid_tiles(self, sample) -> list[torch.Tensor]:
        names = getattr(self.trainer.datamodule, 'names', None)
        tiles = []
        for img, det, truth in zip(*sample):
            tiles += [draw_predictions(img, truth, names, width=1),
                      draw_predictions(img, det, names, conf=self.hparams.plot_conf, width=1)]
        return tiles

    def prediction_writer(self, run_dir: Path) -> DenseWriter:
        return DetectionWriter(run_dir, self.hparams.predict_conf, self.hparams.plot_conf)


class DetectionWriter(DenseWriter):
    """``zoo predict`` for detection: every test image, as its file, with its boxes drawn (scores >= ``plot_conf``;
    ``predictions/<image_id>.png``) and ``predictions.json``, COCO results format (boxes in the file's pixels, the
    dataset's category ids, scores >= ``predict_conf``: 0.001 keeps every detection, up to ``max_det`` per image,
    as COCOeval wants). For ``--images DIR`` the pictures are named by their files (``predictions/<path below
    DIR>.png``) and each detection also names its ``file``."""

    def __init__(self, run_dir: str | Path, predict_conf: float = 0.25, plot_conf: float = 0.25):
        super().__init__(run_dir)
        self.predict_conf, self.plot_conf = predict_conf, plot_conf
        self.results: list[dict] = []

    def default_name(self, index: int, meta: dict) -> str:
        return f'{int(meta.get("image_id", index)):06d}.png'

    def write(self, index: int, name: str, prediction: dict, meta: dict) -> None:
        from torchvision.io import write_png

        from zoo.eval.detection import coco_detections

        names, categories = getattr(self.datamodule, 'names', None), getattr(self.datamodule, 'categories', None)
        if self.dataset is not None and 'index' in meta:  # drawn on the file itself, not the letterboxed input
            picture = draw_predictions(self.dataset.original(index).float() / 255, prediction, names,
                                       conf=self.plot_conf)
            write_png(picture, str(self.path('predictions', name)))
        keep = prediction['scores'] >= self.predict_conf
        found = coco_detections([{k: v[keep] for k, v in prediction.items()}], categories,
                                image_ids=[int(meta.get('image_id', index))])
        if self.files is not None:
            found = [{**d, 'file': self.files.files[index]} for d in found]
        self.results += found

    def summary(self, n: int) -> str:
        path = self.run_dir / 'predictions.json'
        path.write_text(json.dumps(self.results))
        out, found = self.run_dir / 'predictions', len(self.results)
        self.results = []
        return f'zoo predict: {n} images with their boxes in {out}, {found} detections (score >= ' \
               f'{self.predict_conf}) in {path}'
