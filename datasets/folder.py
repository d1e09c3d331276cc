"""Any folder of class sub-folders (ImageNet layout), read with torchvision's ``ImageFolder``.

Either ``root/train/<class>/*`` and ``root/val/<class>/*`` (and optionally ``root/test``), or a flat
``root/<class>/*`` split seeded by ``val_fraction``/``test_fraction``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ._base import DatasetNotFoundError, ImageDataModule, folder_dataset_name, split_indices

_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ImageFolderDataModule(ImageDataModule):
    """Train/val(/test) folders, or one folder cut into seeded splits. Standard ImageNet-style transforms, or
    timm's augmentations for training when a recipe names them (``zoo.datasets.augment``)."""

    in_chans = 3

    def __init__(self, root: str, batch_size: int = 64, num_workers: int = 2, img_size: int = 224, seed: int = 0,
                 val_fraction: float = 0.1, test_fraction: float = 0.0, split_seed: int = 0,
                 crop_pct: float = 0.875, mean: tuple[float, float, float] = _IMAGENET_MEAN,
                 std: tuple[float, float, float] = _IMAGENET_STD, **timm_augment):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed, **timm_augment)
        self.root = Path(root)
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.crop_pct, self.mean, self.std = crop_pct, tuple(mean), tuple(std)
        self.split_folders = (self.root / 'train').is_dir()
        self.dataset_name = folder_dataset_name('imagefolder', self.root)
        self.classes = self._classes(self.root / 'train' if self.split_folders else self.root)
        self.num_classes = len(self.classes)
        if not self.split_folders:
            split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now
        elif not (self.root / 'val').is_dir():
            raise DatasetNotFoundError(f'{self.root} has a train/ folder but no val/ folder: expected '
                                       f'{self.root}/val/<class>/<image> beside {self.root}/train/<class>/<image>')

    @staticmethod
    def _classes(folder: Path) -> list[str]:
        layout = (f'expected class sub-folders of images, {folder}/<class>/<image> (or {folder}/train and '
                  f'{folder}/val holding those); point --data.root at such a folder')
        if not folder.is_dir():
            raise DatasetNotFoundError(f'image folder not found: {folder}; {layout}')
        classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
        if not classes:
            raise DatasetNotFoundError(f'{folder} holds no class sub-folders; {layout}')
        return classes

    def _transforms(self, train: bool):
        from torchvision.transforms import v2 as T

        if train and self.timm_augment.train:
            return self.timm_augment.train_transform(self.mean, self.std, self.img_size)  # ImageFolder's PIL images
        if train:
            ops = [T.ToImage(), T.RandomResizedCrop(self.img_size, antialias=True), T.RandomHorizontalFlip()]
        else:
            ops = [T.ToImage(), T.Resize(int(self.img_size / self.crop_pct), antialias=True),
                   T.CenterCrop(self.img_size)]
        return T.Compose(ops + [T.ToDtype(torch.float32, scale=True), T.Normalize(self.mean, self.std)])

    def eval_transform(self):
        """An image file (uint8 RGB (3, H, W)) -> the validation input (``zoo predict --images``)."""
        return self._transforms(False)

    @property
    def names(self) -> list[str]:
        return self.classes

    def _open(self, folder: Path, train: bool):
        from torchvision.datasets import ImageFolder

        try:
            ds = ImageFolder(str(folder), transform=self._transforms(train))
        except (FileNotFoundError, OSError) as e:
            raise DatasetNotFoundError(f'could not read images under {folder}: {e}') from None
        if ds.classes != self.classes:
            raise DatasetNotFoundError(f'{folder} has classes {ds.classes[:5]}... but the training folder has '
                                       f'{self.classes[:5]}...; every split needs the same class sub-folders')
        return ds

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from torch.utils.data import Subset

        if self.split_folders:
            self.train_set = self._open(self.root / 'train', True)
            self.val_set = self._open(self.root / 'val', False)
            test = self.root / 'test'
            self.test_set = self._open(test, False) if test.is_dir() else self.val_set
        else:
            aug, plain = self._open(self.root, True), self._open(self.root, False)
            train, val, test = split_indices(len(aug), (self.val_fraction, self.test_fraction), self.split_seed)
            self.train_set, self.val_set = Subset(aug, train.tolist()), Subset(plain, val.tolist())
            self.test_set = Subset(plain, test.tolist()) if len(test) else self.val_set
        self._check_sizes()
