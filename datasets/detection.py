"""Object-detection data: COCO and YOLO folders, and two procedural sets, all with one sample format.

A sample is ``(image, target)``: ``image`` a float (3, S, S) tensor in [0, 1] (``tv_tensors.Image``) and
``target`` a dict with ``boxes`` (``tv_tensors.BoundingBoxes``, xyxy pixels of the network input), ``labels``
(long, contiguous 0..num_classes-1), ``iscrowd`` (bool, True for a COCO crowd region: ignored by the loss, and by
COCO mAP as COCOeval does), for COCO files the annotation's ``area`` (the file's pixels, as COCOeval's
small / medium / large ranges read it), ``image_id`` (int), ``index`` (the sample's position in its dataset),
``orig_size`` (H, W) of the file and ``scale``/``pad`` of the letterbox (input = orig * scale + pad), so
predictions and boxes map back to the file's pixels with :func:`unletterbox`. :func:`collate` stacks the images and keeps the targets as a list (one per image, any
number of boxes, zero included).

Sources (``DataModule`` / dataset):

- :class:`CocoDetectionDataModule` -- ``root/annotations/instances_<split>.json`` + images in ``root/<split>/``
  (COCO 2017's layout). Category ids are mapped to contiguous labels (sorted by id); ``categories`` maps back.
  Crowd annotations (``iscrowd: 1``) are kept with ``iscrowd`` True: the loss skips them, validation mAP
  ignores detections on them as COCOeval does.
- :class:`YoloDetectionDataModule` -- an ultralytics-format folder: ``data.yaml`` (``path``, ``train``, ``val``,
  optional ``test``, ``names``), ``images/<split>/*.jpg`` and ``labels/<split>/*.txt`` with one
  ``cls cx cy w h`` line per object (normalised to [0, 1]). An image without a label file has no objects.
- :class:`ShapesDetDataModule` -- procedural: several coloured shapes per image on textured backgrounds,
  deterministic by seed (the shapes of :mod:`zoo.datasets.shapes`, 6 classes).
- :class:`DigitsDetDataModule` -- scikit-learn's 1,797 real handwritten digits pasted at random positions and
  scales on larger noisy canvases (classes 0-9); no download.

Training augmentation is ``torchvision.transforms.v2`` (boxes follow every geometric step): optional mosaic
(four images in a 2x2 canvas, a random crop of the input size), horizontal flip, random affine scale and
translation, colour jitter, then boxes are clamped and degenerate ones removed (``SanitizeBoundingBoxes``).
Evaluation keeps every ground-truth box, however small, as COCOeval on the file does.
Files are letterboxed (resized keeping the aspect ratio, padded with grey) to ``img_size``, a multiple of 32.

Bad data raises :class:`DetectionDataError` naming the file (and line or annotation): a missing image, a box
with a negative width or height, a box further outside its image than ``box_tolerance`` (boxes up to it are
clipped, counted and reported once), a class id out of range, a malformed label line, invalid JSON or YAML, a YOLO
split in which no image has a label file, an empty split.
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from ._base import DatasetNotFoundError, ImageDataModule, split_indices
from .shapes import SHAPES, _polygon

__all__ = ['DetectionDataError', 'DetectionDataset', 'collate', 'unletterbox', 'to_file_pixels', 'letterbox',
           'detection_transforms', 'read_coco', 'read_yolo', 'generate_shapes_det', 'generate_digits_det',
           'DetectionDataModule', 'CocoDetectionDataModule', 'YoloDetectionDataModule', 'ShapesDetDataModule',
           'DigitsDetDataModule']

log = logging.getLogger(__name__)
IMG_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')
PAD_VALUE = 114  # letterbox grey (0-255), YOLO's


class DetectionDataError(ValueError):
    """Malformed detection data; the message names the file and the line or annotation."""


# ------------------------------------------------------------------------------------------------ transforms


def letterbox(image, target: dict, size: int):
    """Resize the longer side to ``size`` keeping the aspect ratio, pad (centred, grey) to ``size`` x ``size``.

    Boxes follow (``torchvision.transforms.v2.functional``); ``target`` gets ``scale`` and ``pad`` (left, top).
    """
    h, w = image.shape[-2:]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    left, top = (size - nw) // 2, (size - nh) // 2
    padding = [left, top, size - nw - left, size - nh - top]
    boxes = target['boxes']
    if (nh, nw) != (h, w):
        image, boxes = F.resize(image, [nh, nw], antialias=True), F.resize(boxes, [nh, nw])
    if any(padding):
        image, boxes = F.pad(image, padding, fill=PAD_VALUE), F.pad(boxes, padding)
    return image, {**target, 'boxes': boxes, 'scale': (nw / w, nh / h), 'pad': (left, top)}


def unletterbox(boxes: torch.Tensor, target: dict) -> torch.Tensor:
    """xyxy boxes in network-input pixels -> the original file's pixels (undo :func:`letterbox`), clipped."""
    sx, sy = target.get('scale', (1.0, 1.0))
    px, py = target.get('pad', (0, 0))
    out = (boxes - boxes.new_tensor([px, py, px, py])) / boxes.new_tensor([sx, sy, sx, sy])
    h, w = target.get('orig_size', (None, None))
    if h is not None:
        out[:, 0::2] = out[:, 0::2].clamp(0, w)
        out[:, 1::2] = out[:, 1::2].clamp(0, h)
    return out


