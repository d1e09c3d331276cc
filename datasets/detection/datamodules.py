"""Detection datasets and DataModules: records -> letterboxed, augmented samples; COCO, YOLO and procedural
sources behind one DataModule base and the shared epoch-keyed loader (``datasets/_base.py``)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from .._base import DatasetNotFoundError, ImageDataModule, folder_dataset_name, split_indices
from ..shapes import SHAPES
from .formats import BoxCheck, DetectionDataError, read_coco, read_json, read_yaml, read_yolo
from .synthetic import Drawn, draw_digits_det, draw_shapes_det, load_digits
from .transforms import NO_AUGMENT, PAD_VALUE, DetectionAugment, collate, detection_transforms, letterbox

__all__ = ['DetectionDataset', 'DetectionDataModule', 'CocoDetectionDataModule', 'YoloDetectionDataModule',
           'ShapesDetDataModule', 'DigitsDetDataModule']


class DetectionDataset(Dataset):
    """Records -> letterboxed, augmented samples.

    A record is ``(load, image_id, source)``: ``load()`` returns ``(image, boxes, labels)`` -- a uint8
    (3, H, W) tensor, an (n, 4) float xyxy array in that image's pixels and (n,) ints -- or those and an (n,)
    ``iscrowd`` array, or those and an (n,) ``area`` array (COCO), and ``source`` names the sample in errors.
    ``mosaic`` is the probability of a 4-image mosaic (training only).
    """

    def __init__(self, records: list[tuple], img_size: int, transform: Callable | None = None, mosaic: float = 0.0,
                 name: str = 'dataset'):
        if not records:
            raise DetectionDataError(f'{name}: the split is empty (no images found)')
        if img_size % 32:
            raise ValueError(f'img_size must be a multiple of 32 (the detector strides), got {img_size}')
        self.records, self.img_size, self.transform, self.mosaic, self.name = records, img_size, transform, mosaic, name

    def __len__(self) -> int:
        return len(self.records)

    def load(self, i: int):
        """The letterboxed uint8 image and its target, before augmentation."""
        load, image_id, _ = self.records[i]
        img, boxes, labels, *extra = load()  # extra: () or (iscrowd,) or (iscrowd, area)
        h, w = img.shape[-2:]
        labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
        boxes = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4)
        target = {'boxes': tv_tensors.BoundingBoxes(boxes, format='XYXY', canvas_size=(h, w)),
                  'file_boxes': boxes,  # the file's own pixels, untouched by the transforms: what mAP scores
                  'labels': labels,
                  'iscrowd': torch.as_tensor(extra[0], dtype=torch.bool).reshape(-1) if extra
                  else torch.zeros(len(labels), dtype=torch.bool),
                  'image_id': image_id, 'orig_size': (h, w)}
        if len(extra) > 1:
            target['area'] = torch.as_tensor(extra[1], dtype=torch.float32).reshape(-1)
        return letterbox(tv_tensors.Image(img), target, self.img_size)

    def _mosaic(self, i: int):
        """Four letterboxed images in a (2S, 2S) canvas, then a random S x S crop around the centre region."""
        s = self.img_size
        idx = [i] + torch.randint(len(self), (3,)).tolist()
        canvas = torch.full((3, 2 * s, 2 * s), PAD_VALUE, dtype=torch.uint8)
        boxes, labels, crowd = [], [], []
        for k, j in enumerate(idx):
            img, t = self.load(j)
            ox, oy = (k % 2) * s, (k // 2) * s
            canvas[:, oy:oy + s, ox:ox + s] = img
            boxes.append(t['boxes'].as_subclass(torch.Tensor) + torch.tensor([ox, oy, ox, oy], dtype=torch.float32))
            labels.append(t['labels'])
            crowd.append(t['iscrowd'])
        x0, y0 = torch.randint(s // 2, 3 * s // 2 + 1, (2,)).tolist()  # centre of the crop
        x0, y0 = x0 - s // 2, y0 - s // 2
        target = {'boxes': tv_tensors.BoundingBoxes(torch.cat(boxes), format='XYXY', canvas_size=(2 * s, 2 * s)),
                  'labels': torch.cat(labels), 'iscrowd': torch.cat(crowd), 'image_id': self.records[i][1],
                  'file_boxes': torch.cat(boxes),
                  'orig_size': (s, s),
                  'scale': (1.0, 1.0), 'pad': (0, 0)}
        image = F.crop(tv_tensors.Image(canvas), y0, x0, s, s)
        target['boxes'] = F.clamp_bounding_boxes(F.crop(target['boxes'], y0, x0, s, s))
        return image, target

    def original(self, i: int) -> torch.Tensor:
        """The file's own uint8 (3, H, W) image of sample ``i`` (what predictions are drawn on)."""
        return self.records[i][0]()[0]

    def __getitem__(self, i: int):
        if self.mosaic > 0 and torch.rand(()) < self.mosaic:
            image, target = self._mosaic(i)
        else:
            image, target = self.load(i)
        image, target = self.transform(image, target) if self.transform is not None else (image, target)
        target['index'] = i  # the sample's position in this dataset (its file: ``original(i)``)
        return image, target


