"""Segmentation datasets and DataModules: records -> checked, augmented ``(image, Mask)`` samples; procedural
(``shapes_seg``, ``digits_seg``) and folder sources (ADE20K, VOC / Cityscapes-style, image + mask folders) behind
one DataModule base and the shared epoch-keyed loader (``datasets/_base.py``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from .._base import ImageDataModule, split_indices
from ..detection.synthetic import Drawn, load_digits
from ..folder import _IMAGENET_MEAN, _IMAGENET_STD
from ..shapes import SHAPES
from .formats import Record, SegmentationDataError, voc_palette
from .synthetic import draw_digits_seg, draw_shapes_seg
from .transforms import IGNORE_INDEX, NO_AUGMENT, SegmentationAugment, collate, segmentation_transforms

__all__ = ['SegmentationDataset', 'SegmentationDataModule', 'ShapesSegDataModule', 'DigitsSegDataModule']


class SegmentationDataset(Dataset):
    """Records (:class:`~zoo.datasets.segmentation.formats.Record`) -> ``(image (3, S, S) float normalised,
    tv_tensors.Mask (S, S) int64)``.

    Every loaded mask is checked against its image and the classes: a mask of another size than its image, or a
    value outside ``0..num_classes-1`` other than the ignore index 255, is a :class:`SegmentationDataError` naming
    the file. :meth:`original` gives a sample as its files hold it (what predictions are written against),
    :meth:`meta` its file names and size; :attr:`files` the image file (or name) of every sample, in order.
    """

    def __init__(self, records: Sequence[Record], num_classes: int, transform: Callable | None = None,
                 name: str = 'dataset'):
        if not records:
            raise SegmentationDataError(f'{name}: the split is empty (no images found)')
        self.records, self.num_classes, self.transform, self.name = list(records), num_classes, transform, name

    def __len__(self) -> int:
        return len(self.records)

    @property
    def files(self) -> list[str]:
        return [str(r.image) if r.image is not None else r.name for r in self.records]

    def meta(self, i: int) -> dict:
        """``{'index', 'name', 'image', 'mask'}`` of sample ``i`` (paths, or None for generated samples); the file's
        size is ``original(i)[1].shape``."""
        r = self.records[i]
        return {'index': i, 'name': r.name, 'image': r.image, 'mask': r.mask}

    def original(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample ``i`` as stored: ``(uint8 image (3, H, W), int64 class ids (H, W), 255 = ignore)``, checked."""
        r = self.records[i]
        img, mask = r.load()
        mask = torch.as_tensor(np.asarray(mask), dtype=torch.long)
        if mask.shape != img.shape[-2:]:
            raise SegmentationDataError(f'{r.name}: mask is {mask.shape[-1]}x{mask.shape[0]} but its image is '
                                        f'{img.shape[-1]}x{img.shape[-2]} (W x H)')
        bad = ((mask < 0) | (mask >= self.num_classes)) & (mask != IGNORE_INDEX)
        if bad.any():
            values = sorted(torch.unique(mask[bad]).tolist())
            raise SegmentationDataError(
                f'{r.name}: class id(s) {values[:5]}{" ..." if len(values) > 5 else ""} out of range '
                f'0..{self.num_classes - 1} (and {IGNORE_INDEX} = ignore)')
        return img, mask

    def __getitem__(self, i: int):
        img, mask = self.original(i)
        image, mask = tv_tensors.Image(img), tv_tensors.Mask(mask)
        return self.transform(image, mask) if self.transform is not None else (image, mask)


class SegmentationDataModule(ImageDataModule):
    """Common loaders for semantic segmentation; subclasses set the classes and build the records.

    Batches are ``(images (B, 3, S, S) float, normalised by mean/std; masks (B, S, S) int64)``, class ids
    ``0..num_classes-1`` and ``ignore_index`` (255) on pixels no loss or metric counts. The order of the validation,
    test and predict loaders is the datasets' (``val_set.files``, ``test_set.meta(i)``, ``test_set.original(i)``).

    Args:
        img_size: the training crop and the evaluation input side, a multiple of 32 (the heads' strides).
        augment: training augmentation (:class:`SegmentationAugment`: resize ratio, crop class cap, flip,
            photometric); ``None``: none (the training images are only cropped or padded to ``img_size``).
        mean, std: normalisation (ImageNet's by default, as timm's and mmseg's backbones expect).
    """

    in_chans = 3
    ignore_index = IGNORE_INDEX
    collate_fn = staticmethod(collate)
    num_classes: int
    class_names: list[str]
    dataset_name: str

    def __init__(self, batch_size: int = 8, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed)
        if img_size % 32:
            raise ValueError(f'img_size must be a multiple of 32 (the segmentation heads\' strides), got {img_size}')
        if isinstance(augment, dict):  # from Python, as from YAML
            augment = SegmentationAugment(**augment)
        if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
            raise ValueError(f'mean and std are 3 values each (std > 0), got {mean} and {std}')
        self.augment, self.mean, self.std = augment, tuple(mean), tuple(std)

    @property
    def names(self) -> list[str]:
        """The class names (detection's attribute name, for code shared between tasks)."""
        return self.class_names

    @property
    def palette(self) -> list[tuple[int, int, int]]:
        """Class k's colour in written label PNGs and overlays (VOC's colour map: class 0 black)."""
        return voc_palette(self.num_classes)

    def _make(self, records: Sequence[Record], train: bool, split: str) -> SegmentationDataset:
        augment = (self.augment or NO_AUGMENT) if train else None
        return SegmentationDataset(records, self.num_classes,
                                   segmentation_transforms(augment, self.img_size, self.mean, self.std),
                                   name=f'{type(self).__name__} {split}')