def to_file_pixels(dets: Sequence[dict], targets: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """Detections and their ground truth moved back to each file's pixels (:func:`unletterbox` on both), as
    COCOeval on the annotation file sees them: IoUs do not change, but the small / medium / large ranges are
    areas in the file, and a detection's area is taken from its box."""
    dets = [{**d, 'boxes': unletterbox(d['boxes'].float(), t)} for d, t in zip(dets, targets)]
    targets = [{**t, 'boxes': unletterbox(torch.as_tensor(t['boxes']).as_subclass(torch.Tensor).float(), t)}
               for t in targets]
    return dets, targets


class RandomScaleTranslate(v2.Transform):
    """Zoom by a factor in ``scale`` and shift by up to ``translate`` of the side, keeping the canvas size.

    YOLOv8's scale / translate augmentation without the affine warp: one resize, then a pad (grey) and a
    crop, which the boxes follow exactly (``v2.functional`` kernels). Several times cheaper on CPU than
    ``v2.RandomAffine``'s grid sampling for the same effect.
    """

    def __init__(self, scale: Sequence[float] = (0.5, 1.5), translate: float = 0.1, fill: int = PAD_VALUE):
        super().__init__()
        self.scale, self.translate, self.fill = tuple(scale), translate, fill

    def make_params(self, flat_inputs: list) -> dict:
        h, w = v2.query_size(flat_inputs)
        s = float(torch.empty(()).uniform_(*self.scale))
        nh, nw = max(1, round(h * s)), max(1, round(w * s))
        dy, dx = (torch.rand(2) * 2 - 1).mul(self.translate).tolist()
        top, left = round((nh - h) / 2 - dy * h), round((nw - w) / 2 - dx * w)  # crop origin in the resized image
        pad = [max(0, -left), max(0, -top), max(0, left + w - nw), max(0, top + h - nh)]
        return dict(size=[nh, nw], pad=pad, top=top + pad[1], left=left + pad[0], h=h, w=w)

    def transform(self, inpt, params: dict):
        out = self._call_kernel(F.resize, inpt, params['size'], antialias=True)
        if any(params['pad']):
            out = self._call_kernel(F.pad, out, params['pad'], fill=self.fill)
        return self._call_kernel(F.crop, out, params['top'], params['left'], params['h'], params['w'])


def detection_transforms(train: bool, flip: float = 0.5, scale: tuple[float, float] = (0.5, 1.5),
                         translate: float = 0.1, hsv: tuple[float, float, float] = (0.015, 0.7, 0.4),
                         min_size: float = 2.0) -> Callable:
    """The v2 pipeline after letterboxing: (uint8 image, target) -> (float image in [0, 1], target).

    Training: flip, scale/translate (YOLOv8's defaults: scale 0.5, translate 0.1), colour jitter (hue,
    saturation, brightness as YOLOv8's hsv gains), clamp boxes, drop boxes smaller than ``min_size`` pixels.
    Evaluation: only the conversion to float; no box is dropped (a tiny object still counts as a miss).
    """
    if not train:
        return v2.ToDtype(torch.float32, scale=True)
    steps = []
    if flip > 0:
        steps.append(v2.RandomHorizontalFlip(flip))
    if tuple(scale) != (1.0, 1.0) or translate > 0:
        steps.append(RandomScaleTranslate(scale, translate))
    if any(hsv):  # hue costs ~30 ms per 256 px image on CPU (an HSV round trip); 0 skips it
        steps.append(v2.ColorJitter(brightness=hsv[2] or None, saturation=hsv[1] or None, hue=hsv[0] or None))
    steps += [v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(min_size=min_size, labels_getter=_per_box),
              v2.ToDtype(torch.float32, scale=True)]
    return v2.Compose(steps)


def _per_box(inputs) -> tuple[torch.Tensor, ...]:
    """The per-box tensors of an ``(image, target)`` pair that must be dropped with their boxes."""
    target = inputs[1]
    return tuple(target[k] for k in ('labels', 'iscrowd', 'area') if k in target)


def collate(batch: Sequence[tuple]) -> tuple[torch.Tensor, list[dict]]:
    """Stack the images (B, 3, S, S); keep one target dict per image (any number of boxes)."""
    images, targets = zip(*batch)
    return torch.stack([torch.as_tensor(i) for i in images]), list(targets)


# ------------------------------------------------------------------------------------------------ dataset


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
        target = {'boxes': tv_tensors.BoundingBoxes(torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                                    format='XYXY', canvas_size=(h, w)),
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


def _image_loader(path: Path, *annotations: np.ndarray) -> Callable[[], tuple]:
    """``load()`` for one image file: (uint8 image, *annotations) with the annotations as given (boxes, labels
    and optionally iscrowd and area)."""
    def load() -> tuple:
        from torchvision.io import ImageReadMode, decode_image
        if not path.is_file():
            raise DetectionDataError(f'{path}: image not found')
        try:
            return decode_image(str(path), mode=ImageReadMode.RGB), *annotations
        except (RuntimeError, OSError) as e:
            raise DetectionDataError(f'{path}: could not read the image ({e})') from None
    return load


def _image_size(path: Path) -> tuple[int, int]:
    """(H, W) from the file header, without decoding the pixels."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            w, h = im.size
    except (OSError, ValueError) as e:
        raise DetectionDataError(f'{path}: could not read the image ({e})') from None
    return h, w


def read_json(path: Path) -> dict:
    """A JSON file; invalid JSON is a one-line :class:`DetectionDataError` naming the file and the place."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise DetectionDataError(f'{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})') from None


def read_yaml(path: Path) -> dict:
    """A YAML mapping; invalid YAML (or a file that is not a mapping) is a one-line error naming the file."""
    import yaml
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, 'problem_mark', None)
        where = f'line {mark.line + 1}, column {mark.column + 1}: ' if mark is not None else ''
        raise DetectionDataError(f'{path}: not valid YAML ({where}{getattr(e, "problem", None) or e})') from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DetectionDataError(f'{path}: expected a mapping (path, train, val, names), got a {type(data).__name__}')
    return data


class BoxCheck:
    """Boxes checked against their image: a negative width or height is an error; a box up to ``tolerance`` (a
    fraction of the image side) outside the image is clipped to it and counted (COCO and real datasets have
    such boxes); beyond the tolerance it is an error. :meth:`report` says once how many were clipped."""

    def __init__(self, tolerance: float, source: Path):
        if not 0 <= tolerance < 0.5:
            raise ValueError(f'box_tolerance is a fraction of the image side in [0, 0.5), got {tolerance}')
        self.tolerance, self.source, self.clipped, self.worst = tolerance, source, 0, 0.0

    def __call__(self, x1: float, y1: float, x2: float, y2: float, w: float, h: float, where: str, unit: str = 'px'):
        """xyxy in the image's ``unit`` (``px``: ``w``/``h`` pixels; ``normalised``: w = h = 1) -> clipped xyxy."""
        if x2 < x1 or y2 < y1:
            raise DetectionDataError(f'{where}: box has a negative {"width" if x2 < x1 else "height"} '
                                     f'({x2 - x1:.4g} x {y2 - y1:.4g}, {unit})')
        out = max(-x1, -y1, x2 - w, y2 - h, 0.0)  # how far it reaches outside, in the image's unit
        if out > 0:
            side = w if max(-x1, x2 - w) >= max(-y1, y2 - h) else h
            if out > self.tolerance * side + 1e-9:
                image = 'the image' if unit == 'normalised' else f'the {w:g}x{h:g} image'
                raise DetectionDataError(
                    f'{where}: box reaches {out / side:.1%} of the side outside {image} (up to '
                    f'box_tolerance={self.tolerance:g} of the side is clipped to the image; beyond, it is refused)')
            self.clipped += 1
            self.worst = max(self.worst, out / side)
        return max(0.0, x1), max(0.0, y1), min(float(w), x2), min(float(h), y2)

    def report(self) -> None:
        if self.clipped:
            log.warning(f'zoo: {self.clipped} box(es) of {self.source} reached outside their image (by up to '
                        f'{self.worst:.1%} of its side) and were clipped to it (box_tolerance={self.tolerance:g})')


# ------------------------------------------------------------------------------------------------ COCO


def read_coco(ann_file: str | Path, image_dir: str | Path, box_tolerance: float = 0.02):
    """A COCO ``instances_*.json`` -> (records, categories, names): records as :class:`DetectionDataset` takes,
    ``categories[label]`` the COCO category id of each contiguous label, ``names[label]`` its name. Boxes
    reaching outside their image by up to ``box_tolerance`` of its side are clipped (:class:`BoxCheck`)."""
    ann_file, image_dir = Path(ann_file), Path(image_dir)
    if not ann_file.is_file():
        raise DatasetNotFoundError(f'COCO annotations not found: {ann_file} (expected <root>/annotations/'
                                   f'instances_<split>.json)')
    data = read_json(ann_file)
    check = BoxCheck(box_tolerance, ann_file)
    for key in ('images', 'annotations', 'categories'):
        if key not in data:
            raise DetectionDataError(f'{ann_file}: no "{key}" list (a COCO instances file has images, annotations '
                                     f'and categories)')
    cats = sorted(data['categories'], key=lambda c: c['id'])
    categories = [int(c['id']) for c in cats]
    names = [str(c.get('name', c['id'])) for c in cats]
    label_of = {cid: i for i, cid in enumerate(categories)}
    images = {}
    for im in data['images']:
        path = image_dir / im['file_name']
        if not path.is_file():
            raise DetectionDataError(f'{ann_file}: image {im["file_name"]!r} (id {im["id"]}) not found at {path}')
        h, w = (int(im['height']), int(im['width'])) if 'height' in im and 'width' in im else _image_size(path)
        images[im['id']] = (path, h, w, [], [], [], [])
    for a in data['annotations']:
        where = f'{ann_file}: annotation id {a.get("id")}'
        if a.get('image_id') not in images:
            raise DetectionDataError(f'{where}: image_id {a.get("image_id")} is not in "images"')
        path, h, w, boxes, labels, crowd, areas = images[a['image_id']]
        if a.get('category_id') not in label_of:
            raise DetectionDataError(f'{where} ({path.name}): category_id {a.get("category_id")} is not one of the '
                                     f'categories {categories}')
        bbox = a.get('bbox')
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise DetectionDataError(f'{where} ({path.name}): bbox must be [x, y, width, height], got {bbox!r}')
        x, y, bw, bh = map(float, bbox)
        boxes.append(list(check(x, y, x + bw, y + bh, w, h, f'{where} ({path.name}, bbox [x, y, w, h] = {bbox})')))
        labels.append(label_of[a['category_id']])
        crowd.append(bool(a.get('iscrowd', 0)))  # a crowd region: not an object to find, a place to ignore
        areas.append(float(a.get('area', bw * bh)))  # the segment's area: what COCOeval's size ranges read
    check.report()
    records = [(_image_loader(p, np.asarray(b, np.float32).reshape(-1, 4), np.asarray(l, np.int64),
                              np.asarray(c, bool), np.asarray(ar, np.float32)), int(i), str(p))
               for i, (p, _, _, b, l, c, ar) in images.items()]
    return records, categories, names


# ------------------------------------------------------------------------------------------------ YOLO


def _yolo_split(base: Path, spec, yaml_path: Path) -> list[Path]:
    """Image paths of one split: a folder (searched recursively), a .txt list of paths, or a list of these."""
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    paths: list[Path] = []
    for s in specs:
        p = (base / str(s)) if not Path(str(s)).is_absolute() else Path(str(s))
        if p.is_dir():
            paths += sorted(q for q in p.rglob('*') if q.suffix.lower() in IMG_EXTS)
        elif p.is_file() and p.suffix == '.txt':
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if line.strip():
                    q = Path(line.strip())
                    q = q if q.is_absolute() else (base / q)
                    if not q.is_file():
                        raise DetectionDataError(f'{p} line {n}: image {line.strip()!r} not found')
                    paths.append(q)
        else:
            raise DetectionDataError(f'{yaml_path}: split {s!r} not found at {p} (expected a folder of images or a '
                                     f'.txt list of image paths)')
    return paths


def _label_path(img: Path) -> Path:
    """ultralytics' rule: the last ``images`` folder in the path becomes ``labels``, the suffix ``.txt``."""
    parts = list(img.parts)
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] == 'images':
            parts[k] = 'labels'
            break
    return Path(*parts).with_suffix('.txt')


