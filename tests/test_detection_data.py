"""Detection data: transforms keep boxes on their objects, COCO and YOLO folders load and round-trip,
bad data is named, the procedural sets are deterministic and their boxes tight."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torchvision import tv_tensors
from torchvision.io import write_png

from zoo.datasets.detection import (CocoDetectionDataModule, DetectionDataError, DetectionDataset,
                                    DigitsDetDataModule, ShapesDetDataModule, YoloDetectionDataModule, collate,
                                    DetectionAugment, detection_transforms, generate_shapes_det, letterbox,
                                    read_coco, read_yolo)
from zoo.datasets.detection.transforms import NO_AUGMENT
from zoo.layers.detect import unletterbox
from zoo.eval.detection import coco_detections

RED = torch.tensor([255, 0, 0], dtype=torch.uint8)


def _rect_image(h, w, boxes):
    """A grey image with each box (xyxy, integer pixels) filled red."""
    img = torch.full((3, h, w), 60, dtype=torch.uint8)
    for x1, y1, x2, y2 in boxes:
        img[:, y1:y2, x1:x2] = RED[:, None, None]
    return img


def _red_mask(img: torch.Tensor) -> torch.Tensor:
    """Pixels that are clearly red (after any resampling)."""
    img = img.float() if img.dtype == torch.uint8 else img.float() * 255
    return (img[0] > 160) & (img[1] < 90) & (img[2] < 90)


@pytest.mark.parametrize('seed', range(6))
def test_train_transforms_keep_boxes_on_the_filled_rectangles(seed):
    torch.manual_seed(seed)
    rects = [(20, 30, 70, 60), (100, 80, 150, 140)]
    img, target = letterbox(tv_tensors.Image(_rect_image(160, 200, rects)),
                            {'boxes': tv_tensors.BoundingBoxes(torch.tensor(rects, dtype=torch.float), format='XYXY',
                                                               canvas_size=(160, 200)),
                             'labels': torch.tensor([0, 1])}, 128)
    tf = detection_transforms(DetectionAugment(hsv=(0, 0, 0)))  # colour jitter would change "red"
    out, t = tf(img, target)
    mask = _red_mask(out)
    assert len(t['boxes']) == len(t['labels'])
    covered = torch.zeros_like(mask)
    for (x1, y1, x2, y2) in t['boxes'].round().long().tolist():
        inner = mask[y1 + 2:y2 - 2, x1 + 2:x2 - 2]
        if inner.numel():
            assert inner.float().mean() > 0.95, 'the transformed box is not filled by its rectangle'
        covered[max(0, y1 - 2):y2 + 2, max(0, x1 - 2):x2 + 2] = True
    assert not (mask & ~covered).any(), 'red pixels outside every transformed box'


def test_letterbox_and_unletterbox_round_trip_non_square():
    boxes = torch.tensor([[10.0, 20.0, 110.0, 70.0], [0.0, 0.0, 300.0, 100.0]])
    img = tv_tensors.Image(torch.zeros(3, 100, 300, dtype=torch.uint8))
    out, t = letterbox(img, {'boxes': tv_tensors.BoundingBoxes(boxes, format='XYXY', canvas_size=(100, 300)),
                             'labels': torch.tensor([0, 1]), 'orig_size': (100, 300)}, 96)
    assert out.shape == (3, 96, 96) and t['pad'][0] == 0 and t['pad'][1] > 0
    assert torch.allclose(unletterbox(t['boxes'].as_subclass(torch.Tensor), t), boxes, atol=1.0)


def test_mosaic_boxes_follow_their_images():
    rects = [[(8, 8, 40, 40)], [(20, 30, 60, 50)], [(0, 0, 30, 30)], [(30, 30, 64, 64)]]
    records = [(lambda r=r: (_rect_image(64, 64, r), np.asarray(r, np.float32), np.zeros(len(r), np.int64)), i, str(i))
               for i, r in enumerate(rects)]
    no_aug = detection_transforms(NO_AUGMENT)
    ds = DetectionDataset(records, 64, no_aug, mosaic=1.0)
    torch.manual_seed(0)
    for i in range(8):
        img, t = ds[i % 4]
        mask = _red_mask(img)
        covered = torch.zeros_like(mask)
        for (x1, y1, x2, y2) in t['boxes'].round().long().tolist():
            assert mask[y1:y2, x1:x2].float().mean() > 0.95
            covered[y1:y2, x1:x2] = True
        # slivers under 2 px at the crop border are dropped as degenerate boxes; nothing else is uncovered
        covered[:2], covered[-2:], covered[:, :2], covered[:, -2:] = True, True, True, True
        assert not (mask & ~covered).any()


def test_collate_keeps_per_image_counts():
    ds = ShapesDetDataModule(num_samples=20, img_size=64, batch_size=4, min_px=8, max_px=24, augment=None)
    ds.setup()
    x, targets = collate([ds.val_set[i] for i in range(3)])
    assert x.shape == (3, 3, 64, 64) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert [len(t['labels']) for t in targets] == [len(ds.val_set[i][1]['labels']) for i in range(3)]
    assert isinstance(targets[0]['boxes'], tv_tensors.BoundingBoxes)


def test_shapes_det_is_deterministic_and_boxes_are_tight():
    a, boxes, labels = generate_shapes_det(4, 96, seed=3, min_px=12, max_px=40)
    b, boxes2, labels2 = generate_shapes_det(4, 96, seed=3, min_px=12, max_px=40)
    assert torch.equal(a, b) and all(np.array_equal(p, q) for p, q in zip(boxes, boxes2))
    c, _, _ = generate_shapes_det(4, 96, seed=4, min_px=12, max_px=40)
    assert not torch.equal(a, c)
    for bx in boxes:
        assert len(bx) >= 1 and (bx[:, 2:] > bx[:, :2]).all() and (bx >= 0).all() and (bx <= 96).all()
        side = np.maximum(bx[:, 2] - bx[:, 0], bx[:, 3] - bx[:, 1])
        assert (side <= 41).all()


def test_digits_det_classes_and_disjoint_source_digits():
    dm = DigitsDetDataModule(num_samples=30, img_size=64, min_px=12, max_px=30, augment=None, batch_size=4)
    dm.setup()
    assert dm.num_classes == 10 and len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 30
    labels = torch.cat([dm.train_set[i][1]['labels'] for i in range(len(dm.train_set))])
    assert labels.min() >= 0 and labels.max() <= 9 and len(labels.unique()) > 3
    src, targets, train, held = dm._digits
    assert not set(train.tolist()) & set(held.tolist())


# --- COCO -------------------------------------------------------------------------------------------------

def write_coco(root, split='train', bad=None):
    """Three images (one without objects), categories 3 and 7, one crowd annotation."""
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / 'annotations').mkdir(exist_ok=True)
    sizes = {1: (40, 60), 2: (50, 50), 5: (30, 70)}
    for i, (h, w) in sizes.items():
        write_png(torch.randint(0, 255, (3, h, w), dtype=torch.uint8), str(root / split / f'im{i}.png'))
    anns = [dict(id=1, image_id=1, category_id=7, bbox=[5, 6, 20, 10], iscrowd=0, area=200),
            dict(id=2, image_id=1, category_id=3, bbox=[30, 10, 25, 25], iscrowd=0, area=625),
            dict(id=3, image_id=2, category_id=3, bbox=[0, 0, 50, 50], iscrowd=0, area=2500),
            dict(id=4, image_id=2, category_id=7, bbox=[1, 1, 5, 5], iscrowd=1, area=25)]
    images = [dict(id=i, file_name=f'im{i}.png', height=h, width=w) for i, (h, w) in sizes.items()]
    data = dict(images=images, annotations=anns, categories=[dict(id=7, name='cat'), dict(id=3, name='dog')])
    if bad:
        bad(data)
    (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(data))
    return data


def test_coco_loads_and_round_trips(tmp_path):
    data = write_coco(tmp_path, 'train')
    write_coco(tmp_path, 'val')
    dm = CocoDetectionDataModule(str(tmp_path), img_size=64, augment=None, batch_size=2)
    assert dm.num_classes == 2 and dm.categories == [3, 7] and dm.names == ['dog', 'cat']
    dm.setup()
    samples = {dm.val_set[i][1]['image_id']: dm.val_set[i] for i in range(len(dm.val_set))}
    assert set(samples) == {1, 2, 5}
    assert len(samples[5][1]['labels']) == 0  # an image with no objects is valid
    assert samples[2][1]['iscrowd'].tolist() == [False, True]  # the crowd region is kept, flagged
    # back to the file's pixels and COCO category ids: the annotations we wrote
    preds = []
    for i in (1, 2):
        img, t = samples[i]
        preds.append({'boxes': unletterbox(t['boxes'].as_subclass(torch.Tensor), t), 'labels': t['labels'],
                      'scores': torch.ones(len(t['labels']))})
    dets = coco_detections(preds, dm.categories, image_ids=[1, 2])
    written = data['annotations']
    assert sorted((d['image_id'], d['category_id']) for d in dets) == sorted((a['image_id'], a['category_id'])
                                                                               for a in written)
    crowd = {(i, dm.categories[int(l)]): bool(c) for i in (1, 2)
             for l, c in zip(samples[i][1]['labels'], samples[i][1]['iscrowd'])}
    for d in dets:
        a = next(a for a in written if a['image_id'] == d['image_id'] and a['category_id'] == d['category_id'])
        assert np.allclose(d['bbox'], a['bbox'], atol=0.6)
        assert crowd[d['image_id'], d['category_id']] == bool(a['iscrowd'])
    x, targets = next(iter(dm.train_dataloader()))
    assert x.shape[1:] == (3, 64, 64) and len(targets) == 2


@pytest.mark.parametrize('bad,match', [
    (lambda d: d['images'][0].update(file_name='missing.png'), "missing.png.*not found"),
    (lambda d: d['annotations'][0].update(bbox=[50, 6, 20, 10]), 'annotation id 1.*outside the 60x40 image'),
    (lambda d: d['annotations'][1].update(category_id=9), 'annotation id 2.*category_id 9'),
    (lambda d: d['annotations'][1].update(bbox=[1, 2, 3]), r'annotation id 2.*\[x, y, width, height\]'),
])
def test_coco_bad_data_is_named(tmp_path, bad, match):
    write_coco(tmp_path, 'train', bad=bad)
    with pytest.raises(DetectionDataError, match=match):
        read_coco(tmp_path / 'annotations' / 'instances_train.json', tmp_path / 'train')


def test_coco_empty_split(tmp_path):
    write_coco(tmp_path, 'train', bad=lambda d: d.update(images=[], annotations=[]))
    records, _, _ = read_coco(tmp_path / 'annotations' / 'instances_train.json', tmp_path / 'train')
    with pytest.raises(DetectionDataError, match='empty'):
        DetectionDataset(records, 64, name='instances_train.json')


# --- YOLO -------------------------------------------------------------------------------------------------

def write_yolo(root, lines=None, names=('a', 'b', 'c')):
    """train: two images (one without a label file), val: one; a data.yaml."""
    for split, files in (('train', {'x0': (40, 80), 'x1': (64, 64)}), ('val', {'v0': (48, 32)})):
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'labels' / split).mkdir(parents=True, exist_ok=True)
        for name, (h, w) in files.items():
            write_png(torch.randint(0, 255, (3, h, w), dtype=torch.uint8), str(root / 'images' / split / f'{name}.png'))
    default = '0 0.25 0.5 0.25 0.5\n2 0.75 0.5 0.5 1.0\n'
    (root / 'labels' / 'train' / 'x0.txt').write_text(lines if lines is not None else default)
    (root / 'labels' / 'val' / 'v0.txt').write_text('1 0.5 0.5 0.5 0.5\n')
    (root / 'data.yaml').write_text(f'path: {root}\ntrain: images/train\nval: images/val\nnames: {list(names)}\n')
    return root / 'data.yaml'


def test_yolo_loads_and_round_trips(tmp_path):
    data = write_yolo(tmp_path)
    dm = YoloDetectionDataModule(str(data), img_size=64, augment=None, batch_size=2)
    assert dm.num_classes == 3 and dm.names == ['a', 'b', 'c']
    dm.setup()
    by_name = {rec[2].rsplit('/', 1)[-1]: rec for rec in dm.train_set.records}
    _, boxes, labels = by_name['x0.png'][0]()
    assert labels.tolist() == [0, 2]
    assert np.allclose(boxes, [[10, 10, 30, 30], [40, 0, 80, 40]])  # normalised cx cy w h -> xyxy pixels
    _, boxes, labels = by_name['x1.png'][0]()
    assert len(labels) == 0  # no label file: no objects
    i = [k for k, r in enumerate(dm.train_set.records) if r[2].endswith('x0.png')][0]
    img, t = dm.train_set[i]
    expected = torch.tensor([[10.0, 10, 30, 30], [40, 0, 80, 40]])
    assert torch.allclose(unletterbox(t['boxes'].as_subclass(torch.Tensor), t), expected, atol=1)
    assert len(dm.test_set) == 1  # no test split: the validation images


@pytest.mark.parametrize('lines,match', [
    ('0 0.5 0.5 0.2\n', 'x0.txt line 1: expected "class cx cy w h"'),
    ('0 0.5 0.5 0.2 0.2\n1 0.5 oops 0.2 0.2\n', 'x0.txt line 2: not numbers'),
    ('0 0.5 0.5 0.2 0.2\n\n3 0.5 0.5 0.2 0.2\n', 'x0.txt line 3: class id 3 is out of range 0..2'),
    ('0 0.9 0.5 0.4 0.2\n', r'x0.txt line 1 \(cx .*\): box reaches 10.0% of the side outside the image'),
])
def test_yolo_bad_labels_are_named(tmp_path, lines, match):
    data = write_yolo(tmp_path, lines=lines)
    with pytest.raises(DetectionDataError, match=match):
        read_yolo(data, 'train')


def test_yolo_empty_split_and_missing_image(tmp_path):
    data = write_yolo(tmp_path)
    for f in (tmp_path / 'images' / 'val').iterdir():
        f.unlink()
    with pytest.raises(DetectionDataError, match='val split .* holds no images'):
        read_yolo(data, 'val')
    (tmp_path / 'list.txt').write_text('images/train/x0.png\nimages/train/nope.png\n')
    data.write_text(f'path: {tmp_path}\ntrain: list.txt\nval: images/val\nnames: [a, b, c]\n')
    with pytest.raises(DetectionDataError, match="list.txt line 2: image 'images/train/nope.png' not found"):
        read_yolo(data, 'train')


@pytest.mark.parametrize('line, clipped, match', [
    ('0 0.5 0.5 0.4 0.2\n', 0, None),                                  # inside
    ('0 0.805 0.5 0.4 0.2\n', 1, None),                                # 0.5 % outside: clipped, counted
    ('0 0.9 0.5 0.4 0.2\n', 0, r'reaches 10.0% of the side outside the image \(up to box_tolerance=0.02'),
    ('0 0.5 0.5 -0.1 0.2\n', 0, 'box has a negative width'),
])
def test_boxes_outside_the_image_are_clipped_within_the_tolerance(tmp_path, caplog, line, clipped, match):
    """Real datasets (COCO too) have boxes a few pixels outside the image: up to ``box_tolerance`` of the side
    they are clipped and counted (said once), beyond it refused; a negative width is named as such."""
    data = write_yolo(tmp_path, lines=line)
    if match:
        with pytest.raises(DetectionDataError, match=match):
            read_yolo(data, 'train')
        return
    with caplog.at_level('WARNING', logger='zoo.datasets.detection'):
        records, _ = read_yolo(data, 'train')
    said = [r.getMessage() for r in caplog.records if 'clipped' in r.getMessage()]
    assert len(said) == (1 if clipped else 0) and (not clipped or f'{clipped} box(es)' in said[0])
    _, boxes, _ = next(r for r in records if r[2].endswith('x0.png'))[0]()
    assert boxes[:, 2].max() <= 80 and boxes.min() >= 0  # the 40x80 image's width


def test_coco_boxes_within_the_tolerance_are_clipped(tmp_path):
    write_coco(tmp_path, 'train', bad=lambda d: d['annotations'][0].update(bbox=[50, 6, 10.5, 10]))  # 0.5 px out
    records, _, _ = read_coco(tmp_path / 'annotations' / 'instances_train.json', tmp_path / 'train')
    boxes = np.concatenate([r[0]()[1] for r in records])
    assert boxes[:, 2].max() <= 60
    with pytest.raises(DetectionDataError, match='negative width'):
        write_coco(tmp_path, 'train', bad=lambda d: d['annotations'][0].update(bbox=[10, 6, -3, 10]))
        read_coco(tmp_path / 'annotations' / 'instances_train.json', tmp_path / 'train')
