"""Random images and labels for smoke tests (seeded, so runs are reproducible)."""
from __future__ import annotations

import torch

from ._base import ImageDataModule, TransformTensorDataset


class FakeDataModule(ImageDataModule):
    """``num_samples`` standard-normal images per split with uniform random labels."""

    def __init__(self, batch_size: int = 8, num_workers: int = 0, img_size: int = 32, seed: int = 0,
                 num_samples: int = 64, num_classes: int = 10, in_chans: int = 3, **timm_augment):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed, **timm_augment)
        self._refuse_timm_augment('the fake data is standard-normal noise, not images')
        if num_classes < 1 or in_chans < 1 or num_samples < 1:
            raise ValueError('num_samples, num_classes and in_chans must be >= 1')
        self.num_samples, self.num_classes, self.in_chans = num_samples, num_classes, in_chans

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        g = torch.Generator().manual_seed(self.seed)
        splits = []
        for _ in range(3):
            x = torch.randn(self.num_samples, self.in_chans, self.img_size, self.img_size, generator=g)
            y = torch.randint(0, self.num_classes, (self.num_samples,), generator=g)
            splits.append(TransformTensorDataset(x, y))
        self.train_set, self.val_set, self.test_set = splits
        self._check_sizes()
