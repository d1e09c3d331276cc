"""Detection transforms: the letterbox, YOLO-style training augmentation (``torchvision.transforms.v2``, boxes
follow every geometric step) and the collate that keeps one target dict per image."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ['PAD_VALUE', 'DetectionAugment', 'NO_AUGMENT', 'letterbox', 'RandomScaleTranslate', 'detection_transforms', 'collate']

PAD_VALUE = 114  # letterbox grey (0-255), YOLO's


def letterbox(image, target: dict, size: int):
    """Resize the longer side to ``size`` keeping the aspect ratio, pad (centred, grey) to ``size`` x ``size``.

    Boxes follow (``torchvision.transforms.v2.functional``); ``target`` gets ``scale`` and ``pad`` (left, top).
    """
    h, w = image.shape[-2:]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    left, top = (size - nw) // 2, (size - nh) // 2
    padding = [left, top, size - nw - left, size - nh - top]
    boxes = target['boxes']
    if (nh, nw) != (h, w):
        image, boxes = F.resize(image, [nh, nw], antialias=True), F.resize(boxes, [nh, nw])
    if any(padding):
        image, boxes = F.pad(image, padding, fill=PAD_VALUE), F.pad(boxes, padding)
    return image, {**target, 'boxes': boxes, 'scale': (nw / w, nh / h), 'pad': (left, top)}


class RandomScaleTranslate(v2.Transform):
    """Zoom by a factor in ``scale`` and shift by up to ``translate`` of the side, keeping the canvas size.

    YOLOv8's scale / translate augmentation without the affine warp: one resize, then a pad (grey) and a
    crop, which the boxes follow exactly (``v2.functional`` kernels). Several times cheaper on CPU than
    ``v2.RandomAffine``'s grid sampling for the same effect.
    """

    def __init__(self, scale: Sequence[float] = (0.5, 1.5), translate: float = 0.1, fill: int = PAD_VALUE):
        super().__init__()
        self.scale, self.translate, self.fill = tuple(scale), translate, fill

    def make_params(self, flat_inputs: list) -> dict:
        h, w = v2.query_size(flat_inputs)
        s = float(torch.empty(()).uniform_(*self.scale))
        nh, nw = max(1, round(h * s)), max(1, round(w * s))
        dy, dx = (torch.rand(2) * 2 - 1).mul(self.translate).tolist()
        top, left = round((nh - h) / 2 - dy * h), round((nw - w) / 2 - dx * w)  # crop origin in the resized image
        pad = [max(0, -left), max(0, -top), max(0, left + w - nw), max(0, top + h - nh)]
        return dict(size=[nh, nw], pad=pad, top=top + pad[1], left=left + pad[0], h=h, w=w)

    def transform(self, inpt, params: dict):
        out = self._call_kernel(F.resize, inpt, params['size'], antialias=True)
        if any(params['pad']):
            out = self._call_kernel(F.pad, out, params['pad'], fill=self.fill)
        return self._call_kernel(F.crop, out, params['top'], params['left'], params['h'], params['w'])


@dataclass(frozen=True)
class DetectionAugment:
    """Training augmentation, YOLOv8's kinds (boxes follow every geometric step).

    Args:
        mosaic: probability of a 4-image mosaic per training sample (four letterboxed images in a 2x2 canvas, a
            random crop of the input size).
        flip: probability of a horizontal flip.
        scale, translate: :class:`RandomScaleTranslate` (zoom range, shift as a fraction of the side).
        hsv: colour jitter gains (hue, saturation, value, as YOLOv8's hsv gains; hue costs ~30 ms per 256 px
            image on CPU, 0 skips it).
    """
    mosaic: float = 0.0
    flip: float = 0.5
    scale: tuple[float, float] = (0.5, 1.5)
    translate: float = 0.1
    hsv: tuple[float, float, float] = (0.015, 0.7, 0.4)

    def __post_init__(self):
        if not 0 <= self.mosaic <= 1 or not 0 <= self.flip <= 1:
            raise ValueError(f'mosaic and flip are probabilities in [0, 1], got {self.mosaic} and {self.flip}')
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1]:
            raise ValueError(f'scale is a zoom range (low, high) with 0 < low <= high, got {self.scale}')
        if len(self.hsv) != 3:
            raise ValueError(f'hsv is (hue, saturation, value) gains, got {self.hsv}')


NO_AUGMENT = DetectionAugment(mosaic=0.0, flip=0.0, scale=(1.0, 1.0), translate=0.0, hsv=(0.0, 0.0, 0.0))


def detection_transforms(augment: DetectionAugment | None, min_size: float = 2.0) -> Callable:
    """The v2 pipeline after letterboxing: (uint8 image, target) -> (float image in [0, 1], target).

    Training (``augment`` given, :data:`NO_AUGMENT` for none; the mosaic is the dataset's): flip,
    scale/translate, colour jitter, then boxes clamped and those smaller than ``min_size`` pixels dropped.
    ``augment=None``: evaluation, only the conversion to float; no box is dropped (a tiny object still counts
    as a miss).
    """
    if augment is None:
        return v2.ToDtype(torch.float32, scale=True)
    steps = []
    if augment.flip > 0:
        steps.append(v2.RandomHorizontalFlip(augment.flip))
    if tuple(augment.scale) != (1.0, 1.0) or augment.translate > 0:
        steps.append(RandomScaleTranslate(augment.scale, augment.translate))
    hue, sat, val = augment.hsv
    if any(augment.hsv):
        steps.append(v2.ColorJitter(brightness=val or None, saturation=sat or None, hue=hue or None))
    steps += [v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(min_size=min_size, labels_getter=_per_box),
              v2.ToDtype(torch.float32, scale=True)]
    return v2.Compose(steps)


def _per_box(inputs) -> tuple[torch.Tensor, ...]:
    """The per-box tensors of an ``(image, target)`` pair that must be dropped with their boxes."""
    target = inputs[1]
    return tuple(target[k] for k in ('labels', 'iscrowd', 'area') if k in target)


def collate(batch: Sequence[tuple]) -> tuple[torch.Tensor, list[dict]]:
    """Stack the images (B, 3, S, S); keep one target dict per image (any number of boxes)."""
    images, targets = zip(*batch)
    return torch.stack([torch.as_tensor(i) for i in images]), list(targets)
