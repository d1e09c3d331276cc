"""The common DataModule for image classification: seeded splits, loaders, the size attributes."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler


class DatasetNotFoundError(FileNotFoundError):
    """Data missing or unreadable; the message names the expected path and how to obtain the data."""


class DataError(ValueError):
    """Malformed data (a task's annotations, labels or masks); the one-line message names the file."""


def image_size(path, error: type[DataError] = DataError) -> tuple[int, int]:
    """(H, W) of an image file from its header, without decoding the pixels; an unreadable file raises ``error``."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            w, h = im.size
    except (OSError, ValueError) as e:
        raise error(f'{path}: could not read the image ({e})') from None
    return h, w


def folder_dataset_name(layout: str, folder, *more) -> str:
    """The name runs on data read from the user's files are recorded under (``zoo results --dataset``):
    ``<layout>:<folder name>@<digest>``, e.g. ``ade20k:scenes@3f2a1c``. The digest is of the absolute paths of
    ``folder`` and ``more`` (other folders or files the data is read from), so two datasets never share a name
    (two folders called ``data``, or one folder read in two layouts) and runs on one folder pool as seeds of
    one dataset; a moved folder is a new name."""
    import hashlib
    from pathlib import Path

    paths = [Path(p).resolve() for p in (folder, *more)]
    digest = hashlib.sha1('\n'.join(map(str, paths)).encode()).hexdigest()[:6]
    return f'{layout}:{paths[0].name or layout}@{digest}'


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


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch`` of a run seeded ``seed`` (shuffling, worker seeds, per-epoch reseeding)."""
    return (seed * 1_000_003 + epoch) % 2**63


class EpochShuffle(Sampler[int]):
    """``range(n)``, shuffled by a permutation that depends only on ``(seed, epoch)`` (or in order).

    Lightning calls ``set_epoch`` before every training epoch, so a run resumed from an end-of-epoch
    checkpoint sees the same batch order as an uninterrupted one (a generator that is only seeded once
    would restart its sequence on resume and replay epoch 0's order).
    """

    def __init__(self, n: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle, self.epoch = n, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.n))
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return iter(torch.randperm(self.n, generator=g).tolist())