def read_yolo_labels(path: Path, num_classes: int, h: int, w: int, check: BoxCheck | None = None):
    """One ``cls cx cy w h`` label file -> (boxes xyxy pixels (n, 4), labels (n,)); checked line by line
    (``check``: how boxes outside the image are treated, :class:`BoxCheck`)."""
    check = check or BoxCheck(0.02, path)
    boxes, labels = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5:
            raise DetectionDataError(f'{path} line {n}: expected "class cx cy w h" (5 numbers), got {line.strip()!r}')
        try:
            cls = float(fields[0])
            cx, cy, bw, bh = map(float, fields[1:])
        except ValueError:
            raise DetectionDataError(f'{path} line {n}: not numbers: {line.strip()!r}') from None
        if cls != int(cls) or not 0 <= cls < num_classes:
            raise DetectionDataError(f'{path} line {n}: class id {fields[0]} is out of range 0..{num_classes - 1}')
        x1, y1, x2, y2 = check(cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2, 1, 1,
                               f'{path} line {n} (cx {cx}, cy {cy}, w {bw}, h {bh})', unit='normalised')
        boxes.append([x1 * w, y1 * h, x2 * w, y2 * h])
        labels.append(int(cls))
    return np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels, np.int64)


def read_yolo(yaml_file: str | Path, split: str, box_tolerance: float = 0.02):
    """An ultralytics ``data.yaml`` and a split name -> (records, names). Boxes reaching outside their image by
    up to ``box_tolerance`` of its side are clipped (:class:`BoxCheck`); a split in which no image has a label
    file is an error naming the folder searched (a missing or misnamed ``labels/`` folder)."""
    yaml_file = Path(yaml_file)
    if not yaml_file.is_file():
        raise DatasetNotFoundError(f'YOLO data file not found: {yaml_file} (expected a data.yaml with path, train, '
                                   f'val and names)')
    cfg = read_yaml(yaml_file)
    names = cfg.get('names')
    if isinstance(names, dict):
        names = [str(names[k]) for k in sorted(names)]
    if not names:
        if 'nc' not in cfg:
            raise DetectionDataError(f'{yaml_file}: no "names" (a list or an {{id: name}} map) and no "nc"')
        names = [str(i) for i in range(int(cfg['nc']))]
    if split not in cfg or cfg[split] in (None, ''):
        raise DetectionDataError(f'{yaml_file}: no "{split}" split')
    base = Path(cfg.get('path') or '.')
    base = base if base.is_absolute() else (yaml_file.parent / base)
    records, labelled = [], 0
    check = BoxCheck(box_tolerance, f'the {split} labels of {yaml_file}')
    images = _yolo_split(base, cfg[split], yaml_file)
    for i, img in enumerate(images):
        h, w = _image_size(img)
        lbl = _label_path(img)
        labelled += lbl.is_file()
        boxes, labels = (read_yolo_labels(lbl, len(names), h, w, check) if lbl.is_file()
                         else (np.zeros((0, 4), np.float32), np.zeros(0, np.int64)))
        records.append((_image_loader(img, boxes, labels), i, str(img)))
    if not records:
        raise DetectionDataError(f'{yaml_file}: the {split} split ({cfg[split]}) holds no images')
    if not labelled:
        folders = sorted({str(_label_path(img).parent) for img in images})
        raise DetectionDataError(f'{yaml_file}: none of the {len(images)} {split} images has a label file; looked in '
                                 f'{", ".join(folders[:3])}{" ..." if len(folders) > 3 else ""} (a .txt per image, in '
                                 f'the labels/ folder beside images/)')
    check.report()
    return records, names


