"""Procedural detection data: shapes on textured backgrounds (``shapes_det``) and scikit-learn's real digits on
larger canvases (``digits_det``), deterministic by seed; each sample is drawn on first use and kept."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..shapes import SHAPES, _polygon

__all__ = ['texture', 'shape_colour', 'shape_mask', 'digit_patch', 'paste', 'draw_shapes_det', 'generate_shapes_det',
           'draw_digits_det', 'generate_digits_det', 'load_digits', 'Drawn']


def texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A dark textured background: a colour gradient, low-frequency blobs and pixel noise, (S, S, 3) float.

    Built from 1-d profiles (a Gaussian blob is the outer product of two, a plane wave the sum of two such
    products), so no per-pixel ``exp`` or ``sin`` is evaluated; the random draws are those of the per-pixel form,
    in the same order, and the image equals it up to float rounding."""
    t = np.arange(size) / size  # the pixel grid's coordinates along one axis, in [0, 1)
    base = rng.uniform(0, 90, 3)
    grad = rng.uniform(-40, 40, (2, 3))
    blobs = []
    for _ in range(3):  # soft blobs
        cy, cx, r = rng.uniform(0, 1, 2).tolist() + [rng.uniform(0.1, 0.4)]
        blobs.append((cy, cx, r, rng.uniform(-30, 30, 3)))
    cy, cx, r, colour = (np.array(v) for v in zip(*blobs))  # (3,) (3,) (3,) (3, 3): one row per blob
    gy = np.exp(-(t[None] - cy[:, None]) ** 2 / (2 * r[:, None] ** 2))  # (blob, S) vertical profiles
    gx = np.exp(-(t[None] - cx[:, None]) ** 2 / (2 * r[:, None] ** 2))  # (blob, S) horizontal profiles
    img = np.einsum('ky,kx,kc->yxc', gy, gx, colour)  # sum over blobs of gy (x) gx times the blob's colour
    img += base + t[None, :, None] * grad[0] + t[:, None, None] * grad[1]
    img += rng.normal(0, rng.uniform(3, 15), (size, size, 1))
    if rng.random() < 0.5:  # stripes: sin(u + v) = sin u cos v + cos u sin v, u along x and v along y
        f, a = rng.uniform(4, 20), rng.uniform(0, math.pi)
        u, v = 2 * math.pi * f * t * math.cos(a), 2 * math.pi * f * t * math.sin(a)
        img += (8 * (np.outer(np.cos(v), np.sin(u)) + np.outer(np.sin(v), np.cos(u))))[..., None]
    return img


def _place(rng, size: int, r: float, taken: list, tries: int = 30):
    """A centre for a shape of half-size ``r`` that keeps it inside and clear of the boxes already placed."""
    for _ in range(tries):
        cy, cx = rng.uniform(r, size - r, 2)
        box = (cx - r, cy - r, cx + r, cy + r)
        if all(box[2] + 2 < t[0] or t[2] + 2 < box[0] or box[3] + 2 < t[1] or t[3] + 2 < box[1] for t in taken):
            return cy, cx
    return None


def shape_colour(rng: np.random.Generator) -> np.ndarray:
    """A bright random colour (one channel high), (3,) float."""
    fg = rng.uniform(120, 256, 3)
    fg[rng.integers(3)] = rng.uniform(200, 256)
    return fg


def shape_mask(shape: str, size: int, cy: float, cx: float, r: float, rng: np.random.Generator) -> np.ndarray:
    """The (S, S) bool pixels of one ``shape`` of half-size ``r`` centred at (cy, cx), clipped to the image; polygons
    take a random rotation from ``rng``."""
    from skimage.draw import disk, polygon
    mask = np.zeros((size, size), bool)
    if shape in ('circle', 'ring'):
        rr, cc = disk((cy, cx), r, shape=mask.shape)
        mask[rr, cc] = True
        if shape == 'ring':  # hollow: the inner 55 % of the radius is background
            rr, cc = disk((cy, cx), 0.55 * r, shape=mask.shape)
            mask[rr, cc] = False
    else:
        rr, cc = polygon(*_polygon(shape, cy, cx, r, rng.uniform(0, 2 * math.pi)), shape=mask.shape)
        mask[rr, cc] = True
    return mask


def draw_shapes_det(size: int, rng: np.random.Generator, num_classes: int = len(SHAPES), max_objects: int = 6,
                    min_px: int = 12, max_px: int = 80):
    """One image with 1..max_objects non-overlapping shapes: (S, S, 3) uint8, boxes (n, 4) xyxy, labels (n,).

    Boxes are the tight extent of each shape's drawn pixels."""
    img = texture(rng, size)
    boxes, labels, taken = [], [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(num_classes))
        r = rng.uniform(min_px, min(max_px, size)) / 2
        c = _place(rng, size, r, taken)
        if c is None:
            continue
        cy, cx = c
        fg = shape_colour(rng)
        mask = shape_mask(SHAPES[cls], size, cy, cx, r, rng)
        ys, xs = np.nonzero(mask)
        if len(ys) == 0:
            continue
        img[mask] = fg
        box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        taken.append(box)
        boxes.append(box)
        labels.append(cls)
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels, np.int64)


