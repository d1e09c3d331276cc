"""Procedurally generated images of coloured geometric shapes; the class is the shape.

Each image is drawn from its own generator seeded by ``(seed, index)``, so a dataset is the same on
every machine and any sample can be regenerated alone. Shape, colour, size, position and rotation
vary; the background is a random dark colour, the shape a random bright one.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ._base import ImageDataModule, TransformTensorDataset, split_indices
from .augment import OnPIL

# Chosen to stay distinguishable at 16-32 pixels (pentagons and hexagons look like circles there).
SHAPES = ('circle', 'triangle', 'square', 'star', 'cross', 'ring')


def _polygon(shape: str, cy: float, cx: float, r: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    if shape == 'star':  # 5 outer points alternating with inner ones at 0.45 r
        k = np.arange(10)
        radius = np.where(k % 2 == 0, r, 0.45 * r)
        theta = angle + k * math.pi / 5
    elif shape == 'cross':  # a plus sign with arms 0.6 r wide: 12 corners
        a = 0.3 * r
        ys = np.array([-r, -r, -a, -a, a, a, r, r, a, a, -a, -a])
        xs = np.array([-a, a, a, r, r, a, a, -a, -a, -r, -r, -a])
        c, s_ = math.cos(angle), math.sin(angle)
        return cy + c * ys - s_ * xs, cx + s_ * ys + c * xs
    else:
        sides = {'triangle': 3, 'square': 4}[shape]
        radius = r
        theta = angle + np.arange(sides) * 2 * math.pi / sides
    return cy + radius * np.sin(theta), cx + radius * np.cos(theta)


def draw_shape(shape: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One (size, size, 3) uint8 image holding one ``shape``."""
    from skimage.draw import disk, polygon

    bg = rng.integers(0, 96, 3)  # a dark background and a bright shape, both of random colour
    fg = rng.integers(0, 256, 3)
    fg[rng.integers(0, 3)] = rng.integers(200, 256)
    img = np.empty((size, size, 3), np.uint8)
    img[:] = bg
    r = rng.uniform(0.28, 0.45) * size
    cy, cx = rng.uniform(r, size - r, 2) if size > 2 * r else (size / 2, size / 2)
    if shape in ('circle', 'ring'):
        rr, cc = disk((cy, cx), r, shape=img.shape[:2])
        img[rr, cc] = fg
        if shape == 'ring':  # hollow: the inner half of the radius back to the background
            rr, cc = disk((cy, cx), 0.55 * r, shape=img.shape[:2])
            img[rr, cc] = bg
        return img
    else:
        rr, cc = polygon(*_polygon(shape, cy, cx, r, rng.uniform(0, 2 * math.pi)), shape=img.shape[:2])
    img[rr, cc] = fg
    return img


def generate_shapes(num_samples: int, size: int = 32, num_classes: int = len(SHAPES), seed: int = 0):
    """``(images, labels)``: a (N, 3, size, size) uint8 tensor and a (N,) long tensor, deterministic by seed.

    Labels cycle through the classes (balanced); sample ``i`` is drawn with ``default_rng([seed, i])``.
    """
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), got {num_classes}')
    labels = torch.arange(num_samples) % num_classes
    images = np.stack([draw_shape(SHAPES[int(y)], size, np.random.default_rng([seed, i]))
                       for i, y in enumerate(labels)])
    return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), labels  # (N, H, W, 3) -> (N, 3, H, W)


class ShapesDataModule(ImageDataModule):
    """``num_samples`` generated shape images, split seeded into train/val/test, scaled to [-1, 1].

    No training augmentation unless a recipe names timm's (``zoo.datasets.augment``): then each training image
    goes through timm's transform as a PIL image, normalised with mean = std = 0.5 (the same [-1, 1] scale).
    """

    in_chans = 3
    mean, std = 0.5, 0.5  # _to_input's [-1, 1]

    def __init__(self, batch_size: int = 64, num_workers: int = 0, img_size: int = 32, seed: int = 0,
                 num_samples: int = 3000, num_classes: int = len(SHAPES), val_fraction: float = 0.2,
                 test_fraction: float = 0.1, data_seed: int = 0, **timm_augment):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed, **timm_augment)
        if self.timm_augment.crop_pct is not None:
            raise ValueError('ShapesDataModule: crop_pct cannot apply: the shapes are drawn at img_size for '
                             'evaluation (crop_pct is for CIFAR and image folders)')
        if not 1 <= num_classes <= len(SHAPES):
            raise ValueError(f'num_classes must be between 1 and {len(SHAPES)}, got {num_classes}')
        split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now
        self.num_samples, self.num_classes, self.data_seed = num_samples, num_classes, data_seed
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.names = list(SHAPES[:num_classes])

    @staticmethod
    def _to_input(images: torch.Tensor) -> torch.Tensor:
        """uint8 images -> floats in [-1, 1]."""
        return images.float() / 127.5 - 1.0

    def eval_transform(self):
        """An image file (uint8 RGB (3, H, W), any size) -> the test split's input: resized to ``img_size`` square
        (the size the test images are drawn at), then :meth:`_to_input` (``zoo predict --images``)."""
        from torchvision.transforms.v2.functional import resize
        return lambda image: self._to_input(resize(image, [self.img_size, self.img_size], antialias=True))

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        images, y = generate_shapes(self.num_samples, self.img_size, self.num_classes, self.data_seed)
        x = self._to_input(images)
        train, val, test = split_indices(len(x), (self.val_fraction, self.test_fraction), self.data_seed)
        if self.timm_augment.train:
            # x / 127.5 - 1 is Normalize(mean=0.5, std=0.5) of x / 255, what timm's transform ends with
            transform = self.timm_augment.train_transform((0.5,) * 3, (0.5,) * 3, self.img_size)
            self.train_set = TransformTensorDataset(images[train], y[train], OnPIL(transform))
        else:
            self.train_set = TransformTensorDataset(x[train], y[train])
        self.val_set = TransformTensorDataset(x[val], y[val])
        self.test_set = TransformTensorDataset(x[test], y[test])
        self._check_sizes()
