"""Detection data on disk: COCO instances files and ultralytics (YOLO) folders, read into records, with every
bad input named (file, line or annotation) in one line."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._base import DataError, DatasetNotFoundError, image_size

__all__ = ['DetectionDataError', 'IMG_EXTS', 'read_json', 'read_yaml', 'BoxCheck', 'read_coco', 'read_yolo',
           'read_yolo_labels']

log = logging.getLogger('zoo.datasets.detection')
IMG_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')


class DetectionDataError(DataError):
    """Malformed detection data; the message names the file and the line or annotation."""


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
        h, w = (int(im['height']), int(im['width'])) if 'height' in im and 'width' in im else image_size(path, DetectionDataError)
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
        h, w = image_size(img, DetectionDataError)
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