def generate_shapes_det(num_samples: int, size: int = 256, num_classes: int = len(SHAPES), seed: int = 0,
                        max_objects: int = 6, min_px: int = 12, max_px: int = 80):
    """``(images (N, 3, S, S) uint8, [boxes (n_i, 4)], [labels (n_i,)])``; image ``i`` from
    ``default_rng([seed, i])``."""
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), got {num_classes}')
    out = [draw_shapes_det(size, np.random.default_rng([seed, i]), num_classes, max_objects, min_px, max_px)
           for i in range(num_samples)]
    return _stack(out)


def load_digits() -> tuple[torch.Tensor, np.ndarray]:
    """scikit-learn's 1,797 handwritten digits: images (1797, 8, 8) in [0, 1] and their labels."""
    from sklearn import datasets
    digits = datasets.load_digits()
    return torch.as_tensor(digits.images, dtype=torch.float32) / 16.0, digits.target  # (1797, 8, 8) in [0, 1]


INK = 0.25  # a digit's pixels (of its upscaled [0, 1] intensity) that count as ink: its box, its mask


def digit_patch(digit: torch.Tensor, side: int) -> np.ndarray:
    """An (8, 8) [0, 1] digit upscaled (bilinear) to (side, side), clamped to [0, 1]."""
    patch = torch.nn.functional.interpolate(digit[None, None], size=(side, side), mode='bilinear',
                                            align_corners=False)[0, 0]  # (1, 1, 8, 8) -> (side, side)
    return patch.clamp(0, 1).numpy()


def paste(img: np.ndarray, patch: np.ndarray, y0: int, x0: int, colour: np.ndarray) -> None:
    """Blend ``colour`` into ``img`` (H, W, 3) at (y0, x0) with ``patch`` as alpha (clipped to the image)."""
    region = img[y0:y0 + patch.shape[0], x0:x0 + patch.shape[1]]
    alpha = patch[:region.shape[0], :region.shape[1], None]
    region[:] = region * (1 - alpha) + colour * alpha


def draw_digits_det(size: int, rng: np.random.Generator, src: torch.Tensor, targets: np.ndarray, pool: np.ndarray,
                    max_objects: int = 6, min_px: int = 12, max_px: int = 80):
    """One canvas with 1..max_objects digits of ``src[pool]`` pasted (bilinear upscaling, alpha = ink).

    Returns like :func:`draw_shapes_det`; boxes are the tight extent of each digit's ink (value > 0.25)."""
    img = texture(rng, size)
    boxes, labels, taken = [], [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        k = int(pool[rng.integers(len(pool))])
        side = int(rng.uniform(min_px, min(max_px, size)))
        c = _place(rng, size, side / 2, taken)
        if c is None:
            continue
        y0, x0 = int(c[0] - side / 2), int(c[1] - side / 2)
        patch = digit_patch(src[k], side)
        ink = patch > INK
        if not ink.any():
            continue
        paste(img, patch, y0, x0, rng.uniform(170, 256, 3))
        ys, xs = np.nonzero(ink)
        boxes.append((float(x0 + xs.min()), float(y0 + ys.min()), float(x0 + xs.max() + 1), float(y0 + ys.max() + 1)))
        taken.append((x0, y0, x0 + side, y0 + side))
        labels.append(int(targets[k]))
    return np.clip(img, 0, 255).astype(np.uint8), np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels,
                                                                                                          np.int64)


def generate_digits_det(num_samples: int, size: int = 256, seed: int = 0, max_objects: int = 6, min_px: int = 12,
                        max_px: int = 80, digit_indices: Sequence[int] | None = None):
    """Real 8x8 digits (scikit-learn) pasted at random non-overlapping positions and scales on noisy canvases.

    Returns like :func:`generate_shapes_det`. ``digit_indices`` restricts the source digits (to keep training
    and evaluation digits apart).
    """
    src, targets = load_digits()
    pool = np.asarray(digit_indices if digit_indices is not None else np.arange(len(targets)))
    return _stack([draw_digits_det(size, np.random.default_rng([seed, i]), src, targets, pool, max_objects, min_px,
                                   max_px) for i in range(num_samples)])


def _stack(samples: list[tuple]):
    images = torch.from_numpy(np.stack([o[0] for o in samples])).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    return images, [o[1] for o in samples], [o[2] for o in samples]


class Drawn:
    """A procedural sample drawn on first use and kept (generation is as costly as a training step): ``draw``
    returns an (H, W, 3) uint8 image and its annotations; the image is returned as (3, H, W)."""

    def __init__(self, draw: Callable, seed: tuple, **kwargs):
        self.draw, self.seed, self.kwargs, self.value = draw, seed, kwargs, None

    def __call__(self) -> tuple:
        if self.value is None:
            img, *annotations = self.draw(rng=np.random.default_rng(list(self.seed)), **self.kwargs)
            self.value = (torch.from_numpy(img).permute(2, 0, 1).contiguous(), *annotations)  # HWC -> CHW
        return self.value
