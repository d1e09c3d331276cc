"""Semantic segmentation as a Lightning system: the step logic around any ``task='segmentation'`` model.

The model is a :class:`zoo.segmentation.Segmenter` whose head owns the loss and the prediction (``semfpn_seg``,
``upernet_seg`` on any ``features_only`` backbone): training calls ``model.head.loss(raw, masks)`` (cross-entropy,
255 ignored, ``class_weight``, UperNet's auxiliary head at 0.4); evaluation ``model.logits(x)`` (whole image or
sliding windows, the model's ``test_mode``), the same ``model.head.loss`` on those logits (so ``class_weight``
counts in either mode), and ``model.head.decode(logits, targets)``: the logits resized back to each image's file
(bilinear, mmseg's ``resize`` before its metric) and the argmax. The metric scores these file-pixel masks against
the files' own ground truth (``target['file_mask']``), so the mIoU of data whose images are not S x S (ADE20K,
VOC) is the one mmseg and detectron2 report, not the mIoU at the network's resized input.

The metric is :class:`SegmentationMetric`: mmseg's ``mIoU`` / ``mAcc`` / ``aAcc`` over the whole split, from one
confusion matrix of every labelled pixel (intersections and unions summed over the images before dividing; a class
absent from both prediction and ground truth is left out of the mean, one absent from the ground truth only counts
as IoU 0). torchmetrics' ``MeanIoU`` averages per-image IoUs and has no ignore value, so it is not this definition;
the metric is torchmetrics' ``MulticlassConfusionMatrix`` with these ratios read off it. Logged: ``val/miou`` (the
task's primary metric), ``val/macc``, ``val/aacc`` (fractions in [0, 1]); the test also logs ``test/iou_<class>``.

After each validation a PNG grid of a few validation images goes to ``<run>/val_predictions/``: the image, the
ground truth and the prediction overlaid at the network's input size (``torchvision.utils.draw_segmentation_masks``,
the data's palette; :class:`zoo.recipes.dense.DenseSystem` writes it).
``zoo predict`` writes, per test image, the predicted label PNG at the file's size with the palette
(``predictions/<name>.png``) and the image with the ground truth beside the prediction (``overlays/<name>.png``)
(:class:`SegmentationWriter`); for ``--images DIR`` the overlay is the prediction alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics.classification import MulticlassConfusionMatrix

from . import optim
from .dense import DenseSystem, DenseWriter

__all__ = ['Segmentation', 'SegmentationMetric', 'SegmentationWriter', 'overlay']

IGNORE_INDEX = 255


class SegmentationMetric(MulticlassConfusionMatrix):
    """mIoU, per-class IoU, pixel accuracy and mean accuracy over everything ``update`` saw (mmseg's definitions).

    ``update(preds, target)``: class ids (or logits with a class dimension) and ground truth of any shape; pixels
    equal to ``ignore_index`` are not counted. ``compute()`` returns ``{'miou', 'macc', 'aacc', 'iou', 'acc'}``:
    ``iou[k] = TP_k / (TP_k + FP_k + FN_k)`` and ``acc[k] = TP_k / (TP_k + FN_k)`` from the split's confusion matrix
    (NaN for a class with no pixel in either / in the ground truth), ``miou`` and ``macc`` their NaN-ignoring means,
    ``aacc`` the fraction of labelled pixels predicted right.
    """

    def __init__(self, num_classes: int, ignore_index: int = IGNORE_INDEX, **kwargs):
        super().__init__(num_classes, ignore_index=ignore_index, validate_args=False, **kwargs)

    def compute(self) -> dict:
        cm = super().compute().double()  # (target, prediction)
        tp, label, pred = cm.diag(), cm.sum(1), cm.sum(0)
        union = label + pred - tp
        nan = torch.tensor(float('nan'), dtype=cm.dtype, device=cm.device)
        iou = torch.where(union > 0, tp / union.clamp(min=1), nan)
        acc = torch.where(label > 0, tp / label.clamp(min=1), nan)
        total = label.sum()
        return {'miou': iou.nanmean(), 'macc': acc.nanmean(), 'aacc': tp.sum() / total if total > 0 else nan,
                'iou': iou, 'acc': acc}


def overlay(image: torch.Tensor, mask: torch.Tensor, palette, alpha: float = 0.5) -> torch.Tensor:
    """uint8 (3, H, W) image with the classes of ``mask`` (H, W) painted in ``palette`` colours (255: not painted)."""
    from torchvision.utils import draw_segmentation_masks
    classes = [int(c) for c in torch.unique(mask) if int(c) != IGNORE_INDEX]
    if not classes:
        return image
    masks = torch.stack([mask == c for c in classes])
    colours = [tuple(int(v) for v in palette[c % len(palette)]) for c in classes]
    return draw_segmentation_masks(image, masks, alpha=alpha, colors=colours)


def _to_uint8(x: torch.Tensor, mean, std) -> torch.Tensor:
    """A normalised (3, H, W) float image back to uint8."""
    m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
    return ((x.float().cpu() * s + m).clamp(0, 1) * 255).round().to(torch.uint8)


class Segmentation(DenseSystem):
    """Train, validate, test and predict with any registered segmenter.

    Args:
        name: a registered segmentation model (``semfpn_seg``, ``upernet_seg``, ``semfpn_poolformer_s12``, ...);
            ``model_args`` go to ``zoo.create`` (``{'backbone': 'resnet18'}``, ``{'test_mode': 'slide',
            'crop_size': 512, 'stride': 341}``).
        plot_images: how many validation images the per-validation PNG grid shows (0: none).
        Everything else: :class:`ZooSystem` (default AdamW lr 2e-4, weight decay 1e-4, PoolFormer's ADE20K
        setting; warm-up-free poly schedule, power 0.9).
    """

    task = 'segmentation'
    ema_warmup = True  # with ``ema_decay``: timm's warm-up of the decay, so a short from-scratch run's EMA does not
    # hold the initial weights for its first ~1/(1-decay) steps (the CPU recipe evaluates the EMA after a few hundred)
    grid_columns = 3  # one image per row: image, truth, prediction

    def __init__(self, name: str = 'semfpn_seg', plot_images: int = 4,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=2e-4, weight_decay=1e-4),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupPoly(opt, power=0.9),
                 **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        self.num_classes = self.model.num_classes
        ignore = getattr(self.model.head, 'ignore_index', IGNORE_INDEX)
        self.val_metric, self.test_metric = (SegmentationMetric(self.num_classes, ignore) for _ in range(2))

    def training_step(self, batch, batch_idx):
        x, masks = batch
        loss, parts = self.model.head.loss(self.model.forward_raw(x), masks)
        self.log_train(loss, **{f'{k}_loss': v for k, v in parts.items()})
        return loss

    # -- the task's part of DenseSystem's evaluation -------------------------------------------------------
    def infer(self, model, x, targets):
        logits = model.logits(x)  # (B, nc, S, S): whole image or sliding windows, the model's test_mode
        loss, _ = model.head.loss([logits], targets)  # the training loss (class_weight, ignore) in either mode
        return loss, model.head.decode(logits, targets), logits  # one {'mask': (H_i, W_i)} per file

    def update_metric(self, metric, predictions, targets) -> None:
        # every image's pixels at its file's size, flattened: one update for the batch
        metric.update(torch.cat([p['mask'].reshape(-1) for p in predictions]),
                      torch.cat([t['file_mask'].to(predictions[0]['mask'].device).reshape(-1) for t in targets]))

    def metric_rows(self, split: str, stats: dict) -> list[tuple[str, float, bool]]:
        rows = [(k, stats[k], k == 'miou') for k in ('miou', 'macc', 'aacc')]
        if split == 'test':
            names = getattr(self.trainer.datamodule, 'names', None) or [str(i) for i in range(self.num_classes)]
            rows += [(f'iou_{name}', v, False) for name, v in zip(names, stats['iou'].tolist())
                     if v == v]  # classes absent from the split have no IoU
        return rows

    def plot_sample(self, model, x, targets, logits, n: int):
        masks = torch.stack([t['mask'] for t in targets[:n]])  # (n, S, S): the grid draws in input pixels
        return x[:n].cpu(), masks.cpu(), logits[:n].argmax(1).cpu()

    def grid_tiles(self, sample) -> list[torch.Tensor]:
        mean, std, palette = self._data()
        tiles = []
        for img, gt, pred in zip(*sample):
            img = _to_uint8(img, mean, std)
            tiles += [img, overlay(img, gt, palette), overlay(img, pred, palette)]
        return tiles

    def _data(self):
        dm = getattr(self.trainer, 'datamodule', None)
        from zoo.datasets.segmentation import voc_palette
        return (getattr(dm, 'mean', (0.0,) * 3), getattr(dm, 'std', (1.0,) * 3),
                getattr(dm, 'palette', None) or voc_palette(self.num_classes))

    # -- prediction ----------------------------------------------------------------------------------------
    def keep_prediction(self, prediction: dict) -> dict:
        # one byte a pixel while the whole split waits for the writer (class ids and 255 fit in uint8)
        mask = prediction['mask']
        return {'mask': mask.to(torch.uint8 if self.num_classes <= 255 else torch.int32).cpu()}

    def prediction_writer(self, run_dir: Path) -> DenseWriter:
        return SegmentationWriter(run_dir)


class SegmentationWriter(DenseWriter):
    """``zoo predict`` for segmentation: per test image its predicted classes at the file's size (the head's
    prediction in file pixels) as a palette PNG (``predictions/<name>.png``, pixel value = class id, the data's
    colours) and the file's image with the ground truth beside the prediction (``overlays/<name>.png``). For
    ``--images DIR`` (no ground truth) the overlay is the prediction on the image, both named by the file (``<path
    below DIR>.png``)."""

    def default_name(self, index: int, meta: dict) -> str:
        return f'{Path(str(self.dataset.meta(index).get("name") or f"{index:06d}")).stem}.png'

    def write(self, index: int, name: str, prediction: dict, meta: dict) -> None:
        from PIL import Image
        from torchvision.io import write_png

        palette = getattr(self.datamodule, 'palette', None)
        image, truth = self.dataset.original(index)
        mask = prediction['mask']
        png = Image.fromarray(mask.to(torch.uint8).numpy(), mode='P')
        if palette:
            flat = [int(v) for colour in palette for v in colour]
            png.putpalette(flat + [0] * (768 - len(flat)))
        png.save(self.path('predictions', name))
        colours = palette or [(255, 0, 0)]
        shown = overlay(image, mask.long(), colours)
        if self.files is None:  # (3, H, 2W): ground truth | prediction
            shown = torch.cat([overlay(image, truth, colours), shown], -1)
        write_png(shown, str(self.path('overlays', name)))

    def summary(self, n: int) -> str:
        labels, overlays = self.run_dir / 'predictions', self.run_dir / 'overlays'
        return (f'zoo predict: {n} label PNGs (class ids, palette) in {labels}, '
                f'{"the prediction on each image" if self.files is not None else "ground truth | prediction"} in '
                f'{overlays}')
