"""Segmentation data: transforms keep image and mask aligned, the crop's class cap works, every folder format loads
(ADE20K, VOC list / palette / colour masks, Cityscapes-style folders, image + mask folders), reduce_zero_label, bad
data is named, shapes_seg / digits_seg are deterministic, batches have the documented format and the training
order is keyed by (seed, epoch)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from zoo.datasets import (ADE20KDataModule, DigitsSegDataModule, FolderSegDataModule, SegmentationDataError,
                          ShapesSegDataModule, VOCSegDataModule)
from zoo.datasets.segmentation import (IGNORE_INDEX, NO_AUGMENT, CatMaxRandomCrop, RandomResizeRatio,
                                       SegmentationAugment, SegmentationDataset, generate_digits_seg,
                                       generate_shapes_seg, segmentation_transforms, voc_palette)
from zoo.datasets.segmentation.formats import Record

pytestmark = pytest.mark.usefixtures('one_thread')  # many small tensor ops: OpenMP barriers cost more than they give

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RED, BLUE = (230, 20, 20), (20, 20, 230)


def _scene(h=96, w=140):
    """A grey image with a red rectangle (class 1) and a blue disc (class 2); the mask says which pixel is which."""
    img = np.full((h, w, 3), 110, np.uint8)
    mask = np.zeros((h, w), np.int64)
    img[20:60, 10:70], mask[20:60, 10:70] = RED, 1
    yy, xx = np.mgrid[:h, :w]
    disc = (yy - 55) ** 2 + (xx - 105) ** 2 < 22 ** 2
    img[disc], mask[disc] = BLUE, 2
    return torch.from_numpy(img).permute(2, 0, 1).contiguous(), torch.from_numpy(mask)  # HWC -> CHW


def _colour_class(image: torch.Tensor) -> torch.Tensor:
    """Each pixel's class read from its colour: red 1, blue 2, grey 0; -1 for anything else (padding, blends)."""
    rgb = image.float() if image.dtype == torch.uint8 else (image * torch.tensor(STD)[:, None, None]
                                                            + torch.tensor(MEAN)[:, None, None]) * 255
    r, g, b = rgb
    out = torch.full(r.shape, -1, dtype=torch.long)
    out[(r > 180) & (g < 70) & (b < 70)] = 1
    out[(b > 180) & (r < 70) & (g < 70)] = 2
    out[((rgb - 110).abs() < 25).all(0)] = 0
    return out


def _interior(mask: torch.Tensor) -> torch.Tensor:
    """Pixels whose 4 neighbours share their label (resampling may blend the colours at region borders)."""
    m = torch.nn.functional.pad(mask, (1, 1, 1, 1), value=-1)
    c = m[1:-1, 1:-1]
    return (c == m[:-2, 1:-1]) & (c == m[2:, 1:-1]) & (c == m[1:-1, :-2]) & (c == m[1:-1, 2:])


def _assert_aligned(image: torch.Tensor, mask: torch.Tensor) -> None:
    inner = _interior(mask) & (mask != IGNORE_INDEX)
    seen = _colour_class(image)
    assert inner.sum() > 50 and (inner & (mask > 0)).sum() > 20  # a drawn region is in view
    agree = (seen[inner] == mask[inner]).float().mean()
    assert agree > 0.99, f'only {agree:.3f} of the labelled pixels show their class colour'
    for k in (1, 2):  # every clearly red / blue pixel (2 px from a colour border: nearest and bilinear resampling
        # place a border up to a pixel apart) is under its label
        core = (seen == k) & _interior(seen)
        core &= _interior(torch.where(core, k, -1))
        assert (mask[core] == k).all()


STEPS = {
    'resize': lambda: RandomResizeRatio((4 * 64, 64), (0.5, 2.0)),
    'crop': lambda: CatMaxRandomCrop(64, 0.75, fill={tv_tensors.Image: [124, 116, 104], tv_tensors.Mask: 255}),
    'flip': lambda: v2.RandomHorizontalFlip(1.0),
}


