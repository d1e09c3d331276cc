"""The common DataModule for image classification: seeded splits, loaders, the size attributes."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler


class DatasetNotFoundError(FileNotFoundError):
    """Data missing or unreadable; the message names the expected path and how to obtain the data."""


def split_indices(n: int, fractions: tuple[float, ...], seed: int) -> list[torch.Tensor]:
    """A seeded permutation of ``range(n)`` cut into ``len(fractions) + 1`` parts (the last takes the rest)."""
    if any(f < 0 for f in fractions) or sum(fractions) >= 1:
        raise ValueError(f'split fractions {fractions} must be >= 0 and sum to less than 1')
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sizes = [round(f * n) for f in fractions]
    parts, start = [], 0
    for size in sizes:
        parts.append(perm[start:start + size])
        start += size
    parts.append(perm[start:])
    return parts[-1:] + parts[:-1]  # (rest = train, then the held-out parts in order)


class EpochShuffle(Sampler[int]):
    """A permutation of ``range(n)`` that depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch`` before every training epoch, so a run resumed from an end-of-epoch
    checkpoint sees the same batch order as an uninterrupted one (a generator that is only seeded once
    would restart its sequence on resume and replay epoch 0's order).
    """

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


class TransformTensorDataset(Dataset):
    """``(images[i], labels[i])`` with an optional per-sample transform on the image tensor."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform=None):
        if len(images) != len(labels):
            raise ValueError(f'{len(images)} images but {len(labels)} labels')
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        x = self.images[i]
        return (self.transform(x) if self.transform is not None else x), self.labels[i]


class ImageDataModule(LightningDataModule):
    """Loaders over ``self.train_set``/``val_set``/``test_set`` (built by subclasses in ``setup``).

    Shuffling is a permutation of ``(seed, epoch)`` (:class:`EpochShuffle`), so a run's batch order is
    reproducible, also across a resume.
    """

    num_classes: int
    in_chans: int = 3

    def __init__(self, batch_size: int = 64, num_workers: int = 0, img_size: int = 32, seed: int = 0,
                 pin_memory: bool = False):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if img_size < 1:
            raise ValueError(f'img_size must be >= 1, got {img_size}')
        self.batch_size, self.num_workers, self.img_size, self.seed = batch_size, num_workers, img_size, seed
        self.pin_memory = pin_memory
        self.train_set = self.val_set = self.test_set = None

    def _check_sizes(self) -> None:
        name = type(self).__name__
        for split in ('train', 'val', 'test'):
            ds = getattr(self, f'{split}_set')
            if ds is not None and len(ds) == 0:
                raise ValueError(f'{name}: the {split} split is empty; adjust the split fractions or add data')
        if self.train_set is not None and self.batch_size > len(self.train_set):
            raise ValueError(f'{name}: batch_size {self.batch_size} is larger than the training set '
                             f'({len(self.train_set)} samples); use --data.batch_size {len(self.train_set)} or less')

    def _loader(self, ds, shuffle: bool) -> DataLoader:
        if ds is None:
            raise RuntimeError(f'{type(self).__name__}: call setup() before asking for a data loader')
        # The loader's own generator seeds its workers, so iterating it never draws from the global RNG.
        return DataLoader(ds, batch_size=self.batch_size, sampler=EpochShuffle(len(ds), self.seed) if shuffle else None,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          pin_memory=self.pin_memory, generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
