"""CIFAR-10 and CIFAR-100 through torchvision's loaders, with the standard augmentation
(4-pixel padded random crop and horizontal flip), or timm's augmentations when a recipe names them
(``zoo.datasets.augment``), and a seeded validation split of the training batches.

Data lives in ``<root>/cifar-10-batches-py`` or ``<root>/cifar-100-python`` (the archives from
https://www.cs.toronto.edu/~kriz/cifar.html, unpacked); ``download=True`` fetches them there.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from ._base import DatasetNotFoundError, ImageDataModule, split_indices

_URL = 'https://www.cs.toronto.edu/~kriz/cifar.html'


def _lenient(cls):
    """A torchvision CIFAR class that accepts any readable files in the official layout.

    torchvision checks each file's MD5 against the official archive; we check that the files exist
    and let unpickling report corruption, so that subsets in the same format (tests) load too.
    ``download=True`` still goes through torchvision's own checks.
    """

    class Lenient(cls):
        def _check_integrity(self) -> bool:
            return all(os.path.isfile(os.path.join(self.root, self.base_folder, f))
                       for f, _ in self.train_list + self.test_list)

        def _load_meta(self) -> None:
            with open(os.path.join(self.root, self.base_folder, self.meta['filename']), 'rb') as f:
                self.classes = pickle.load(f, encoding='latin1')[self.meta['key']]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    Lenient.__name__ = cls.__name__
    return Lenient


class _CIFARDataModule(ImageDataModule):
    _tv_name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    in_chans = 3

    def __init__(self, root: str = 'data', download: bool = False, batch_size: int = 128, num_workers: int = 2,
                 img_size: int = 32, seed: int = 0, val_fraction: float = 0.1, split_seed: int = 0,
                 augment: bool = True, **timm_augment):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed, **timm_augment)
        split_indices(10, (val_fraction,), 0)  # validate the fraction now
        self.root, self.download = str(root), download
        self.val_fraction, self.split_seed, self.augment = val_fraction, split_seed, augment
        if not augment:
            self._refuse_timm_augment('augment is false (training without augmentation)', training_only=True)

    @property
    def folder(self) -> Path:
        import torchvision.datasets as tvd
        return Path(self.root) / getattr(tvd, self._tv_name).base_folder

    def prepare_data(self) -> None:
        if self.download:
            import torchvision.datasets as tvd
            cls = getattr(tvd, self._tv_name)
            cls(self.root, train=True, download=True)
            cls(self.root, train=False, download=True)

    def _transforms(self, train: bool):
        from torchvision.transforms import v2 as T

        # torchvision's CIFAR hands out PIL images: timm's transforms take them as they are
        if train and self.augment and self.timm_augment.train:
            return self.timm_augment.train_transform(self.mean, self.std, self.img_size)
        timm_eval = None if train else self.timm_augment.eval_transform(self.mean, self.std, self.img_size)
        if timm_eval is not None:
            return T.Compose([T.ToPILImage(), timm_eval])  # a PIL image passes through; a tensor becomes one
        ops = [T.ToImage()]
        if self.img_size != 32:
            ops.append(T.Resize(self.img_size, antialias=True))
        if train and self.augment:
            ops += [T.RandomCrop(self.img_size, padding=self.img_size // 8), T.RandomHorizontalFlip()]
        ops += [T.ToDtype(torch.float32, scale=True), T.Normalize(self.mean, self.std)]
        return T.Compose(ops)

    def eval_transform(self):
        """An image file (uint8 RGB (3, H, W), any size) -> the test split's input: the shorter side resized to
        ``img_size`` and centre-cropped square (the test images are square already), then normalised as the test
        split (``zoo predict --images``)."""
        from torchvision.transforms import v2 as T
        return T.Compose([T.Resize(self.img_size, antialias=True), T.CenterCrop(self.img_size),
                          self._transforms(False)])

    def _open(self, train: bool, transform):
        import torchvision.datasets as tvd
        cls = _lenient(getattr(tvd, self._tv_name))
        how = (f'pass --data.download true (or download=True) to fetch it, or unpack the python version of '
               f'the archive from {_URL} into {self.root}')
        try:
            return cls(self.root, train=train, transform=transform, download=False)
        except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
            raise DatasetNotFoundError(f'{self._tv_name} not found: expected its files in {self.folder} '
                                       f'({e}). {how}') from None
        except (pickle.UnpicklingError, EOFError, KeyError, ValueError, OSError) as e:
            raise DatasetNotFoundError(f'{self._tv_name} files in {self.folder} are corrupt '
                                       f'({type(e).__name__}: {e}). Delete the folder and {how}') from None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from torch.utils.data import Subset

        train_aug, train_plain = self._open(True, self._transforms(True)), self._open(True, self._transforms(False))
        num_classes = len(train_aug.classes)
        self.names = list(train_aug.classes)
        if num_classes != self.num_classes:
            raise DatasetNotFoundError(f'{self.folder} holds {num_classes} classes, expected {self.num_classes}')
        train, val = split_indices(len(train_aug), (self.val_fraction,), self.split_seed)
        self.train_set = Subset(train_aug, train.tolist())
        self.val_set = Subset(train_plain, val.tolist())
        self.test_set = self._open(False, self._transforms(False))
        self._check_sizes()


class CIFAR10DataModule(_CIFARDataModule):
    """CIFAR-10: 50,000 training (minus the validation split) and 10,000 test images, 32x32, 10 classes."""

    _tv_name = 'CIFAR10'
    num_classes = 10
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class CIFAR100DataModule(_CIFARDataModule):
    """CIFAR-100: like CIFAR-10 with 100 fine-grained classes."""

    _tv_name = 'CIFAR100'
    num_classes = 100
    mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