@pytest.mark.parametrize('step', sorted(STEPS))
@pytest.mark.parametrize('seed', range(4))
def test_each_geometric_step_keeps_image_and_mask_aligned(step, seed):
    torch.manual_seed(seed)
    img, mask = _scene()
    out, m = STEPS[step]()(tv_tensors.Image(img), tv_tensors.Mask(mask))
    assert isinstance(m, tv_tensors.Mask) and m.dtype == torch.long
    assert set(m.unique().tolist()) <= {0, 1, 2, IGNORE_INDEX}  # nearest interpolation: no new ids
    _assert_aligned(out, m.as_subclass(torch.Tensor))
    if step == 'flip':
        assert torch.equal(m, mask.flip(-1))


@pytest.mark.parametrize('seed', range(8))
def test_training_pipeline_keeps_alignment_and_pads_with_ignore(seed):
    torch.manual_seed(seed)
    img, mask = _scene()
    tf = segmentation_transforms(SegmentationAugment(photometric=0.0), 64, MEAN, STD)  # colour kept to read classes
    out, m = tf(tv_tensors.Image(img), tv_tensors.Mask(mask))
    assert out.shape == (3, 64, 64) and out.dtype == torch.float32 and m.shape == (64, 64)
    m = m.as_subclass(torch.Tensor)
    _assert_aligned(out, m)
    pad = m == IGNORE_INDEX
    if pad.any():  # padding: the mean colour, 0 once normalised
        assert out[:, pad].abs().max() < 0.03


def test_photometric_distortion_changes_only_the_image():
    img, mask = _scene()
    tf = segmentation_transforms(SegmentationAugment(ratio_range=(1, 1), cat_max_ratio=1.0, flip=0.0,
                                                     photometric=1.0), 64, MEAN, STD)
    plain = segmentation_transforms(NO_AUGMENT, 64, MEAN, STD)
    torch.manual_seed(0)
    out, m = tf(tv_tensors.Image(img[:, :64, :64]), tv_tensors.Mask(mask[:64, :64]))
    ref, m0 = plain(tv_tensors.Image(img[:, :64, :64]), tv_tensors.Mask(mask[:64, :64]))
    assert torch.equal(m, m0) and not torch.allclose(out, ref)


def test_eval_transform_resizes_whole_image_nearest_mask():
    img, mask = _scene()
    out, m = segmentation_transforms(None, 64, MEAN, STD)(tv_tensors.Image(img), tv_tensors.Mask(mask))
    assert out.shape == (3, 64, 64) and m.shape == (64, 64)
    assert set(m.unique().tolist()) == {0, 1, 2}
    _assert_aligned(out, m.as_subclass(torch.Tensor))


def test_crop_caps_one_class_share():
    mask = torch.zeros(64, 256, dtype=torch.long)
    mask[:, 200:] = 1  # a window of width 64 meets class 1 in 0..56 columns

    def ok_rate(ratio):
        crop, hits = CatMaxRandomCrop(64, ratio), 0
        inputs = [tv_tensors.Image(torch.zeros(3, 64, 256, dtype=torch.uint8)), tv_tensors.Mask(mask)]
        torch.manual_seed(0)
        for _ in range(200):
            p = crop.make_params(inputs)  # the window the transform crops (its crop is tested above)
            m = mask[p['top']:p['top'] + p['h'], p['left']:p['left'] + p['w']]
            share = torch.bincount(m.reshape(-1), minlength=2).float() / m.numel()
            hits += bool((share > 0).all() and share.max() < 0.75)
        return hits / 200

    capped, free = ok_rate(0.75), ok_rate(1.0)
    assert capped > 0.6 and free < 0.35, (capped, free)


def test_resize_ratio_follows_mmseg_rescale():
    torch.manual_seed(0)
    t = RandomResizeRatio((2048, 512), (1.0, 1.0))
    out = t(tv_tensors.Image(torch.zeros(3, 300, 400, dtype=torch.uint8)))
    assert out.shape[-2:] == (512, 683)  # short side to 512 (long side under 2048), aspect kept
    out = t(tv_tensors.Image(torch.zeros(3, 100, 1000, dtype=torch.uint8)))
    assert out.shape[-2:] == (205, 2048)  # the long side caps it


# --------------------------------------------------------------------------------------------- folders


