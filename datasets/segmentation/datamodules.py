"""Segmentation datasets and DataModules: records -> checked, augmented ``(image, Mask)`` samples; procedural
(``shapes_seg``, ``digits_seg``) and folder sources (ADE20K, VOC / Cityscapes-style, image + mask folders) behind
one DataModule base and the shared epoch-keyed loader (``datasets/_base.py``)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors

from .._base import DatasetNotFoundError, ImageDataModule, folder_dataset_name, split_indices
from ..detection.synthetic import Drawn, load_digits
from ..folder import _IMAGENET_MEAN, _IMAGENET_STD
from ..shapes import SHAPES
from .formats import (IMG_EXTS, Record, SegmentationDataError, file_records, pair_by_name, pair_from_list,
                      read_class_names, read_mask, voc_palette)
from .synthetic import draw_digits_seg, draw_shapes_seg
from .transforms import IGNORE_INDEX, NO_AUGMENT, SegmentationAugment, collate, segmentation_transforms

__all__ = ['SegmentationDataset', 'SegmentationDataModule', 'ShapesSegDataModule', 'DigitsSegDataModule',
           'ADE20KDataModule', 'VOCSegDataModule', 'FolderSegDataModule', 'VOC_CLASSES']


class SegmentationDataset(Dataset):
    """Records (:class:`~zoo.datasets.segmentation.formats.Record`) -> ``(image (3, S, S) float normalised,
    tv_tensors.Mask (S, S) int64)``, or with ``targets=True`` (the evaluation splits) ``(image, target)``: ``target``
    the image's metadata and its file's ground truth, as detection's targets carry theirs, so evaluation scores in
    the file's pixels (mmseg resizes the logits back to each image before its metric):
    ``{'mask': Mask (S, S)`` (what the loss takes), ``'file_mask': (H, W) int64`` (the file's class ids, what the
    metric takes), ``'orig_size': (H, W)``, ``'scale': (sx, sy)``, ``'pad': (left, top)`` (input pixel = file
    pixel x scale + pad), ``'index': i}``.

    Every loaded mask is checked against its image and the classes: a mask of another size than its image, or a
    value outside ``0..num_classes-1`` other than the ignore index 255, is a :class:`SegmentationDataError` naming
    the file. :meth:`original` gives a sample as its files hold it (what predictions are written against),
    :meth:`meta` its file names and size; :attr:`files` the image file (or name) of every sample, in order.
    """

    def __init__(self, records: Sequence[Record], num_classes: int, transform: Callable | None = None,
                 name: str = 'dataset', targets: bool = False):
        if not records:
            raise SegmentationDataError(f'{name}: the split is empty (no images found)')
        self.records, self.num_classes, self.transform, self.name = list(records), num_classes, transform, name
        self.targets = targets

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
        img, file_mask = self.original(i)
        image, mask = tv_tensors.Image(img), tv_tensors.Mask(file_mask)
        image, mask = self.transform(image, mask) if self.transform is not None else (image, mask)
        if not self.targets:
            return image, mask
        # The evaluation transform resizes the whole image (no crop, no padding), so the scale is the ratio of the
        # sides and nothing is padded; the head's prediction undoes exactly this (``SegHead.decode``).
        (h, w), (sh, sw) = file_mask.shape, mask.shape[-2:]
        return image, {'mask': mask, 'file_mask': file_mask, 'orig_size': (h, w), 'scale': (sw / w, sh / h),
                       'pad': (0, 0), 'index': i}


class SegmentationDataModule(ImageDataModule):
    """Common loaders for semantic segmentation; subclasses set the classes and build the records.

    Training batches are ``(images (B, 3, S, S) float, normalised by mean/std; masks (B, S, S) int64)``, class ids
    ``0..num_classes-1`` and ``ignore_index`` (255) on pixels no loss or metric counts. Validation, test and predict
    batches are ``(images, targets)``, one dict per image with its metadata and its file's mask
    (:class:`SegmentationDataset`), as detection's; their order is the datasets' (``val_set.files``,
    ``test_set.meta(i)``, ``test_set.original(i)``).

    Args:
        img_size: the training crop and the evaluation input side, a multiple of 32 (the heads' strides).
        augment: training augmentation (:class:`SegmentationAugment`: resize ratio, crop class cap, flip,
            photometric); ``None``: none (the training images are only cropped or padded to ``img_size``).
        mean, std: normalisation (ImageNet's by default, as timm's and mmseg's backbones expect).
    """

    zoo_task = 'segmentation'
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
                                   name=f'{type(self).__name__} {split}', targets=not train)


class _ProceduralSeg(SegmentationDataModule):
    """Generated images split seeded into train / val / test; each drawn on first use and kept (all drawn in
    ``setup`` when ``num_workers > 0``, so the loader's worker processes inherit them)."""

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
        raise NotImplementedError(f'{type(self).__name__} must define _record (each generator draws its own images)')

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        splits = split_indices(self.num_samples, (self.val_fraction, self.test_fraction), self.data_seed)
        for split, ids in zip(('train', 'val', 'test'), splits):
            records = [self._record(int(i), split) for i in ids]
            if self.num_workers > 0:  # drawn once here: worker processes are forked afresh each epoch, and a
                for r in records:     # sample drawn in a worker is lost with it
                    r.load()
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


class _Labels:
    """A dataset's mask values -> class ids ``0..num_classes-1`` (255: ignore): ``labels(path)`` reads a mask
    (:func:`read_mask`) and maps it. ``reduce_zero_label`` as mmseg (0 -> 255, k -> k-1, 255 stays 255);
    ``ignore_value``: the stored value that means "ignore" (-> 255); ``palette``: class k's colour in RGB masks.

    A stored value that is no class is an error naming the file, the value as the file stores it and the values
    it may hold; :meth:`check` looks only at the distinct values, so setup checks every mask at the cost of
    decoding it."""

    def __init__(self, num_classes: int, reduce_zero_label: bool = False, ignore_value: int = IGNORE_INDEX,
                 palette: Sequence[Sequence[int]] | None = None, ignore_colours: Sequence[Sequence[int]] = ()):
        self.num_classes, self.reduce_zero_label, self.ignore_value = num_classes, reduce_zero_label, ignore_value
        self.palette, self.ignore_colours = palette, ignore_colours

    def ids(self, stored: np.ndarray) -> np.ndarray:
        m = stored
        if self.ignore_value != IGNORE_INDEX:
            m = np.where(m == self.ignore_value, IGNORE_INDEX, m)
        if self.reduce_zero_label:
            m = np.where(m == 0, IGNORE_INDEX, np.where(m == IGNORE_INDEX, IGNORE_INDEX, m - 1))
        return m

    def _check(self, path: Path, stored: np.ndarray) -> None:
        flat = stored.ravel()
        small = flat.size and 0 <= flat.min() and flat.max() < 1 << 16  # grey and palette PNGs: bincount is fast
        values = np.flatnonzero(np.bincount(flat)) if small else np.unique(flat)
        ids = self.ids(values)
        bad = values[((ids < 0) | (ids >= self.num_classes)) & (ids != IGNORE_INDEX)].tolist()
        if bad:
            offset = 1 if self.reduce_zero_label else 0
            ignored = sorted({IGNORE_INDEX, self.ignore_value} | ({0} if self.reduce_zero_label else set()))
            raise SegmentationDataError(
                f'{path}: stored value(s) {bad[:5]}{" ..." if len(bad) > 5 else ""} match no class; expected '
                f'{offset}..{self.num_classes - 1 + offset} (the {self.num_classes} classes'
                f'{", stored as class id + 1: reduce_zero_label" if self.reduce_zero_label else ""}) or '
                f'{" / ".join(map(str, ignored))} (ignored)')

    def check(self, path: Path) -> None:
        """Read the mask at ``path`` and raise if it stores a value that is no class."""
        self._check(path, read_mask(path, self.palette, self.ignore_colours))

    def __call__(self, path: Path) -> np.ndarray:
        stored = read_mask(path, self.palette, self.ignore_colours)
        self._check(path, stored)
        return self.ids(stored)


class _FileSeg(SegmentationDataModule):
    """A folder dataset: subclasses give ``_pairs(which) -> ((image, mask) pairs, the folder or list read)``."""

    _palette: list | None = None
    _read_labels: _Labels

    def _pairs(self, which: str) -> tuple[list[tuple[Path, Path]], str]:
        raise NotImplementedError(f'{type(self).__name__} must define _pairs (its folder layout)')

    @property
    def palette(self) -> list[tuple[int, int, int]]:
        return [tuple(c) for c in self._palette] if self._palette is not None else voc_palette(self.num_classes)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        for which in ('train', 'val', 'test'):
            if which == 'test' and not self._has_test():
                self.test_set = self.val_set
                continue
            pairs, where = self._pairs(which)
            records = file_records(pairs, self._read_labels, check_labels=self._read_labels.check)
            setattr(self, f'{which}_set', self._make(records, which == 'train', f'{which} split ({where})'))
        self._check_sizes()

    def _has_test(self) -> bool:
        return True


def _ade_names(root: Path) -> list[str] | None:
    """Class names from ADE20K's ``objectInfo150`` table in ``root`` (.csv, or tab-separated .txt: Idx, Ratio, Train,
    Val, Name; the first of a name's synonyms, which ``;`` or ``,`` separate), or None."""
    import csv
    for path in (root / 'objectInfo150.csv', root / 'objectInfo150.txt'):
        if path.is_file():
            rows = list(csv.reader(path.read_text().splitlines(), delimiter=',' if path.suffix == '.csv' else '\t'))
            return [row[-1].split(';')[0].split(',')[0].strip() for row in rows[1:] if row]
    return None


class ADE20KDataModule(_FileSeg):
    """ADE20K's layout (ADEChallengeData2016): ``root/images/{training,validation}/*.jpg`` and
    ``root/annotations/{training,validation}/*.png`` of the same names, 0 = "other" and classes 1..N.

    Args:
        root: the dataset folder.
        reduce_zero_label: as mmseg's ADE20K configs: 0 -> 255 (ignored), k -> k - 1, so ``num_classes`` = N (150);
            ``False`` keeps 0 as a class (``num_classes`` = N + 1).
        num_classes: N, the classes 1..N in the files (150 for ADE20K's SceneParsing benchmark); ``None``: the length
            of the names (``classes_file``, or ``root/objectInfo150.csv``/``.txt``), else 150.
        classes_file: one class name per line (class 1 first); by default ``objectInfo150`` in ``root`` when there.
        train_split, val_split, test_split: the sub-folder names; ``test_split`` defaults to the validation split.
    """

    def __init__(self, root: str, reduce_zero_label: bool = True, num_classes: int | None = None,
                 classes_file: str | None = None, train_split: str = 'training', val_split: str = 'validation',
                 test_split: str | None = None, batch_size: int = 8, num_workers: int = 0, img_size: int = 512,
                 seed: int = 0, augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mean, std)
        self.root, self.reduce_zero_label = Path(root), reduce_zero_label
        if not (self.root / 'images').is_dir():
            raise DatasetNotFoundError(f'ADE20K folder not found: {self.root / "images"} (expected <root>/images/'
                                       f'{train_split} and <root>/annotations/{train_split}, ADEChallengeData2016\'s '
                                       f'layout)')
        names = read_class_names(Path(classes_file)) if classes_file else _ade_names(self.root)
        n = num_classes if num_classes is not None else len(names) if names else 150
        if names is not None and len(names) != n:
            raise ValueError(f'num_classes={n} but {classes_file or self.root} names {len(names)} classes')
        names = names or [f'class{k}' for k in range(1, n + 1)]
        self.num_classes = n if reduce_zero_label else n + 1
        self.class_names = names if reduce_zero_label else ['other', *names]
        self.splits = {'train': train_split, 'val': val_split, 'test': test_split or val_split}
        self.dataset_name = folder_dataset_name('ade20k', self.root)
        self._read_labels = _Labels(self.num_classes, reduce_zero_label=reduce_zero_label)

    def _has_test(self) -> bool:
        return self.splits['test'] != self.splits['val']

    def _pairs(self, which: str):
        split = self.splits[which]
        images, masks = self.root / 'images' / split, self.root / 'annotations' / split
        return pair_by_name(images, masks, img_suffix=IMG_EXTS, mask_suffix='.png'), str(images)


VOC_CLASSES = ('background', 'aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair', 'cow',
               'diningtable', 'dog', 'horse', 'motorbike', 'person', 'pottedplant', 'sheep', 'sofa', 'train',
               'tvmonitor')


class VOCSegDataModule(_FileSeg):
    """A VOC- or Cityscapes-style folder: a split is either named by a list file (``root/<list_dir>/<split>.txt``, one
    name without suffix per line, VOC's ``ImageSets/Segmentation``) or is the images and masks of matching names in
    ``root/<image_dir>/<split>/`` and ``root/<mask_dir>/<split>/`` (searched recursively, Cityscapes' city folders).

    Label PNGs hold class ids as grey or palette-indexed values (VOC's ``SegmentationClass``: the palette index is the
    class), or colours (RGB) mapped by ``palette``; the stored value ``ignore_index`` (and its palette colour, VOC's
    boundary (224, 224, 192) for 255) is ignored (255 in the samples).

    Args:
        root: the dataset folder (VOC: ``VOCdevkit/VOC2012``).
        classes_file: one class name per line (class 0 first); default VOC's 21 classes (or ``num_classes`` names).
        num_classes: without ``classes_file``, the number of classes (default 21, VOC's).
        palette: class k's RGB colour, for colour masks (default VOC's colour map).
        ignore_index: the stored label value to ignore.
        image_dir, mask_dir, list_dir: sub-folders of ``root`` (Cityscapes: ``leftImg8bit``, ``gtFine``).
        img_suffix, mask_suffix: what follows the shared name (Cityscapes: ``_leftImg8bit.png``,
            ``_gtFine_labelTrainIds.png``).
        train_split, val_split, test_split: split names; ``test_split`` defaults to the validation split.
    """

    def __init__(self, root: str, classes_file: str | None = None, num_classes: int | None = None,
                 palette: list[tuple[int, int, int]] | None = None, ignore_index: int = IGNORE_INDEX,
                 image_dir: str = 'JPEGImages', mask_dir: str = 'SegmentationClass',
                 list_dir: str = 'ImageSets/Segmentation', img_suffix: str = '.jpg', mask_suffix: str = '.png',
                 train_split: str = 'train', val_split: str = 'val', test_split: str | None = None,
                 batch_size: int = 8, num_workers: int = 0, img_size: int = 512, seed: int = 0,
                 augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mean, std)
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetNotFoundError(f'dataset folder not found: {self.root} (expected {image_dir}/, {mask_dir}/ '
                                       f'and {list_dir}/<split>.txt or per-split folders)')
        if classes_file:
            names = read_class_names(Path(classes_file))
        elif num_classes is None or num_classes == len(VOC_CLASSES):
            names = list(VOC_CLASSES)
        else:
            names = [f'class{k}' for k in range(num_classes)]
        if num_classes is not None and num_classes != len(names):
            raise ValueError(f'num_classes={num_classes} but {classes_file} names {len(names)} classes')
        self.num_classes, self.class_names = len(names), names
        self._palette = _check_palette(palette, self.num_classes)
        self.file_ignore_index = ignore_index
        colours = self.palette
        ignore_colours = [voc_palette(256)[ignore_index]] if 0 <= ignore_index < 256 else []
        self._read_labels = _Labels(self.num_classes, ignore_value=ignore_index, palette=colours,
                                   ignore_colours=[c for c in ignore_colours if c not in colours])
        self.dirs = (image_dir, mask_dir, list_dir)
        self.suffixes = (img_suffix, mask_suffix)
        self.splits = {'train': train_split, 'val': val_split, 'test': test_split or val_split}
        self.dataset_name = folder_dataset_name('voc', self.root)

    def _has_test(self) -> bool:
        return self.splits['test'] != self.splits['val']

    def _pairs(self, which: str):
        split = self.splits[which]
        image_dir, mask_dir, list_dir = (self.root / d for d in self.dirs)
        listed = list_dir / f'{split}.txt'
        if listed.is_file():
            return pair_from_list(listed, image_dir, mask_dir, *self.suffixes), str(listed)
        if (image_dir / split).is_dir():
            return pair_by_name(image_dir / split, mask_dir / split, *self.suffixes), str(image_dir / split)
        raise DatasetNotFoundError(f'{self.root}: the {split!r} split is neither a list file ({listed}) nor a folder '
                                   f'of images ({image_dir / split})')


def _check_palette(palette, num_classes: int) -> list[tuple[int, int, int]] | None:
    if palette is None:
        return None
    palette = [tuple(int(v) for v in c) for c in palette]
    if len(palette) != num_classes or any(len(c) != 3 or not all(0 <= v < 256 for v in c) for c in palette):
        raise ValueError(f'palette must give one (r, g, b) colour in 0..255 per class ({num_classes}), got '
                         f'{len(palette)} entries')
    if len(set(palette)) != len(palette):
        raise ValueError('palette colours must be distinct (a colour maps to one class)')
    return palette


class FolderSegDataModule(_FileSeg):
    """Any image folder + mask folder + class-names file: images and masks paired by name (the path below the folder
    without the suffix); masks hold class ids (grey or palette-indexed PNG) or colours mapped by ``palette``.

    Splits: ``train/``, ``val/`` (and optionally ``test/``) sub-folders in both folders when ``images/train`` exists;
    otherwise every pair, split seeded by ``val_fraction`` / ``test_fraction`` (``test_fraction=0``: the test split
    is the validation split).

    Args:
        images, masks: the two folders.
        classes_file: one class name per line, line k naming class k.
        palette: class k's RGB colour, for colour masks.
        ignore_index: the stored label value to ignore (255 in the samples).
        reduce_zero_label: stored 0 is "unlabelled" and class k is stored as k + 1 (mmseg's ``reduce_zero_label``).
        mask_suffix: what replaces the image's suffix in its mask's name (``.png``, ``_mask.png``).
    """

    def __init__(self, images: str, masks: str, classes_file: str, palette: list[tuple[int, int, int]] | None = None,
                 ignore_index: int = IGNORE_INDEX, reduce_zero_label: bool = False, mask_suffix: str = '.png',
                 val_fraction: float = 0.2, test_fraction: float = 0.0, split_seed: int = 0, batch_size: int = 8,
                 num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 augment: SegmentationAugment | None = SegmentationAugment(),
                 mean: tuple[float, float, float] = _IMAGENET_MEAN, std: tuple[float, float, float] = _IMAGENET_STD):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mean, std)
        self.images, self.masks, self.mask_suffix = Path(images), Path(masks), mask_suffix
        for what, folder in (('image', self.images), ('mask', self.masks)):
            if not folder.is_dir():
                raise DatasetNotFoundError(f'{what} folder not found: {folder}')
        split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.class_names = read_class_names(Path(classes_file))
        self.num_classes = len(self.class_names)
        self._palette = _check_palette(palette, self.num_classes)
        self.file_ignore_index = ignore_index
        self._read_labels = _Labels(self.num_classes, reduce_zero_label, ignore_index, self._palette)
        self.by_folder = (self.images / 'train').is_dir()
        self.dataset_name = folder_dataset_name('folder', self.images.parent, self.images, self.masks)
        self._all = None

    def _has_test(self) -> bool:
        return (self.images / 'test').is_dir() if self.by_folder else self.test_fraction > 0

    def _pairs(self, which: str):
        if self.by_folder:
            return pair_by_name(self.images / which, self.masks / which, mask_suffix=self.mask_suffix), \
                str(self.images / which)
        if self._all is None:
            self._all = pair_by_name(self.images, self.masks, mask_suffix=self.mask_suffix)
            if not self._all:
                raise SegmentationDataError(f'{self.images}: no images found')
        parts = dict(zip(('train', 'val', 'test'), split_indices(len(self._all), (self.val_fraction,
                                                                                  self.test_fraction),
                                                                 self.split_seed)))
        return [self._all[i] for i in parts[which].tolist()], f'{self.images}, {which} part'