# ------------------------------------------------------------------------------------------------ procedural


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A dark textured background: a colour gradient, low-frequency blobs and pixel noise, (S, S, 3) float."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = rng.uniform(0, 90, 3)
    grad = rng.uniform(-40, 40, (2, 3))
    img = base + xx[..., None] * grad[0] + yy[..., None] * grad[1]
    for _ in range(3):  # soft blobs
        cy, cx, r = rng.uniform(0, 1, 2).tolist() + [rng.uniform(0.1, 0.4)]
        img += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))[..., None] * rng.uniform(-30, 30, 3)
    img += rng.normal(0, rng.uniform(3, 15), (size, size, 1))
    if rng.random() < 0.5:  # stripes
        f, a = rng.uniform(4, 20), rng.uniform(0, math.pi)
        img += (8 * np.sin(2 * math.pi * f * (xx * math.cos(a) + yy * math.sin(a))))[..., None]
    return img


def _place(rng, size: int, r: float, taken: list, tries: int = 30):
    """A centre for a shape of half-size ``r`` that keeps it inside and clear of the boxes already placed."""
    for _ in range(tries):
        cy, cx = rng.uniform(r, size - r, 2)
        box = (cx - r, cy - r, cx + r, cy + r)
        if all(box[2] + 2 < t[0] or t[2] + 2 < box[0] or box[3] + 2 < t[1] or t[3] + 2 < box[1] for t in taken):
            return cy, cx
    return None