class DetectionDataModule(ImageDataModule):
    """Common loaders for detection: ``collate`` keeps per-image targets; subclasses build the records.

    Args:
        img_size: network input side, a multiple of 32 (images are letterboxed to it).
        augment: training augmentation (:class:`DetectionAugment`: mosaic, flip, scale, translate, hsv);
            ``None``: none (degenerate boxes are still dropped in training).
    """

    zoo_task = 'detection'
    in_chans = 3
    collate_fn = staticmethod(collate)  # targets stay a list, one dict per image
    names: list[str]
    categories: list[int] | None = None  # COCO category id of each label (None: the label itself)

    def __init__(self, batch_size: int = 16, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 augment: DetectionAugment | None = DetectionAugment()):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed)
        if img_size % 32:
            raise ValueError(f'img_size must be a multiple of 32 (the detector strides), got {img_size}')
        if isinstance(augment, dict):  # from Python, as from YAML
            augment = DetectionAugment(**augment)
        self.augment = augment

    def _make(self, records: list, train: bool, split: str) -> DetectionDataset:
        augment = (self.augment or NO_AUGMENT) if train else None
        return DetectionDataset(records, self.img_size, detection_transforms(augment),
                                mosaic=augment.mosaic if augment is not None else 0.0,
                                name=f'{type(self).__name__} {split}')


class _ProceduralDet(DetectionDataModule):
    """Generated images split seeded into train / val / test."""

    dataset_name: str

    def __init__(self, batch_size: int = 16, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 num_samples: int = 1250, val_fraction: float = 0.16, test_fraction: float = 0.04, data_seed: int = 0,
                 num_classes: int | None = None, max_objects: int = 6, min_px: int = 12, max_px: int = 80,
                 augment: DetectionAugment | None = DetectionAugment()):
        super().__init__(batch_size, num_workers, img_size, seed, augment)
        split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now
        self._set_classes(num_classes)
        if not 1 <= min_px <= max_px:
            raise ValueError(f'need 1 <= min_px <= max_px, got {min_px}, {max_px}')
        self.num_samples, self.val_fraction, self.test_fraction = num_samples, val_fraction, test_fraction
        self.data_seed, self.max_objects, self.min_px, self.max_px = data_seed, max_objects, min_px, max_px

    def _set_classes(self, num_classes: int | None) -> None:
        raise NotImplementedError  # each generator knows its classes

    def _record(self, i: int, seed: int, **kwargs) -> tuple:
        raise NotImplementedError  # each generator draws its own images

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        train, val, test = split_indices(self.num_samples, (self.val_fraction, self.test_fraction), self.data_seed)
        for split, ids in (('train', train), ('val', val), ('test', test)):
            records = [self._record(int(i)) for i in ids]
            setattr(self, f'{split}_set', self._make(records, split == 'train', split))
        self._check_sizes()


class ShapesDetDataModule(_ProceduralDet):
    """Several shapes per image (circle, triangle, square, star, cross, ring) on textured backgrounds.

    ``num_samples`` images of ``img_size`` (default 1,250: 1,000 train / 200 val / 50 test), 1 to
    ``max_objects`` objects each of ``min_px`` to ``max_px`` pixels, deterministic by ``data_seed``; each image is
    drawn on first use and kept.
    """

    dataset_name = 'shapes_det'

    def _set_classes(self, num_classes: int | None) -> None:
        num_classes = len(SHAPES) if num_classes is None else num_classes
        if not 1 <= num_classes <= len(SHAPES):
            raise ValueError(f'num_classes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), '
                             f'got {num_classes}')
        self.num_classes = num_classes
        self.names = list(SHAPES[:num_classes])

    def _record(self, i: int) -> tuple:
        draw = Drawn(draw_shapes_det, (self.data_seed, i), size=self.img_size, num_classes=self.num_classes,
                      max_objects=self.max_objects, min_px=self.min_px, max_px=self.max_px)
        return draw, i, f'shapes_det[{i}]'


class DigitsDetDataModule(_ProceduralDet):
    """scikit-learn's real handwritten digits pasted on larger canvases (classes 0-9).

    The 1,797 source digits are split first (80 % for training canvases, the rest for validation and test
    canvases), so no digit drawing is seen in both training and evaluation. Canvases are drawn on first use.
    """

    dataset_name = 'digits_det'

    def _set_classes(self, num_classes: int | None) -> None:
        if num_classes not in (None, 10):
            raise ValueError(f'digits_det has the 10 digit classes; got num_classes={num_classes}')
        self.num_classes, self.names = 10, [str(i) for i in range(10)]

    def _record(self, i: int) -> tuple:
        if self._digits is None:
            src, targets = load_digits()
            train, held = split_indices(len(targets), (0.2,), self.data_seed)
            self._digits = src, targets, train.numpy(), held.numpy()
        src, targets, train, held = self._digits
        pool = train if i in self._train_ids else held
        draw = Drawn(draw_digits_det, (self.data_seed, i), size=self.img_size, src=src, targets=targets, pool=pool,
                      max_objects=self.max_objects, min_px=self.min_px, max_px=self.max_px)
        return draw, i, f'digits_det[{i}]'

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self._digits = None
            self._train_ids = set(split_indices(self.num_samples, (self.val_fraction, self.test_fraction),
                                                self.data_seed)[0].tolist())
        super().setup(stage)


