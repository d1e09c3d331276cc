"""Object detection as a Lightning system: the step logic around any ``task='detection'`` model.

The model is a :class:`zoo.dense.DenseModel` whose head owns the loss and the prediction (``yolo_det`` on any
``features_only`` backbone, ``mamba_yolo_*``): training calls ``model.head.loss(maps, targets)``; evaluation
``model.head.predict(maps, targets)``, which decodes, runs NMS (conf 0.001, IoU 0.7, 300 detections, as
YOLOv8 validates) and maps boxes back to each file's pixels with the letterbox metadata the data wrote.
COCO mAP is torchmetrics' ``MeanAveragePrecision`` with faster-coco-eval (equal to pycocotools, crowd regions
and COCO's annotation areas included; ``tests/test_detection_eval.py``), logged as ``val/map``
(mAP@[.5:.95]), ``val/map50`` and ``val/map75``. Optimizer, schedule and EMA: :class:`ZooSystem`.

After each validation a PNG grid of a few validation images is written to ``<run>/val_predictions/``:
ground truth (green) beside the predictions (class colours, score above ``plot_conf``). ``zoo predict``
writes each test image, as its file, with its boxes (``predictions/<image_id>.png``) and ``predictions.json``
in COCO results format (:class:`DetectionWriter`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from tqdm import tqdm  # its write() prints above a running progress bar, not glued to its line

from . import optim
from .system import ZooSystem

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


class Detection(ZooSystem):
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
        Everything else: :class:`ZooSystem` (default AdamW lr 2e-3, weight decay 5e-4, betas (0.937, 0.999);
        warm-up 1 epoch, cosine to 2e-5).
    """

    task = 'detection'
    ema_warmup = True

    def __init__(self, name: str = 'yolo_det', conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
                 plot_images: int = 8, plot_conf: float = 0.25, predict_conf: float = 0.25,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=2e-3, weight_decay=5e-4,
                                                                                 betas=(0.937, 0.999)),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(opt, warmup_epochs=1.0,
                                                                                               min_lr=2e-5),
                 **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        self.num_classes = self.model.num_classes
        for split in ('val', 'test'):  # torchmetrics gathers every process's images itself
            setattr(self, f'{split}_map', coco_metric())
        self._plot_batch = None

    # -- steps -------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, targets = batch
        loss, parts = self.model.head.loss(self.model.forward_raw(x), targets)
        self.log_train(loss / len(x), **{f'{k}_loss': v for k, v in parts.items()})
        return loss

    def _evaluate(self, batch, split: str, batch_idx: int):
        x, targets = batch
        model = self.eval_model
        model.eval()
        maps = model.forward_raw(x)
        loss, _ = model.head.loss(maps, targets)
        self.log(f'{split}/loss', loss / len(x), on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        hp = self.hparams
        dets = model.head.predict(maps, targets, conf=hp.conf, iou=hp.iou, max_det=hp.max_det)  # file pixels
        # in float64, as COCOeval reads a results file: float32 widths move IoUs at a threshold now and then
        getattr(self, f'{split}_map').update([{**d, 'boxes': d['boxes'].double()} for d in dets],
                                             _file_targets(targets))
        if split == 'val' and batch_idx == 0 and hp.plot_images > 0:
            n = min(hp.plot_images, len(x))
            shown = model.head.predict([m[:n] for m in maps], conf=hp.conf, iou=hp.iou, max_det=hp.max_det)
            self._plot_batch = (x[:n].cpu(), [{k: v.cpu() for k, v in d.items()} for d in shown],  # input pixels
                                [{'boxes': t['boxes'].as_subclass(torch.Tensor).cpu(), 'labels': t['labels'].cpu()}
                                 for t in targets[:n]])

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, 'val', batch_idx)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, 'test', batch_idx)

    def _log_map(self, split: str) -> None:
        metric = getattr(self, f'{split}_map')
        if not metric.detection_box:  # no batch this epoch
            return
        stats = metric.compute()
        metric.reset()
        for ours, theirs in (('map', 'map'), ('map50', 'map_50'), ('map75', 'map_75')):
            self.log(f'{split}/{ours}', float(stats[theirs]), prog_bar=ours != 'map75')

    def on_validation_epoch_end(self) -> None:
        self._log_map('val')
        if self._plot_batch is not None and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self._save_grid()
        self._plot_batch = None

    def on_test_epoch_end(self) -> None:
        self._log_map('test')

    def _save_grid(self) -> None:
        """Ground truth beside predictions for the first validation images: <run>/val_predictions/epochN.png."""
        from torchvision.io import write_png
        from torchvision.utils import make_grid
        root = getattr(self.trainer, 'default_root_dir', None)
        if root is None:
            return
        x, dets, targets = self._plot_batch
        names = getattr(self.trainer.datamodule, 'names', None)
        tiles = []
        for img, d, t in zip(x, dets, targets):
            tiles.append(draw_predictions(img, t, names, width=1))
            tiles.append(draw_predictions(img, d, names, conf=self.hparams.plot_conf, width=1))
        grid = make_grid(tiles, nrow=4, padding=4, pad_value=255)  # pairs side by side: truth, prediction
        out = Path(root) / 'val_predictions'
        out.mkdir(parents=True, exist_ok=True)
        write_png(grid, str(out / f'epoch{self.current_epoch:03d}-step{self.global_step}.png'))

    # -- prediction --------------------------------------------------------------------------------------
    def predict_step(self, batch, batch_idx):
        x, targets = batch if isinstance(batch, (tuple, list)) else (batch, None)
        model = self.eval_model
        model.eval()
        dets = model(x, targets)  # eval mode: the head's predictions, in each file's pixels
        return {'detections': [{k: v.cpu() for k, v in d.items()} for d in dets],
                'targets': targets or [{} for _ in dets]}

    def prediction_writer(self, run_dir: Path) -> BasePredictionWriter:
        return DetectionWriter(run_dir, self.hparams.predict_conf, self.hparams.plot_conf)