class _ProceduralSeg(SegmentationDataModule):
    """Generated images split seeded into train / val / test; each drawn on first use and kept."""

    def __init__(self, batch_size: int = 8, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 num_samples: int = 1250, val_fraction: float = 0.16, test_fraction: float = 0.04, data_seed: int = 0,
                 max_objects: int = 6, min_px: int = 24, max_px: int = 112,
                 augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mean, std)
        split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now
        if not 1 <= min_px <= max_px:
            raise ValueError(f'need 1 <= min_px <= max_px, got {min_px}, {max_px}')
        if max_objects < 1:
            raise ValueError(f'max_objects must be >= 1, got {max_objects}')
        self.num_samples, self.val_fraction, self.test_fraction = num_samples, val_fraction, test_fraction
        self.data_seed, self.max_objects, self.min_px, self.max_px = data_seed, max_objects, min_px, max_px

    def _record(self, i: int, split: str) -> Record:
        raise NotImplementedError  # each generator draws its own images

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = split_indices(self.num_samples, (self.val_fraction, self.test_fraction), self.data_seed)
        for split, ids in zip(('train', 'val', 'test'), splits):
            records = [self._record(int(i), split) for i in ids]
            setattr(self, f'{split}_set', self._make(records, split == 'train', split))
        self._check_sizes()


class ShapesSegDataModule(_ProceduralSeg):
    """``shapes_seg``: 1 to ``max_objects`` shapes per image (circle, triangle, square, star, cross, ring), free to
    overlap, on textured backgrounds, with their per-pixel masks; classes ``background`` (0) and the first
    ``num_shapes`` shape kinds (1..). ``num_samples`` images of ``img_size`` (default 1,250: 1,000 train / 200 val /
    50 test), deterministic by ``data_seed``; drawn by ``shapes_det``'s code."""

    dataset_name = 'shapes_seg'

    def __init__(self, batch_size: int = 8, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 num_samples: int = 1250, val_fraction: float = 0.16, test_fraction: float = 0.04, data_seed: int = 0,
                 num_shapes: int = len(SHAPES), max_objects: int = 6, min_px: int = 24, max_px: int = 112,
                 augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size, num_workers, img_size, seed, num_samples, val_fraction, test_fraction, data_seed,
                         max_objects, min_px, max_px, augment, mean, std)
        if not 1 <= num_shapes <= len(SHAPES):
            raise ValueError(f'num_shapes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), got {num_shapes}')
        self.num_shapes, self.num_classes = num_shapes, num_shapes + 1
        self.class_names = ['background', *SHAPES[:num_shapes]]

    def _record(self, i: int, split: str) -> Record:
        draw = Drawn(draw_shapes_seg, (self.data_seed, i), size=self.img_size, num_shapes=self.num_shapes,
                      max_objects=self.max_objects, min_px=self.min_px, max_px=self.max_px)
        return Record(draw, f'shapes_seg[{i}]')


class DigitsSegDataModule(_ProceduralSeg):
    """``digits_seg``: scikit-learn's real handwritten digits placed on textured canvases (several per image, free to
    overlap); class = digit + 1 on its ink, ``background`` (0) elsewhere: 11 classes.

    The 1,797 source digits are split first (80 % for training canvases, the rest for validation and test
    canvases), so no digit drawing is seen in both training and evaluation.
    """

    dataset_name = 'digits_seg'
    num_classes = 11
    class_names = ['background', *(str(d) for d in range(10))]

    def _record(self, i: int, split: str) -> Record:
        if self._digits is None:
            src, targets = load_digits()
            train, held = split_indices(len(targets), (0.2,), self.data_seed)
            self._digits = src, targets, train.numpy(), held.numpy()
        src, targets, train, held = self._digits
        draw = Drawn(draw_digits_seg, (self.data_seed, i), size=self.img_size, src=src, targets=targets,
                      pool=train if split == 'train' else held, max_objects=self.max_objects, min_px=self.min_px,
                      max_px=self.max_px)
        return Record(draw, f'digits_seg[{i}]')

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self._digits = None
        super().setup(stage)