def _png(path, array, palette=None):
    """A grey (H, W) or RGB (H, W, 3) PNG; with ``palette``, a palette-indexed (mode P) one, VOC's kind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(np.asarray(array, np.uint8))
    if palette is not None:
        im.putpalette([v for c in palette for v in c])  # L -> P, the values become palette indices
    im.save(path)


def _image(path, h=40, w=48, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path)


def _labels(h=40, w=48, values=(0, 1, 2)):
    m = np.zeros((h, w), np.uint8)
    for k, v in enumerate(values):
        m[:, k * w // len(values):(k + 1) * w // len(values)] = v
    return m


def write_ade(root, n_train=3, n_val=2, values=(0, 1, 5, 150)):
    for split, n in (('training', n_train), ('validation', n_val)):
        for i in range(n):
            _image(root / 'images' / split / f'ADE_{split}_{i:04d}.jpg', seed=i)
            _png(root / 'annotations' / split / f'ADE_{split}_{i:04d}.png', _labels(values=values))
    return root


def test_ade20k_loads_with_reduce_zero_label(tmp_path):
    write_ade(tmp_path)
    dm = ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2)
    assert dm.num_classes == 150 and len(dm.class_names) == 150 and dm.ignore_index == 255
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (3, 2, 2)
    _, mask = dm.train_set.original(0)
    assert mask.shape == (40, 48) and sorted(mask.unique().tolist()) == [0, 4, 149, 255]  # 0 -> 255, k -> k - 1
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (2, 32, 32) and y.dtype == torch.long
    x, targets = next(iter(dm.val_dataloader()))  # evaluation: one target per image, the file's mask at its size
    assert set(torch.stack([t['mask'] for t in targets]).unique().tolist()) <= {0, 4, 149, 255}
    assert [t['file_mask'].shape for t in targets] == [(40, 48)] * 2 and targets[1]['index'] == 1
    assert targets[0]['orig_size'] == (40, 48) and targets[0]['scale'] == (32 / 48, 32 / 40)
    assert torch.equal(targets[1]['file_mask'], dm.val_set.original(1)[1])
    assert dm.val_set.files[0].endswith('ADE_validation_0000.jpg')
    assert dm.val_set.meta(1)['mask'].name == 'ADE_validation_0001.png'

    keep = ADE20KDataModule(str(tmp_path), reduce_zero_label=False, img_size=32, batch_size=2)
    keep.setup('fit')
    assert keep.num_classes == 151 and keep.class_names[0] == 'other'
    assert sorted(keep.train_set.original(0)[1].unique().tolist()) == [0, 1, 5, 150]


@pytest.mark.parametrize('table', ['objectInfo150.csv', 'objectInfo150.txt'])
def test_ade20k_class_names_from_object_info(tmp_path, table):
    write_ade(tmp_path, values=(0, 1, 2))
    rows = [('Idx', 'Ratio', 'Train', 'Val', 'Name'), ('1', '0.1', '1', '1', 'wall'),
            ('2', '0.1', '1', '1', '"building;edifice"' if table.endswith('csv') else 'building, edifice'),
            ('3', '0.1', '1', '1', 'sky')]
    sep = ',' if table.endswith('csv') else '\t'
    (tmp_path / table).write_text('\n'.join(sep.join(r) for r in rows) + '\n')
    dm = ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2)
    assert dm.class_names == ['wall', 'building', 'sky'] and dm.num_classes == 3


VOC_PAL = voc_palette(256)


def write_voc(root, colour=False):
    (root / 'ImageSets' / 'Segmentation').mkdir(parents=True)
    for split, names in (('train', ['a', 'b', 'c']), ('val', ['d', 'e'])):
        (root / 'ImageSets' / 'Segmentation' / f'{split}.txt').write_text('\n'.join(names) + '\n')
        for i, n in enumerate(names):
            _image(root / 'JPEGImages' / f'{n}.jpg', seed=i)
            ids = _labels(values=(0, 15, 255))  # background, person, VOC's boundary
            if colour:
                _png(root / 'SegmentationClass' / f'{n}.png', np.asarray(VOC_PAL, np.uint8)[ids])
            else:
                _png(root / 'SegmentationClass' / f'{n}.png', ids, palette=VOC_PAL)
    return root


@pytest.mark.parametrize('colour', [False, True], ids=['palette-indexed', 'rgb-colours'])
def test_voc_list_files_with_palette_or_colour_masks(tmp_path, colour):
    write_voc(tmp_path, colour)
    dm = VOCSegDataModule(str(tmp_path), img_size=32, batch_size=3)
    assert dm.num_classes == 21 and dm.class_names[15] == 'person' and dm.palette[15] == VOC_PAL[15]
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set)) == (3, 2)
    assert sorted(dm.train_set.original(1)[1].unique().tolist()) == [0, 15, 255]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (3, 3, 32, 32) and y.dtype == torch.long and set(y.unique().tolist()) <= {0, 15, 255}


def test_cityscapes_style_folders_by_matching_names(tmp_path):
    for split, cities in (('train', ['aachen', 'bonn']), ('val', ['lindau'])):
        for k, city in enumerate(cities):
            stem = f'{city}_000000_00001{k}'
            _image(tmp_path / 'leftImg8bit' / split / city / f'{stem}_leftImg8bit.png', seed=k)
            _png(tmp_path / 'gtFine' / split / city / f'{stem}_gtFine_labelTrainIds.png', _labels(values=(0, 18, 255)))
            _png(tmp_path / 'gtFine' / split / city / f'{stem}_gtFine_color.png', np.zeros((40, 48, 3)))  # not read
    (tmp_path / 'classes.txt').write_text('\n'.join(f'c{k}' for k in range(19)) + '\n')
    dm = VOCSegDataModule(str(tmp_path), classes_file=str(tmp_path / 'classes.txt'), image_dir='leftImg8bit',
                          mask_dir='gtFine', img_suffix='_leftImg8bit.png', mask_suffix='_gtFine_labelTrainIds.png',
                          img_size=32, batch_size=2)
    dm.setup('fit')
    assert dm.num_classes == 19 and (len(dm.train_set), len(dm.val_set)) == (2, 1)
    assert sorted(dm.val_set.original(0)[1].unique().tolist()) == [0, 18, 255]


def write_folder(root, by_split=True, n=5, values=(0, 1, 2)):
    for i in range(n):
        sub = ('train' if i < 3 else 'val') if by_split else ''
        _image(root / 'imgs' / sub / f'im{i}.png', seed=i)
        _png(root / 'masks' / sub / f'im{i}.png', _labels(values=values))
    (root / 'classes.txt').write_text('sky\nroad\ncar\n')
    return root


@pytest.mark.parametrize('by_split', [True, False], ids=['split-folders', 'seeded-split'])
def test_image_and_mask_folders_with_class_names(tmp_path, by_split):
    write_folder(tmp_path, by_split)
    dm = FolderSegDataModule(str(tmp_path / 'imgs'), str(tmp_path / 'masks'), str(tmp_path / 'classes.txt'),
                             img_size=32, batch_size=2, val_fraction=0.4)
    assert dm.class_names == ['sky', 'road', 'car'] and dm.num_classes == 3
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set)) == (3, 2) and dm.test_set is dm.val_set
    x, targets = next(iter(dm.val_dataloader()))
    y = torch.stack([t['mask'] for t in targets])
    assert x.shape == (2, 3, 32, 32) and set(y.unique().tolist()) == {0, 1, 2}


def test_folder_colour_masks_and_ignore_value(tmp_path):
    pal = [(0, 0, 0), (128, 64, 128), (0, 0, 142)]
    for i in range(4):
        _image(tmp_path / 'imgs' / f'{i}.jpg', seed=i)
        _png(tmp_path / 'masks' / f'{i}.png', np.asarray(pal, np.uint8)[_labels(values=(0, 1, 2))])
    (tmp_path / 'classes.txt').write_text('bg\nroad\ncar\n')
    dm = FolderSegDataModule(str(tmp_path / 'imgs'), str(tmp_path / 'masks'), str(tmp_path / 'classes.txt'),
                             palette=pal, img_size=32, batch_size=2, val_fraction=0.25)
    dm.setup('fit')
    assert sorted(dm.train_set.original(0)[1].unique().tolist()) == [0, 1, 2]
    # a grey mask whose stored 0 means "unlabelled": ignore_index=0 -> 255
    for i in range(4):
        _png(tmp_path / 'masks' / f'{i}.png', _labels(values=(0, 1, 2)))
    grey = FolderSegDataModule(str(tmp_path / 'imgs'), str(tmp_path / 'masks'), str(tmp_path / 'classes.txt'),
                               ignore_index=0, img_size=32, batch_size=2, val_fraction=0.25)
    grey.setup('fit')
    assert sorted(grey.train_set.original(0)[1].unique().tolist()) == [1, 2, 255]


# --------------------------------------------------------------------------------------------- bad data


def _one_line(e) -> str:
    text = str(e.value)
    assert '\n' not in text
    return text


def test_image_without_its_mask_is_named(tmp_path):
    write_ade(tmp_path)
    (tmp_path / 'annotations' / 'training' / 'ADE_training_0001.png').unlink()
    with pytest.raises(SegmentationDataError, match='ADE_training_0001.jpg: no mask') as e:
        ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2).setup('fit')
    _one_line(e)


def test_mask_of_another_size_is_named(tmp_path):
    write_ade(tmp_path)
    _png(tmp_path / 'annotations' / 'training' / 'ADE_training_0002.png', _labels(h=30))
    with pytest.raises(SegmentationDataError, match=r'ADE_training_0002.png: mask is 48x30 but its image') as e:
        ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2).setup('fit')
    _one_line(e)
    # and when a loader gives the pixels (records of any source are checked when they load)
    ds = SegmentationDataset([Record(lambda: (torch.zeros(3, 8, 8, dtype=torch.uint8), np.zeros((8, 9))), 'x.png')],
                             num_classes=2)
    with pytest.raises(SegmentationDataError, match=r'x.png: mask is 9x8 but its image is 8x8'):
        ds[0]


def test_class_id_out_of_range_is_named(tmp_path):
    write_ade(tmp_path, values=(0, 1, 151))  # 151 -> 150 after reduce_zero_label: beyond the 150 classes
    dm = ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2)
    with pytest.raises(SegmentationDataError, match=r'ADE_training_0000.png: stored value\(s\) \[151\] match no '
                                                    r'class; expected 1..150 .* or 0 / 255 \(ignored\)') as e:
        dm.setup('fit')  # at setup (every mask is read), with the value the file stores
    _one_line(e)
    # records of any source are checked again when they load (a generated mask holds class ids)
    ds = SegmentationDataset([Record(lambda: (torch.zeros(3, 8, 8, dtype=torch.uint8), np.full((8, 8), 3)), 'x')],
                             num_classes=2)
    with pytest.raises(SegmentationDataError, match=r'x: class id\(s\) \[3\] out of range 0..1'):
        ds[0]


def test_palette_colour_of_no_class_is_named(tmp_path):
    write_voc(tmp_path, colour=True)
    bad = np.asarray(VOC_PAL, np.uint8)[_labels(values=(0, 15))]
    bad[5, 7] = (1, 2, 3)
    _png(tmp_path / 'SegmentationClass' / 'b.png', bad)
    dm = VOCSegDataModule(str(tmp_path), img_size=32, batch_size=3)
    with pytest.raises(SegmentationDataError, match=r'b.png: colour \(1, 2, 3\) \(first at row 5, column 7\) maps '
                                                    r'to no class') as e:
        dm.setup('fit')  # every mask is read at setup
    _one_line(e)


def test_empty_split_and_missing_listed_image_are_named(tmp_path):
    write_ade(tmp_path, n_val=0)
    (tmp_path / 'images' / 'validation').mkdir(parents=True, exist_ok=True)
    (tmp_path / 'annotations' / 'validation').mkdir(parents=True, exist_ok=True)
    with pytest.raises(SegmentationDataError, match=r'val split \(.*validation\): the split is empty') as e:
        ADE20KDataModule(str(tmp_path), img_size=32, batch_size=2).setup('fit')
    _one_line(e)
    voc = write_voc(tmp_path / 'voc')
    (voc / 'ImageSets' / 'Segmentation' / 'val.txt').write_text('d\nzz\n')
    with pytest.raises(SegmentationDataError, match=r'val.txt line 2: image .*zz.jpg not found'):
        VOCSegDataModule(str(voc), img_size=32, batch_size=2).setup('fit')


def test_bad_data_errors_are_usage_errors():
    from zoo.datasets import DataError, DetectionDataError
    assert issubclass(SegmentationDataError, DataError) and issubclass(DetectionDataError, DataError)
    assert issubclass(DataError, ValueError)  # exit code 2 on the command line (recipes/errors.py: usage_errors)


# --------------------------------------------------------------------------------------------- procedural


def test_shapes_seg_is_deterministic_and_masks_cover_the_drawn_shapes():
    a, ma = generate_shapes_seg(6, size=64, seed=3)
    b, mb = generate_shapes_seg(6, size=64, seed=3)
    c, mc = generate_shapes_seg(6, size=64, seed=4)
    assert torch.equal(a, b) and torch.equal(ma, mb) and not torch.equal(a, c)
    assert a.shape == (6, 3, 64, 64) and a.dtype == torch.uint8 and ma.shape == (6, 64, 64) and ma.dtype == torch.long
    assert ma.min() >= 0 and ma.max() <= 6 and (ma > 0).any() and (ma == 0).any()
    # a shape pixel has the shape's bright colour (one channel >= 200); the background texture is darker
    bright = a.max(1).values >= 200
    assert bright[ma > 0].all()
    assert bright[ma == 0].float().mean() < 0.02


def test_digits_seg_is_deterministic_with_digit_classes():
    a, ma = generate_digits_seg(4, size=64, seed=1)
    b, mb = generate_digits_seg(4, size=64, seed=1)
    assert torch.equal(a, b) and torch.equal(ma, mb)
    assert ma.max() <= 10 and (ma > 0).any()
    ink = a.float().mean(1)  # digits are blended in bright colours on a darker texture
    assert ink[ma > 0].mean() > ink[ma == 0].mean() + 40


@pytest.mark.parametrize('cls, classes', [(ShapesSegDataModule, 7), (DigitsSegDataModule, 11)])
def test_procedural_datamodules_batch_format(cls, classes):
    dm = cls(num_samples=16, img_size=64, batch_size=4, val_fraction=0.25, test_fraction=0.125)
    assert dm.num_classes == classes and len(dm.class_names) == classes and dm.class_names[0] == 'background'
    assert dm.ignore_index == 255 and dm.img_size == 64 and dm.in_chans == 3 and len(dm.mean) == len(dm.std) == 3
    assert len(dm.palette) == classes
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (10, 4, 2)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        x, y = next(iter(loader))
        if loader.dataset.targets:  # evaluation: one target per image (its metadata and the file's mask)
            assert all(t['pad'] == (0, 0) and t['scale'] == (1.0, 1.0) and t['orig_size'] == (64, 64) for t in y)
            assert all(torch.equal(t['file_mask'], t['mask']) for t in y)  # drawn at S: the file is the input
            y = torch.stack([t['mask'] for t in y])
        assert type(x) is torch.Tensor and type(y) is torch.Tensor
        assert x.shape == (4, 3, 64, 64) and x.dtype == torch.float32
        assert y.shape == (4, 64, 64) and y.dtype == torch.long
        assert ((y >= 0) & (y < classes) | (y == 255)).all()
    again = cls(num_samples=16, img_size=64, batch_size=4, val_fraction=0.25, test_fraction=0.125)
    again.setup('fit')
    assert torch.equal(again.val_set.original(0)[1], dm.val_set.original(0)[1])
    img, mask = dm.test_set.original(1)
    assert img.dtype == torch.uint8 and img.shape == (3, 64, 64) and mask.shape == (64, 64)


def test_training_order_is_keyed_by_seed_and_epoch():
    dm = ShapesSegDataModule(num_samples=16, img_size=64, batch_size=4, val_fraction=0.25, test_fraction=0.125)
    dm.setup('fit')

    def epoch(e):
        loader = dm.train_dataloader()  # a loader made afresh, as after a resume
        loader.sampler.set_epoch(e)
        torch.manual_seed(e)  # in-process augmentation draws from the global RNG, reseeded per epoch by EpochSeed
        return list(loader)

    a, b, c = epoch(3), epoch(3), epoch(4)
    assert all(torch.equal(x, y) and torch.equal(m, n) for (x, m), (y, n) in zip(a, b))
    assert not all(torch.equal(m, n) for (_, m), (_, n) in zip(a, c))
    order = list(dm.train_dataloader().sampler)
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    assert sorted(order) == sorted(loader.sampler) and order != list(loader.sampler)