def draw_shapes_det(size: int, rng: np.random.Generator, num_classes: int = len(SHAPES), max_objects: int = 6,
                    min_px: int = 12, max_px: int = 80):
    """One image with 1..max_objects non-overlapping shapes: (S, S, 3) uint8, boxes (n, 4) xyxy, labels (n,).

    Boxes are the tight extent of each shape's drawn pixels."""
    from skimage.draw import disk, polygon
    img = _texture(rng, size)
    boxes, labels, taken = [], [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        cls = int(rng.integers(num_classes))
        r = rng.uniform(min_px, min(max_px, size)) / 2
        c = _place(rng, size, r, taken)
        if c is None:
            continue
        cy, cx = c
        fg = rng.uniform(120, 256, 3)
        fg[rng.integers(3)] = rng.uniform(200, 256)
        shape = SHAPES[cls]
        mask = np.zeros((size, size), bool)
        if shape in ('circle', 'ring'):
            rr, cc = disk((cy, cx), r, shape=mask.shape)
            mask[rr, cc] = True
            if shape == 'ring':
                rr, cc = disk((cy, cx), 0.55 * r, shape=mask.shape)
                mask[rr, cc] = False
        else:
            rr, cc = polygon(*_polygon(shape, cy, cx, r, rng.uniform(0, 2 * math.pi)), shape=mask.shape)
            mask[rr, cc] = True
        ys, xs = np.nonzero(mask)
        if len(ys) == 0:
            continue
        img[mask] = fg
        box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        taken.append(box)
        boxes.append(box)
        labels.append(cls)
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels, np.int64)