class CocoDetectionDataModule(DetectionDataModule):
    """A COCO-format folder: ``root/annotations/instances_<split>.json`` and the images in ``root/<split>/``.

    Args:
        root: the dataset folder.
        train_split, val_split, test_split: split names (``train2017``, ``val2017``); ``test_split`` defaults
            to the validation split.
        image_dirs: optional ``{split: folder}`` when images are elsewhere than ``root/<split>/``.
        box_tolerance: boxes reaching outside their image by up to this fraction of its side are clipped (and
            counted, said once); beyond it they are an error.
    """

    def __init__(self, root: str, train_split: str = 'train', val_split: str = 'val', test_split: str | None = None,
                 image_dirs: dict | None = None, batch_size: int = 16, num_workers: int = 0, img_size: int = 640,
                 seed: int = 0, augment: DetectionAugment | None = DetectionAugment(), box_tolerance: float = 0.02):
        super().__init__(batch_size, num_workers, img_size, seed, augment)
        BoxCheck(box_tolerance, root)  # checked now, used when the annotations are read
        self.box_tolerance = box_tolerance
        self.root = Path(root)
        self.splits = {'train': train_split, 'val': val_split, 'test': test_split or val_split}
        self.image_dirs = dict(image_dirs or {})
        self.dataset_name = folder_dataset_name('coco', self.root)
        # classes come from the training annotations' categories (read now: the model needs num_classes)
        _, self.categories, self.names = self._read('train', check_only_categories=True)
        self.num_classes = len(self.categories)

    def _read(self, which: str, check_only_categories: bool = False):
        split = self.splits[which]
        ann = self.root / 'annotations' / f'instances_{split}.json'
        if check_only_categories:
            if not ann.is_file():
                raise DatasetNotFoundError(f'COCO annotations not found: {ann} (expected <root>/annotations/'
                                           f'instances_{split}.json)')
            cats = sorted(read_json(ann).get('categories', []), key=lambda c: c['id'])
            if not cats:
                raise DetectionDataError(f'{ann}: no categories')
            return None, [int(c['id']) for c in cats], [str(c.get('name', c['id'])) for c in cats]
        images = Path(self.image_dirs.get(split, self.root / split))
        return read_coco(ann, images, self.box_tolerance)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        for which in ('train', 'val', 'test'):
            records, cats, _ = self._read(which)
            if cats != self.categories:
                raise DetectionDataError(f'{self.root}: the {self.splits[which]} categories {cats} differ from the '
                                         f'training categories {self.categories}')
            setattr(self, f'{which}_set', self._make(records, which == 'train', self.splits[which]))
        self._check_sizes()


class YoloDetectionDataModule(DetectionDataModule):
    """An ultralytics-format dataset, described by its ``data.yaml`` (``path``, ``train``, ``val``, ``test``,
    ``names``). ``test`` defaults to ``val`` when the file has none. ``box_tolerance``: boxes reaching outside
    their image by up to this fraction of its side are clipped (and counted, said once); beyond, an error."""

    def __init__(self, data: str, batch_size: int = 16, num_workers: int = 0, img_size: int = 640, seed: int = 0,
                 augment: DetectionAugment | None = DetectionAugment(), box_tolerance: float = 0.02):
        super().__init__(batch_size, num_workers, img_size, seed, augment)
        BoxCheck(box_tolerance, data)  # checked now, used when the labels are read
        self.box_tolerance = box_tolerance
        self.data = Path(data)
        if not self.data.is_file():
            raise DatasetNotFoundError(f'YOLO data file not found: {self.data} (expected a data.yaml with path, '
                                       f'train, val and names)')
        cfg = read_yaml(self.data)
        names = cfg.get('names') or [str(i) for i in range(int(cfg.get('nc', 0)))]
        self.names = [str(names[k]) for k in sorted(names)] if isinstance(names, dict) else [str(n) for n in names]
        if not self.names:
            raise DetectionDataError(f'{self.data}: no "names" (a list or an {{id: name}} map) and no "nc"')
        self.num_classes = len(self.names)
        self.has_test = bool(cfg.get('test'))
        self.dataset_name = folder_dataset_name('yolo', self.data.parent, self.data)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        for which in ('train', 'val', 'test'):
            split = which if which != 'test' or self.has_test else 'val'
            records, _ = read_yolo(self.data, split, self.box_tolerance)
            setattr(self, f'{which}_set', self._make(records, which == 'train', split))
        self._check_sizes()
