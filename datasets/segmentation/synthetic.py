"""Procedural segmentation data, deterministic by seed, drawn with ``shapes_det``'s and ``digits_det``'s code
(:mod:`zoo.datasets.detection.synthetic`): ``shapes_seg`` (overlapping shapes on textured backgrounds, class =
shape kind + 1) and ``digits_seg`` (scikit-learn's real digits on canvases, class = digit + 1); class 0 is the
background. Later objects are drawn over earlier ones and the mask says what is visible."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..detection.synthetic import INK, digit_patch, load_digits, paste, shape_colour, shape_mask, texture
from ..shapes import SHAPES

__all__ = ['draw_shapes_seg', 'generate_shapes_seg', 'draw_digits_seg', 'generate_digits_seg']


def _centre(rng: np.random.Generator, size: int, r: float) -> tuple[float, float]:
    """A centre keeping a shape of half-size ``r`` inside the image (overlap with others allowed)."""
    lo, hi = min(r, size / 2), max(size - r, size / 2)
    cy, cx = rng.uniform(lo, hi, 2)
    return float(cy), float(cx)


def draw_shapes_seg(size: int, rng: np.random.Generator, num_shapes: int = len(SHAPES), max_objects: int = 6,
                    min_px: int = 24, max_px: int = 112):
    """One image of 1..max_objects shapes of ``min_px``..``max_px`` pixels, free to overlap, on a textured background:
    ``(image (S, S, 3) uint8, mask (S, S) int64)``, mask = 0 on the background and 1 + shape index on each shape's
    visible pixels."""
    img = texture(rng, size)
    mask = np.zeros((size, size), np.int64)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(num_shapes))
        r = rng.uniform(min_px, min(max_px, size)) / 2
        cy, cx = _centre(rng, size, r)
        fg = shape_colour(rng)
        pixels = shape_mask(SHAPES[cls], size, cy, cx, r, rng)
        img[pixels] = fg
        mask[pixels] = cls + 1
    return np.clip(img, 0, 255).astype(np.uint8), mask


def draw_digits_seg(size: int, rng: np.random.Generator, src: torch.Tensor, targets: np.ndarray, pool: np.ndarray,
                    max_objects: int = 6, min_px: int = 24, max_px: int = 112):
    """One canvas with 1..max_objects digits of ``src[pool]`` (bilinear upscaling, alpha = ink), free to overlap:
    ``(image (S, S, 3) uint8, mask (S, S) int64)``, mask = 1 + digit on its ink (upscaled value > 0.25), 0
    elsewhere."""
    img = texture(rng, size)
    mask = np.zeros((size, size), np.int64)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        k = int(pool[rng.integers(len(pool))])
        side = int(rng.uniform(min_px, min(max_px, size)))
        cy, cx = _centre(rng, size, side / 2)
        y0, x0 = int(cy - side / 2), int(cx - side / 2)
        patch = digit_patch(src[k], side)
        paste(img, patch, y0, x0, rng.uniform(170, 256, 3))
        ink = patch[:size - y0, :size - x0] > INK
        mask[y0:y0 + ink.shape[0], x0:x0 + ink.shape[1]][ink] = int(targets[k]) + 1
    return np.clip(img, 0, 255).astype(np.uint8), mask


def _stack(samples: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.from_numpy(np.stack([s[0] for s in samples])).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    return images, torch.from_numpy(np.stack([s[1] for s in samples]))


def generate_shapes_seg(num_samples: int, size: int = 256, num_shapes: int = len(SHAPES), seed: int = 0,
                        max_objects: int = 6, min_px: int = 24, max_px: int = 112):
    """``(images (N, 3, S, S) uint8, masks (N, S, S) int64)``; image ``i`` from ``default_rng([seed, i])``."""
    if not 1 <= num_shapes <= len(SHAPES):
        raise ValueError(f'num_shapes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), got {num_shapes}')
    return _stack([draw_shapes_seg(size, np.random.default_rng([seed, i]), num_shapes, max_objects, min_px, max_px)
                   for i in range(num_samples)])


def generate_digits_seg(num_samples: int, size: int = 256, seed: int = 0, max_objects: int = 6, min_px: int = 24,
                        max_px: int = 112, digit_indices: Sequence[int] | None = None):
    """Like :func:`generate_shapes_seg` with scikit-learn's digits (classes 1..10 = digits 0..9);
    ``digit_indices`` restricts the source digits (to keep training and evaluation drawings apart)."""
    src, targets = load_digits()
    pool = np.asarray(digit_indices if digit_indices is not None else np.arange(len(targets)))
    return _stack([draw_digits_seg(size, np.random.default_rng([seed, i]), src, targets, pool, max_objects, min_px,
                                   max_px) for i in range(num_samples)])