def generate_shapes_det(num_samples: int, size: int = 256, num_classes: int = len(SHAPES), seed: int = 0,
                        max_objects: int = 6, min_px: int = 12, max_px: int = 80):
    """``(images (N, 3, S, S) uint8, [boxes (n_i, 4)], [labels (n_i,)])``; image ``i`` from
    ``default_rng([seed, i])``."""
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f'num_classes must be between 1 and {len(SHAPES)} ({", ".join(SHAPES)}), got {num_classes}')
    out = [draw_shapes_det(size, np.random.default_rng([seed, i]), num_classes, max_objects, min_px, max_px)
           for i in range(num_samples)]
    return _stack(out)


def _load_digits() -> tuple[torch.Tensor, np.ndarray]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    return torch.as_tensor(digits.images, dtype=torch.float32) / 16.0, digits.target  # (1797, 8, 8) in [0, 1]


def draw_digits_det(size: int, rng: np.random.Generator, src: torch.Tensor, targets: np.ndarray, pool: np.ndarray,
                    max_objects: int = 6, min_px: int = 12, max_px: int = 80):
    """One canvas with 1..max_objects digits of ``src[pool]`` pasted (bilinear upscaling, alpha = ink).

    Returns like :func:`draw_shapes_det`; boxes are the tight extent of each digit's ink (value > 0.25)."""
    img = _texture(rng, size)
    boxes, labels, taken = [], [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        k = int(pool[rng.integers(len(pool))])
        side = int(rng.uniform(min_px, min(max_px, size)))
        c = _place(rng, size, side / 2, taken)
        if c is None:
            continue
        y0, x0 = int(c[0] - side / 2), int(c[1] - side / 2)
        patch = torch.nn.functional.interpolate(src[k][None, None], size=(side, side), mode='bilinear',
                                                align_corners=False)[0, 0]
        patch = patch.clamp(0, 1).numpy()
        ink = patch > 0.25
        if not ink.any():
            continue
        colour = rng.uniform(170, 256, 3)
        region = img[y0:y0 + side, x0:x0 + side]
        region[:] = region * (1 - patch[..., None]) + colour * patch[..., None]
        ys, xs = np.nonzero(ink)
        boxes.append((float(x0 + xs.min()), float(y0 + ys.min()), float(x0 + xs.max() + 1), float(y0 + ys.max() + 1)))
        taken.append((x0, y0, x0 + side, y0 + side))
        labels.append(int(targets[k]))
    return np.clip(img, 0, 255).astype(np.uint8), np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(labels,
                                                                                                          np.int64)


def generate_digits_det(num_samples: int, size: int = 256, seed: int = 0, max_objects: int = 6, min_px: int = 12,
                        max_px: int = 80, digit_indices: Sequence[int] | None = None):
    """Real 8x8 digits (scikit-learn) pasted at random non-overlapping positions and scales on noisy canvases.

    Returns like :func:`generate_shapes_det`. ``digit_indices`` restricts the source digits (to keep training
    and evaluation digits apart).
    """
    src, targets = _load_digits()
    pool = np.asarray(digit_indices if digit_indices is not None else np.arange(len(targets)))
    return _stack([draw_digits_det(size, np.random.default_rng([seed, i]), src, targets, pool, max_objects, min_px,
                                   max_px) for i in range(num_samples)])


def _stack(samples: list[tuple]):
    images = torch.from_numpy(np.stack([o[0] for o in samples])).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
    return images, [o[1] for o in samples], [o[2] for o in samples]


class _Drawn:
    """A procedural sample drawn on first use and kept (generation is as costly as a training step)."""

    def __init__(self, draw: Callable, seed: tuple, **kwargs):
        self.draw, self.seed, self.kwargs, self.value = draw, seed, kwargs, None

    def __call__(self) -> tuple:
        if self.value is None:
            img, boxes, labels = self.draw(rng=np.random.default_rng(list(self.seed)), **self.kwargs)
            self.value = (torch.from_numpy(img).permute(2, 0, 1).contiguous(), boxes, labels)  # HWC -> CHW
        return self.value


# ------------------------------------------------------------------------------------------------ DataModules


class DetectionDataModule(ImageDataModule):
    """Common loaders for detection: ``collate`` keeps per-image targets; subclasses build the records.

    Args:
        img_size: network input side, a multiple of 32 (images are letterboxed to it).
        mosaic: probability of a 4-image mosaic per training sample.
        flip, scale, translate, hsv: training augmentation (see :func:`detection_transforms`); ``augment=False``
            turns all of it off.
    """

    in_chans = 3
    collate_fn = staticmethod(collate)  # targets stay a list, one dict per image
    names: list[str]
    categories: list[int] | None = None  # COCO category id of each label (None: the label itself)

    def __init__(self, batch_size: int = 16, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 augment: bool = True, mosaic: float = 0.0, flip: float = 0.5, scale: Sequence[float] = (0.5, 1.5),
                 translate: float = 0.1, hsv: Sequence[float] = (0.015, 0.7, 0.4)):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed)
        if img_size % 32:
            raise ValueError(f'img_size must be a multiple of 32 (the detector strides), got {img_size}')
        if not 0 <= mosaic <= 1:
            raise ValueError(f'mosaic is a probability in [0, 1], got {mosaic}')
        self.augment, self.mosaic = augment, mosaic
        self.aug = dict(flip=flip, scale=tuple(scale), translate=translate, hsv=tuple(hsv))

    def train_transform(self):
        aug = self.aug if self.augment else dict(flip=0.0, scale=(1.0, 1.0), translate=0.0, hsv=(0.0, 0.0, 0.0))
        return detection_transforms(train=True, **aug)  # without augmentation still drop degenerate boxes

    def eval_transform(self):
        return detection_transforms(train=False)

    def _make(self, records: list, train: bool, split: str) -> DetectionDataset:
        return DetectionDataset(records, self.img_size, self.train_transform() if train else self.eval_transform(),
                                mosaic=self.mosaic if (train and self.augment) else 0.0,
                                name=f'{type(self).__name__} {split}')


