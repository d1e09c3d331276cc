"""Semantic segmentation as a Lightning system: the step logic around any ``task='segmentation'`` model.

The model is a :class:`zoo.segmentation.Segmenter` whose head owns the loss and the prediction (``semfpn_seg``,
``upernet_seg`` on any ``features_only`` backbone): training calls ``model.head.loss(raw, masks)`` (cross-entropy,
255 ignored, UperNet's auxiliary head at 0.4); evaluation ``model.logits(x)`` (whole image or sliding windows, the
model's ``test_mode``) and the argmax.

The metric is :class:`SegmentationMetric`: mmseg's ``mIoU`` / ``mAcc`` / ``aAcc`` over the whole split, from one
confusion matrix of every labelled pixel (intersections and unions summed over the images before dividing; a class
absent from both prediction and ground truth is left out of the mean, one absent from the ground truth only counts
as IoU 0). torchmetrics' ``MeanIoU`` averages per-image IoUs and has no ignore value, so it is not this definition;
the metric is torchmetrics' ``MulticlassConfusionMatrix`` with these ratios read off it. Logged: ``val/miou`` (the
task's primary metric), ``val/macc``, ``val/aacc`` (fractions in [0, 1]); the test also logs ``test/iou_<class>``.

After each validation a PNG grid of a few validation images goes to ``<run>/val_predictions/``: the image, the
ground truth and the prediction overlaid (``torchvision.utils.draw_segmentation_masks``, the data's palette).
``zoo predict`` writes, per test image, the predicted label PNG at the file's size with the palette
(``predictions/<name>.png``) and the image with the ground truth beside the prediction (``overlays/<name>.png``)
(:class:`SegmentationWriter`); for ``--images DIR`` the overlay is the prediction alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torchmetrics.classification import MulticlassConfusionMatrix
from tqdm import tqdm  # its write() prints above a running progress bar, not glued to its line

from . import optim
from .system import ZooSystem

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


class Segmentation(ZooSystem):
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

    def __init__(self, name: str = 'semfpn_seg', plot_images: int = 4,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=2e-4, weight_decay=1e-4),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupPoly(opt, power=0.9),
                 **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        self.num_classes = self.model.num_classes
        ignore = getattr(self.model.head, 'ignore_index', IGNORE_INDEX)
        for split in ('val', 'test'):
            setattr(self, f'{split}_metric', SegmentationMetric(self.num_classes, ignore))
        self._plot_batch = None

    # -- steps -------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, masks = batch
        loss, parts = self.model.head.loss(self.model.forward_raw(x), masks)
        self.log_train(loss, **{f'{k}_loss': v for k, v in parts.items()})
        return loss

    def _evaluate(self, batch, split: str, batch_idx: int):
        x, masks = batch
        model = self.eval_model
        model.eval()
        masks = masks.as_subclass(torch.Tensor)
        if model.test_mode == 'whole':  # one forward for the loss and the prediction
            raw = model.forward_raw(x)
            loss, _ = model.head.loss(raw, masks)
            logits = model.head.logits(raw, x.shape[-2:])
        else:
            logits = model.logits(x)
            loss = torch.nn.functional.cross_entropy(logits, masks, ignore_index=model.head.ignore_index)
        self.log(f'{split}/loss', loss, on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        pred = logits.argmax(1)
        getattr(self, f'{split}_metric').update(pred, masks)
        if split == 'val' and batch_idx == 0 and self.hparams.plot_images > 0:
            n = min(self.hparams.plot_images, len(x))
            self._plot_batch = (x[:n].cpu(), masks[:n].cpu(), pred[:n].cpu())

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, 'val', batch_idx)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, 'test', batch_idx)

    def _log_metric(self, split: str) -> None:
        metric = getattr(self, f'{split}_metric')
        if not metric.update_called:  # no batch this epoch
            return
        stats = metric.compute()
        metric.reset()
        for k in ('miou', 'macc', 'aacc'):
            self.log(f'{split}/{k}', float(stats[k]), prog_bar=k == 'miou')
        if split == 'test':
            names = getattr(self.trainer.datamodule, 'names', None) or [str(i) for i in range(self.num_classes)]
            for name, v in zip(names, stats['iou'].tolist()):
                if v == v:  # classes absent from the split have no IoU
                    self.log(f'test/iou_{name}', v)

    def on_validation_epoch_end(self) -> None:
        self._log_metric('val')
        if self._plot_batch is not None and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self._save_grid()
        self._plot_batch = None

    def on_test_epoch_end(self) -> None:
        self._log_metric('test')

    def _data(self):
        dm = getattr(self.trainer, 'datamodule', None)
        from zoo.datasets.segmentation import voc_palette
        return (getattr(dm, 'mean', (0.0,) * 3), getattr(dm, 'std', (1.0,) * 3),
                getattr(dm, 'palette', None) or voc_palette(self.num_classes))

    def _save_grid(self) -> None:
        """Image, ground truth and prediction for the first validation images: <run>/val_predictions/epochN.png."""
        from torchvision.io import write_png
        from torchvision.utils import make_grid
        root = getattr(self.trainer, 'default_root_dir', None)
        if root is None:
            return
        mean, std, palette = self._data()
        tiles = []
        for img, gt, pred in zip(*self._plot_batch):
            img = _to_uint8(img, mean, std)
            tiles += [img, overlay(img, gt, palette), overlay(img, pred, palette)]
        grid = make_grid(tiles, nrow=3, padding=4, pad_value=255)  # one image per row: image, truth, prediction
        out = Path(root) / 'val_predictions'
        out.mkdir(parents=True, exist_ok=True)
        write_png(grid, str(out / f'epoch{self.current_epoch:03d}-step{self.global_step}.png'))

    # -- prediction --------------------------------------------------------------------------------------
    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        model = self.eval_model
        model.eval()
        return model.logits(x).cpu()  # (B, nc, S, S): the writer resizes to each file before the argmax

    def prediction_writer(self, run_dir: Path) -> BasePredictionWriter:
        return SegmentationWriter(run_dir)


class SegmentationWriter(BasePredictionWriter):
    """``zoo predict`` for segmentation: per test image its predicted classes at the file's size as a palette PNG
    (``predictions/<name>.png``, pixel value = class id, the data's colours) and the file's image with the ground
    truth beside the prediction (``overlays/<name>.png``). For ``--images DIR`` (no ground truth) the overlay is
    the prediction on the image, both named by the file (``<path below DIR>.png``)."""

    def __init__(self, run_dir: str | Path):
        super().__init__(write_interval='epoch')
        self.run_dir = Path(run_dir)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        from PIL import Image
        from torchvision.io import write_png

        from zoo.layers.segment import SegHead

        if not trainer.is_global_zero:
            return
        labels_dir, overlays_dir = self.run_dir / 'predictions', self.run_dir / 'overlays'
        labels_dir.mkdir(parents=True, exist_ok=True)
        overlays_dir.mkdir(parents=True, exist_ok=True)
        from .classification import predicted_dataset

        dm = trainer.datamodule
        dataset = predicted_dataset(trainer)
        files = getattr(dataset, 'image_files', None)
        palette = getattr(dm, 'palette', None)
        flat = [int(v) for colour in palette for v in colour] if palette else None
        n = 0
        for logits in predictions:
            for lg in logits:
                image, truth = dataset.original(n)
                mask = SegHead.decode(lg[None], [{'orig_size': tuple(truth.shape)}])[0]['mask'].to(torch.uint8)
                name = files.names[n] if files is not None else \
                    f'{Path(str(dataset.meta(n).get("name") or f"{n:06d}")).stem}.png'
                (labels_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (overlays_dir / name).parent.mkdir(parents=True, exist_ok=True)
                png = Image.fromarray(mask.numpy(), mode='P')
                if flat:
                    png.putpalette(flat + [0] * (768 - len(flat)))
                png.save(labels_dir / name)
                colours = palette or [(255, 0, 0)]
                shown = overlay(image, mask.long(), colours)
                if files is None:  # (3, H, 2W): ground truth | prediction
                    shown = torch.cat([overlay(image, truth, colours), shown], -1)
                write_png(shown, str(overlays_dir / name))
                n += 1
        tqdm.write(f'zoo predict: {n} label PNGs (class ids, palette) in {labels_dir}, '
                   f'{"the prediction on each image" if files is not None else "ground truth | prediction"} in '
                   f'{overlays_dir}')