class EpochLoader(DataLoader):
    """A DataLoader whose batches depend only on ``(seed, epoch)``: the one loader of every DataModule.

    The order comes from :class:`EpochShuffle`; the worker processes' seeds (which drive random
    augmentation when ``num_workers > 0``) are drawn from a generator reseeded from ``(seed, epoch)`` each
    time an epoch starts. In the main process (``num_workers=0``) augmentation draws from the global RNG,
    which ``recipes.checkpointing.EpochSeed`` reseeds at every epoch start. Workers are therefore not
    persistent: a persistent worker would carry its RNG state from one epoch into the next, and a run
    resumed at epoch ``e`` would start it afresh.
    """

    def __init__(self, dataset, *, batch_size: int = 1, shuffle: bool = False, seed: int = 0, sampler=None, **kwargs):
        # keyword arguments only, ``sampler``/``**kwargs`` passed on: Lightning re-creates the loader with a
        # distributed sampler under DDP, and with a batch sampler that records indices to predict
        self.seed = seed
        kwargs.pop('generator', None)
        if sampler is None and kwargs.get('batch_sampler') is None:
            sampler = EpochShuffle(len(dataset), seed, shuffle)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, generator=torch.Generator().manual_seed(seed),
                         **kwargs)

    def __iter__(self):
        # worker seeds of this epoch (a distributed sampler keeps its epoch under the same name)
        self.generator.manual_seed(epoch_seed(self.seed, getattr(self.sampler, 'epoch', 0)))
        return super().__iter__()


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

    Loaders are :class:`EpochLoader`: a run's batches depend only on ``(seed, epoch)``, also across a resume.
    """

    # the registry task this data serves (``zoo.TASKS``); ``zoo fit`` refuses a system of another task. Not
    # ``task``: SyntheticLMDataModule's ``task`` is the reasoning task it generates.
    zoo_task = 'classification'
    num_classes: int
    in_chans: int = 3
    # the test split's normalisation of [0, 1] pixels, (pixels - mean) / std: the corruption splits undo it to
    # corrupt the pixels (``corruptions.CorruptedDataset``); (0, 1) means the images are pixels already
    mean: float | tuple = 0.0
    std: float | tuple = 1.0
    # ``zoo test --corruptions``: (corruption, severity) of each corrupted copy of the test split, tested after
    # the clean split (dataloader 0) as dataloaders 1, 2, ...; empty: the test split alone
    test_corruptions: tuple = ()

    def __init__(self, batch_size: int = 64, num_workers: int = 0, img_size: int = 32, seed: int = 0,
                 pin_memory: bool = False, *, auto_augment: str | None = None, re_prob: float | None = None,
                 re_mode: str | None = None, re_count: int | None = None, interpolation: str | None = None,
                 scale: tuple[float, float] | None = None, ratio: tuple[float, float] | None = None,
                 hflip: float | None = None, color_jitter: float | None = None, crop_pct: float | None = None):
        """The keyword-only options are timm's augmentations (``zoo.datasets.augment``, docs/recipes.md
        "Augmentation"): ``auto_augment`` (``rand-m9-mstd0.5-inc1``, ``original``, ``v0``...), random erasing
        (``re_prob``, ``re_mode``, ``re_count``), the random-resized crop (``scale``, ``ratio``,
        ``interpolation``), ``hflip``, ``color_jitter``, and ``crop_pct`` for evaluation. None (the default) keeps
        the DataModule's own transforms."""
        super().__init__()
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        if img_size < 1:
            raise ValueError(f'img_size must be >= 1, got {img_size}')
        self.batch_size, self.num_workers, self.img_size, self.seed = batch_size, num_workers, img_size, seed
        self.pin_memory = pin_memory
        self.train_set = self.val_set = self.test_set = None
        from .augment import TimmAugment
        self.timm_augment = TimmAugment(dict(
            auto_augment=auto_augment, re_prob=re_prob, re_mode=re_mode, re_count=re_count,
            interpolation=interpolation, scale=scale, ratio=ratio, hflip=hflip, color_jitter=color_jitter,
            crop_pct=crop_pct))

    def _refuse_timm_augment(self, why: str, training_only: bool = False) -> None:
        """One line when timm's augmentations were named for data they cannot apply to (``why`` says what the
        data is); ``training_only`` refuses the training options only (``crop_pct`` still applies)."""
        named = ', '.join(self.timm_augment.train_options) if training_only else self.timm_augment.names()
        if named:
            raise ValueError(f'{type(self).__name__}: {named} (timm augmentations) cannot apply: {why}')

    def _check_sizes(self) -> None:
        name = type(self).__name__
        for split in ('train', 'val', 'test'):
            ds = getattr(self, f'{split}_set')
            if ds is not None and len(ds) == 0:
                raise ValueError(f'{name}: the {split} split is empty; adjust the split fractions or add data')
        if self.train_set is not None and self.batch_size > len(self.train_set):
            raise ValueError(f'{name}: batch_size {self.batch_size} is larger than the training set '
                             f'({len(self.train_set)} samples); use --data.batch_size {len(self.train_set)} or less')

    collate_fn = None  # how a batch is put together (detection keeps per-image targets)

    def _loader(self, ds, shuffle: bool) -> DataLoader:
        if ds is None:
            raise RuntimeError(f'{type(self).__name__}: call setup() before asking for a data loader')
        return EpochLoader(ds, batch_size=self.batch_size, shuffle=shuffle, seed=self.seed,
                           num_workers=self.num_workers, collate_fn=self.collate_fn, pin_memory=self.pin_memory)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        clean = self._loader(self.test_set, shuffle=False)
        if not self.test_corruptions:
            return clean
        from .corruptions import CorruptedDataset
        return [clean, *(self._loader(CorruptedDataset(self.test_set, name, severity, self.mean, self.std, self.seed),
                                      shuffle=False) for name, severity in self.test_corruptions)]

    def predict_dataloader(self) -> DataLoader:
        # ``zoo predict --images DIR`` points the predict split at those files (``zoo.datasets.images``)
        predict = getattr(self, 'predict_set', None)
        return self._loader(self.test_set if predict is None else predict, shuffle=False)