class _ProceduralDet(DetectionDataModule):
    """Generated images split seeded into train / val / test."""

    dataset_name: str

    def __init__(self, batch_size: int = 16, num_workers: int = 0, img_size: int = 256, seed: int = 0,
                 num_samples: int = 1250, val_fraction: float = 0.16, test_fraction: float = 0.04, data_seed: int = 0,
                 num_classes: int | None = None, max_objects: int = 6, min_px: int = 12, max_px: int = 80,
                 augment: bool = True, mosaic: float = 0.0, flip: float = 0.5, scale: Sequence[float] = (0.5, 1.5),
                 translate: float = 0.1, hsv: Sequence[float] = (0.015, 0.7, 0.4)):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mosaic, flip, scale, translate, hsv)
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
        draw = _Drawn(draw_shapes_det, (self.data_seed, i), size=self.img_size, num_classes=self.num_classes,
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
            src, targets = _load_digits()
            train, held = split_indices(len(targets), (0.2,), self.data_seed)
            self._digits = src, targets, train.numpy(), held.numpy()
        src, targets, train, held = self._digits
        pool = train if i in self._train_ids else held
        draw = _Drawn(draw_digits_det, (self.data_seed, i), size=self.img_size, src=src, targets=targets, pool=pool,
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
                 seed: int = 0, augment: bool = True, mosaic: float = 0.0, flip: float = 0.5,
                 scale: Sequence[float] = (0.5, 1.5), translate: float = 0.1,
                 hsv: Sequence[float] = (0.015, 0.7, 0.4), box_tolerance: float = 0.02):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mosaic, flip, scale, translate, hsv)
        BoxCheck(box_tolerance, root)  # checked now, used when the annotations are read
        self.box_tolerance = box_tolerance
        self.root = Path(root)
        self.splits = {'train': train_split, 'val': val_split, 'test': test_split or val_split}
        self.image_dirs = dict(image_dirs or {})
        self.dataset_name = self.root.name or 'coco'
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
                 augment: bool = True, mosaic: float = 0.0, flip: float = 0.5, scale: Sequence[float] = (0.5, 1.5),
                 translate: float = 0.1, hsv: Sequence[float] = (0.015, 0.7, 0.4), box_tolerance: float = 0.02):
        super().__init__(batch_size, num_workers, img_size, seed, augment, mosaic, flip, scale, translate, hsv)
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
        self.dataset_name = self.data.parent.name or 'yolo'

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        for which in ('train', 'val', 'test'):
            split = which if which != 'test' or self.has_test else 'val'
            records, _ = read_yolo(self.data, split, self.box_tolerance)
            setattr(self, f'{which}_set', self._make(records, which == 'train', split))
        self._check_sizes()