class DetectionWriter(BasePredictionWriter):
    """``zoo predict`` for detection: every test image, as its file, with its boxes drawn (scores >= ``plot_conf``;
    ``predictions/<image_id>.png``) and ``predictions.json``, COCO results format (boxes in the file's pixels, the
    dataset's category ids, scores >= ``predict_conf``: 0.001 keeps every detection, up to ``max_det`` per image,
    as COCOeval wants). For ``--images DIR`` the pictures are named by their files (``predictions/<path below
    DIR>.png``) and each detection also names its ``file``."""

    def __init__(self, run_dir: str | Path, predict_conf: float = 0.25, plot_conf: float = 0.25):
        super().__init__(write_interval='epoch')
        self.run_dir, self.predict_conf, self.plot_conf = Path(run_dir), predict_conf, plot_conf

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        from torchvision.io import write_png

        from zoo.eval.detection import coco_detections

        if not trainer.is_global_zero:
            return
        out = self.run_dir / 'predictions'
        out.mkdir(parents=True, exist_ok=True)
        from .classification import predicted_dataset

        dm = trainer.datamodule
        names, categories = getattr(dm, 'names', None), getattr(dm, 'categories', None)
        dataset = predicted_dataset(trainer)
        files = getattr(dataset, 'image_files', None)
        results, n = [], 0
        for batch in predictions:
            for det, t in zip(batch['detections'], batch['targets']):
                image_id = int(t.get('image_id', n))
                if dataset is not None and 'index' in t:  # drawn on the file itself, not the letterboxed input
                    picture = draw_predictions(dataset.original(t['index']).float() / 255, det, names,
                                               conf=self.plot_conf)
                    target = out / (files.names[t['index']] if files is not None else f'{image_id:06d}.png')
                    target.parent.mkdir(parents=True, exist_ok=True)
                    write_png(picture, str(target))
                keep = det['scores'] >= self.predict_conf
                found = coco_detections([{k: v[keep] for k, v in det.items()}], categories, image_ids=[image_id])
                if files is not None:
                    found = [{**d, 'file': files.files[t['index']]} for d in found]
                results += found
                n += 1
        path = self.run_dir / 'predictions.json'
        path.write_text(json.dumps(results))
        tqdm.write(f'zoo predict: {n} images with their boxes in {out}, {len(results)} detections (score >= '
              f'{self.predict_conf}) in {path}')
