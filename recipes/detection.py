"""Object detection as a Lightning system: YOLOv8's loss and NMS around any ``task='detection'`` model.

The model comes from ``zoo.create`` (``yolo_det`` on any features_only backbone, or a family's own detector);
the loss is :class:`zoo.detection.DetectionLoss` (task-aligned assigner, BCE, CIoU, DFL); validation runs
NMS (``torchvision.ops.batched_nms``; conf 0.001, IoU 0.7, 300 detections, as YOLOv8 validates) and COCO
mAP through :mod:`zoo.eval.detection` (faster-coco-eval), logged as ``val/map`` (mAP@[.5:.95]), ``val/map50``
and ``val/map75``. Training: AdamW or SGD (no weight decay on norms and biases), linear warm-up then cosine,
an EMA of the weights (evaluated instead of the raw weights) and the Trainer's gradient clipping.

After each validation a PNG grid of a few validation images is written to ``<run>/val_predictions/``:
ground truth (green) beside the predictions (class colours, score above ``plot_conf``).
``zoo predict`` writes ``<run>/predictions/`` with every test image file and its boxes drawn, and
``predictions.json`` in COCO results format (boxes in the original image's pixels).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch import LightningModule

import zoo
from zoo.datasets.detection import to_file_pixels, unletterbox
from zoo.detection import DetectionLoss, postprocess
from zoo.eval.detection import MeanAveragePrecision, coco_detections

from . import optim
from .classification import block_choices, require_task
from .ema import WeightEMA

__all__ = ['Detection', 'draw_predictions']

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


class Detection(WeightEMA, LightningModule):
    """Train, validate, test and predict with any registered detector.

    Args:
        name: a registered detection model (``yolo_det``, ``yolo_det_tiny``, ...).
        model_args: extra arguments for ``zoo.create`` (``{'backbone': 'resnet18'}``).
        num_classes, img_size: set from the DataModule by ``zoo fit`` when left out (``img_size`` goes to models
            whose weights depend on the input size, and nowhere else).
        checkpoint: weights to start from.
        optimizer: ``adamw`` or ``sgd`` (Nesterov momentum); norms and biases get no weight decay.
        lr, weight_decay, momentum, warmup_epochs, min_lr: the schedule (linear warm-up, then cosine).
        ema_decay: EMA of the weights (with timm's warm-up of the decay); ``None`` turns it off.
        box_gain, cls_gain, dfl_gain: loss gains (YOLOv8: 7.5, 0.5, 1.5).
        conf, iou, max_det: NMS settings for validation and test (YOLOv8's validation: 0.001, 0.7, 300).
        map_backend: ``faster_coco_eval`` or ``pycocotools`` (same numbers; the first is faster).
        plot_images: how many validation images the per-validation PNG grid shows (0: none).
        plot_conf: the score from which boxes are drawn (validation grids, ``zoo predict`` pictures).
        predict_conf: the score from which ``zoo predict`` keeps a detection in ``predictions.json`` (0.001:
            every detection, for COCOeval).
    """

    monitor, monitor_mode = 'val/map', 'max'
    task = 'detection'

    def __init__(self, name: str = 'yolo_det', model_args: dict | None = None, num_classes: int | None = None,
                 in_chans: int | None = None, img_size: int | None = None, checkpoint: str | None = None,
                 optimizer: Literal['adamw', 'sgd'] = 'adamw', lr: float = 2e-3, weight_decay: float = 5e-4,
                 momentum: float = 0.937, warmup_epochs: float = 1.0, min_lr: float = 2e-5,
                 ema_decay: float | None = 0.9999, box_gain: float = 7.5, cls_gain: float = 0.5,
                 dfl_gain: float = 1.5, conf: float = 0.001, iou: float = 0.7, max_det: int = 300,
                 map_backend: Literal['faster_coco_eval', 'pycocotools'] = 'faster_coco_eval', plot_images: int = 8,
                 plot_conf: float = 0.25, predict_conf: float = 0.25):
        super().__init__()
        if optimizer not in ('adamw', 'sgd'):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        require_task(name, 'detection', 'Detection')
        self.save_hyperparameters()
        self.model_name = name
        args = dict(model_args or {})
        # the data's image size reaches models whose weights depend on it (yolo_det on Strip-MLP, ...)
        self.model = zoo.create_with_optional(name, dict(img_size=img_size), num_classes=num_classes, in_chans=in_chans,
                                          checkpoint=checkpoint, **args)
        # the backbone is the block a detection comparison varies: record it (and its own block choices)
        self.block_choices = {**block_choices(args.get('backbone_kwargs')), **block_choices(args)}
        if getattr(self.model, 'backbone_name', None):
            self.block_choices['backbone'] = self.model.backbone_name
        self.num_classes = self.model.num_classes
        self.criterion = DetectionLoss(self.model.head, box=box_gain, cls=cls_gain, dfl=dfl_gain)
        self.init_ema(ema_decay, use_warmup=True)
        self.val_map = MeanAveragePrecision(self.num_classes, map_backend)
        self.test_map = MeanAveragePrecision(self.num_classes, map_backend)
        self._plot_batch = None

    def forward(self, x: torch.Tensor):
        return self.model(x)

    def _names(self) -> list[str] | None:
        dm = getattr(self.trainer, 'datamodule', None) if self._trainer is not None else None
        return getattr(dm, 'names', None)

    # -- steps -------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, targets = batch
        loss, items = self.criterion(self.model(x), targets)
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0 or self.trainer.is_last_batch:
            self.log('train/loss', loss / len(x), on_step=True, on_epoch=False, prog_bar=True)
            for k, v in items.items():
                self.log(f'train/{k}_loss', v, on_step=True, on_epoch=False)
        if not torch.isfinite(loss):
            raise FloatingPointError(f'{self.model_name}: the training loss became {loss.item()} at step '
                                     f'{self.global_step}; stopped (lower --model.lr or set '
                                     f'--trainer.gradient_clip_val). Checkpoints saved before this are intact.')
        return loss

    def _evaluate(self, batch, split: str, batch_idx: int):
        x, targets = batch
        model = self.eval_model
        model.eval()
        y, maps = model(x)
        loss, _ = self.criterion(maps, targets)
        self.log(f'{split}/loss', loss / len(x), on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        hp = self.hparams
        dets = postprocess(y, conf=hp.conf, iou=hp.iou, max_det=hp.max_det)
        getattr(self, f'{split}_map').update(*to_file_pixels(dets, targets))  # COCO's size ranges: file pixels
        if split == 'val' and batch_idx == 0 and hp.plot_images > 0:
            n = min(hp.plot_images, len(x))
            self._plot_batch = (x[:n].cpu(), [{k: v.cpu() for k, v in d.items()} for d in dets[:n]],
                                [{'boxes': t['boxes'].as_subclass(torch.Tensor).cpu(), 'labels': t['labels'].cpu()}
                                 for t in targets[:n]])

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, 'val', batch_idx)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, 'test', batch_idx)

    def _gathered(self, metric: MeanAveragePrecision) -> MeanAveragePrecision:
        """All processes' predictions in one accumulator (COCOeval needs every image at once)."""
        if self.trainer.world_size == 1:
            return metric
        import torch.distributed as dist
        parts = [None] * self.trainer.world_size
        dist.all_gather_object(parts, (metric.preds, metric.targets))
        out = MeanAveragePrecision(metric.num_classes, metric.backend)
        for preds, targets in parts:
            out.preds += preds
            out.targets += targets
        return out

    def _log_map(self, split: str) -> None:
        metric = getattr(self, f'{split}_map')
        if len(metric) == 0:
            return
        stats = self._gathered(metric).compute()
        metric.reset()
        for k in ('map', 'map50', 'map75'):
            self.log(f'{split}/{k}', stats[k], prog_bar=k != 'map75', sync_dist=False)

    def on_validation_epoch_end(self) -> None:
        self._log_map('val')
        if self._plot_batch is not None and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self._save_grid()
        self._plot_batch = None

    def on_test_epoch_end(self) -> None:
        self._log_map('test')

    def _run_dir(self) -> Path | None:
        root = getattr(self.trainer, 'log_dir', None) or getattr(self.trainer, 'default_root_dir', None)
        return Path(root) if root else None

    def _save_grid(self) -> None:
        """Ground truth beside predictions for the first validation images: <run>/val_predictions/epochN.png."""
        from torchvision.io import write_png
        from torchvision.utils import make_grid
        root = self._run_dir()
        if root is None:
            return
        x, dets, targets = self._plot_batch
        names = self._names()
        tiles = []
        for img, d, t in zip(x, dets, targets):
            tiles.append(draw_predictions(img, t, names, width=1))
            tiles.append(draw_predictions(img, d, names, conf=self.hparams.plot_conf, width=1))
        grid = make_grid(tiles, nrow=4, padding=4, pad_value=255)  # pairs side by side: truth, prediction
        out = root / 'val_predictions'
        out.mkdir(parents=True, exist_ok=True)
        write_png(grid, str(out / f'epoch{self.current_epoch:03d}-step{self.global_step}.png'))

    # -- prediction --------------------------------------------------------------------------------
    def predict_step(self, batch, batch_idx):
        x, targets = batch if isinstance(batch, (tuple, list)) else (batch, None)
        model = self.eval_model
        model.eval()
        y, _ = model(x)
        dets = postprocess(y, conf=self.hparams.predict_conf, iou=self.hparams.iou, max_det=self.hparams.max_det)
        return {'images': x.cpu(), 'detections': [{k: v.cpu() for k, v in d.items()} for d in dets],
                'targets': targets}

    def write_predictions(self, outputs: list[dict], run_dir: Path) -> Path:
        """``zoo predict``: every test image, as its file, with its boxes drawn (``predictions/<image_id>.png``,
        scores >= ``plot_conf``), and ``predictions.json`` in COCO results format (boxes in the file's pixels,
        the dataset's category ids; scores >= ``predict_conf``: ``--model.predict_conf 0.001`` keeps every
        detection, up to ``max_det`` per image, as COCOeval wants)."""
        from torchvision.io import write_png

        out = Path(run_dir) / 'predictions'
        out.mkdir(parents=True, exist_ok=True)
        dm = getattr(self.trainer, 'datamodule', None)
        names, categories = getattr(dm, 'names', None), getattr(dm, 'categories', None)
        dataset = getattr(dm, 'test_set', None)
        results, n = [], 0
        for batch in outputs:
            targets = batch['targets'] or [{} for _ in batch['detections']]
            for img, det, t in zip(batch['images'], batch['detections'], targets):
                image_id = int(t.get('image_id', n))
                orig = {**det, 'boxes': unletterbox(det['boxes'].float(), t)}
                if dataset is not None and 'index' in t:  # drawn on the file itself, not the letterboxed input
                    picture = draw_predictions(dataset.original(t['index']).float() / 255, orig, names,
                                               conf=self.hparams.plot_conf)
                else:
                    picture = draw_predictions(img, det, names, conf=self.hparams.plot_conf)
                write_png(picture, str(out / f'{image_id:06d}.png'))
                results += coco_detections([orig], categories, image_ids=[image_id])
                n += 1
        path = Path(run_dir) / 'predictions.json'
        path.write_text(json.dumps(results))
        print(f'zoo predict: {n} images with their boxes in {out}, {len(results)} detections (score >= '
              f'{self.hparams.predict_conf}) in {path}')
        return path

    # -- optimisation ------------------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        return optim.param_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self):
        hp = self.hparams
        groups = self.param_groups()
        if hp.optimizer == 'sgd':
            opt = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum, nesterov=True)
        else:
            opt = torch.optim.AdamW(groups, lr=hp.lr, betas=(hp.momentum, 0.999))
        return {'optimizer': opt, 'lr_scheduler': optim.epoch_schedule(opt, self.trainer, hp.warmup_epochs, hp.lr,
                                                                        hp.min_lr)}
