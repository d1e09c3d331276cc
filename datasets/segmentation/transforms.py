"""Segmentation transforms (``torchvision.transforms.v2``, image and mask together): mmseg's training pipeline --
random resize within a ratio range, random crop with a cap on one class's share (``cat_max_ratio``), horizontal
flip, photometric distortion of the image only -- the evaluation resize, and the collate.

Geometric steps run on the uint8 image and the ``tv_tensors.Mask`` together; torchvision's kernels resample a
``Mask`` with nearest interpolation, so class ids stay class ids. Padding fills the image with the mean colour (0
once normalised, as mmseg's data preprocessor pads after normalising) and the mask with the ignore index.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ['IGNORE_INDEX', 'SegmentationAugment', 'NO_AUGMENT', 'RandomResizeRatio', 'CatMaxRandomCrop',
           'PhotoMetricDistortion', 'segmentation_transforms', 'collate']

IGNORE_INDEX = 255  # mmseg's, torchvision's VOC: pixels no loss or metric counts


def _fill(mean: Sequence[float], ignore_index: int) -> dict:
    """Padding values by type: the image's mean colour (uint8), the mask's ignore index."""
    return {tv_tensors.Image: [round(255 * m) for m in mean], tv_tensors.Mask: ignore_index}


class RandomResizeRatio(v2.Transform):
    """mmseg's ``RandomResize(scale=(long, short), ratio_range, keep_ratio=True)``: draw ``r`` in ``ratio_range`` and
    rescale, keeping the aspect ratio, to the largest size whose long side is at most ``long * r`` and short side at
    most ``short * r`` (mmcv's ``rescale_size``)."""

    def __init__(self, scale: tuple[int, int], ratio_range: tuple[float, float] = (0.5, 2.0)):
        super().__init__()
        self.scale, self.ratio_range = (max(scale), min(scale)), tuple(ratio_range)

    def make_params(self, flat_inputs: list) -> dict:
        h, w = v2.query_size(flat_inputs)
        r = float(torch.empty(()).uniform_(*self.ratio_range))
        long, short = int(self.scale[0] * r), int(self.scale[1] * r)  # mmseg's target scale, then mmcv's rescale
        f = min(long / max(h, w), short / min(h, w))
        return dict(size=[max(1, int(h * f + 0.5)), max(1, int(w * f + 0.5))])

    def transform(self, inpt, params: dict):
        return self._call_kernel(F.resize, inpt, params['size'], antialias=True)


class CatMaxRandomCrop(v2.Transform):
    """mmseg's ``RandomCrop(crop_size, cat_max_ratio)``: a random ``size`` x ``size`` window (the whole side where the
    image is smaller, then padded to ``size``); up to 10 windows are drawn until no single class covers
    ``cat_max_ratio`` or more of the window's labelled (not ignored) pixels and at least two classes are present.
    ``cat_max_ratio=1``, or an image no larger than the crop (one possible window), takes the first window without
    counting. (A ``bincount`` per try costs ~0.1 ms on a 256-px mask in one thread, as in a loader worker; counting
    all tries' windows at once from an integral image of the one-hot mask was measured slower, 3-17 ms.)"""

    def __init__(self, size: int, cat_max_ratio: float = 0.75, ignore_index: int = IGNORE_INDEX,
                 fill: dict | None = None, tries: int = 10):
        super().__init__()
        if not 0 < cat_max_ratio <= 1:
            raise ValueError(f'cat_max_ratio is a share in (0, 1], got {cat_max_ratio}')
        self.size, self.cat_max_ratio, self.ignore_index, self.tries = size, cat_max_ratio, ignore_index, tries
        self.fill = fill if fill is not None else {tv_tensors.Image: 0, tv_tensors.Mask: ignore_index}

    def _window(self, h: int, w: int) -> tuple[int, int]:
        top = int(torch.randint(max(h - self.size, 0) + 1, ()))
        left = int(torch.randint(max(w - self.size, 0) + 1, ()))
        return top, left

    def make_params(self, flat_inputs: list) -> dict:
        h, w = v2.query_size(flat_inputs)
        top, left = self._window(h, w)
        mask = next((x for x in flat_inputs if isinstance(x, tv_tensors.Mask)), None)
        if mask is not None and self.cat_max_ratio < 1 and (h > self.size or w > self.size):  # > 1 window
            mask = mask.as_subclass(torch.Tensor).reshape(h, w)  # a plain tensor: no tv_tensor dispatch per try
            for _ in range(self.tries - 1):
                window = mask[top:top + self.size, left:left + self.size].reshape(-1)
                counts = torch.bincount(window, minlength=self.ignore_index + 1)
                counts[self.ignore_index] = 0  # ignored pixels do not count
                counts = counts[counts > 0]
                if len(counts) > 1 and counts.max() < self.cat_max_ratio * counts.sum():
                    break
                top, left = self._window(h, w)
        ch, cw = min(h, self.size), min(w, self.size)
        return dict(top=top, left=left, h=ch, w=cw, pad=[0, 0, self.size - cw, self.size - ch])  # pad right, bottom

    def transform(self, inpt, params: dict):
        out = self._call_kernel(F.crop, inpt, params['top'], params['left'], params['h'], params['w'])
        if any(params['pad']):
            fill = self.fill[tv_tensors.Mask if isinstance(inpt, tv_tensors.Mask) else tv_tensors.Image]
            out = self._call_kernel(F.pad, out, params['pad'], fill=fill)
        return out


@dataclass(frozen=True)
class SegmentationAugment:
    """Training augmentation, mmseg's ADE20K / Cityscapes pipeline.

    Args:
        ratio_range: rescale factors drawn per image (:class:`RandomResizeRatio`); ``(1, 1)`` keeps the base scale.
        base_size: the short side at ratio 1 (the long side is capped at 4x it, as mmseg's (2048, 512));
            ``None``: the crop size ``img_size``.
        cat_max_ratio: the cap on one class's share of a crop (:class:`CatMaxRandomCrop`); 1 turns it off.
        flip: probability of a horizontal flip.
        photometric: probability of each of the brightness, contrast, saturation and hue changes
            (:class:`PhotoMetricDistortion`); the mask is untouched. 0 skips them.
        hue: the hue shift range, a fraction of the colour circle (mmseg's 18 of OpenCV's 180 = 0.1); 0 skips the hue
            change (the costliest on CPU).
    """
    ratio_range: tuple[float, float] = (0.5, 2.0)
    base_size: int | None = None
    cat_max_ratio: float = 0.75
    flip: float = 0.5
    photometric: float = 0.5
    hue: float = 0.1

    def __post_init__(self):
        if len(self.ratio_range) != 2 or not 0 < self.ratio_range[0] <= self.ratio_range[1]:
            raise ValueError(f'ratio_range is (low, high) with 0 < low <= high, got {self.ratio_range}')
        if not 0 < self.cat_max_ratio <= 1:
            raise ValueError(f'cat_max_ratio is a share in (0, 1], got {self.cat_max_ratio}')
        if not 0 <= self.flip <= 1 or not 0 <= self.photometric <= 1:
            raise ValueError(f'flip and photometric are probabilities in [0, 1], got {self.flip} and '
                             f'{self.photometric}')
        if not 0 <= self.hue <= 0.5:
            raise ValueError(f'hue is a fraction of the colour circle in [0, 0.5], got {self.hue}')
        if self.base_size is not None and self.base_size < 1:
            raise ValueError(f'base_size must be >= 1 (or None: img_size), got {self.base_size}')


NO_AUGMENT = SegmentationAugment(ratio_range=(1.0, 1.0), cat_max_ratio=1.0, flip=0.0, photometric=0.0, hue=0.0)


def segmentation_transforms(augment: SegmentationAugment | None, img_size: int, mean: Sequence[float],
                            std: Sequence[float], ignore_index: int = IGNORE_INDEX) -> Callable:
    """``(uint8 Image (3, H, W), Mask (H, W) int64) -> (float image (3, S, S) normalised, Mask (S, S) int64)``.

    Training (``augment`` given, :data:`NO_AUGMENT` for none): random resize, crop with the class cap (padded to
    ``img_size``), flip, photometric distortion of the image. Evaluation (``augment=None``): the whole image resized
    to ``img_size`` x ``img_size`` (a fixed size so batches stack; the file's own mask stays with the dataset,
    ``SegmentationDataset.original``).
    """
    fill = _fill(mean, ignore_index)
    if augment is None:
        steps = [v2.Resize([img_size, img_size], antialias=True)]
    else:
        base = augment.base_size or img_size
        steps = []
        if tuple(augment.ratio_range) != (1.0, 1.0) or augment.base_size not in (None, img_size):
            steps.append(RandomResizeRatio((4 * base, base), augment.ratio_range))
        steps.append(CatMaxRandomCrop(img_size, augment.cat_max_ratio, ignore_index, fill))
        if augment.flip > 0:
            steps.append(v2.RandomHorizontalFlip(augment.flip))
        if augment.photometric > 0:
            steps.append(PhotoMetricDistortion(augment.hue, augment.photometric))
    steps += [v2.ToDtype({tv_tensors.Image: torch.float32, 'others': None}, scale=True), v2.Normalize(mean, std)]
    return v2.Compose(steps)


class PhotoMetricDistortion(v2.RandomPhotometricDistort):
    """mmseg's ``PhotoMetricDistortion``: ``v2.RandomPhotometricDistort`` (brightness, contrast before or after,
    saturation, hue; each with probability ``p``) without SSD's channel permutation, which mmseg leaves out;
    ``hue=0`` skips the hue change. Images only: masks pass through. One difference: torchvision scales the
    brightness by 0.875-1.125 where mmseg adds up to +-32 grey levels (the same change for a mid-grey pixel)."""

    def __init__(self, hue: float = 0.1, p: float = 0.5):
        super().__init__(hue=(-hue, hue), p=p)
        self.skip_hue = hue == 0

    def make_params(self, flat_inputs: list) -> dict:
        params = super().make_params(flat_inputs)
        params['channel_permutation'] = None
        if self.skip_hue:
            params['hue_factor'] = None
        return params


def collate(batch: Sequence[tuple]) -> tuple[torch.Tensor, torch.Tensor | list[dict]]:
    """``[(image (3, S, S), mask (S, S))]`` -> ``(images (B, 3, S, S) float, masks (B, S, S) int64)``, plain tensors;
    evaluation samples ``[(image, target dict)]`` -> ``(images, [target dict])``, one per image (its metadata and
    the file's mask differ in size from image to image), each ``mask`` a plain int64 tensor."""
    images, targets = zip(*batch)
    images = torch.stack([i.as_subclass(torch.Tensor) for i in images])
    if isinstance(targets[0], dict):
        return images, [{**t, 'mask': t['mask'].as_subclass(torch.Tensor).long()} for t in targets]
    return images, torch.stack([m.as_subclass(torch.Tensor) for m in targets]).long()
