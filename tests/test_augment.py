"""timm's augmentations in the classification DataModules (issue 46, item 2): the names a recipe gives reach
timm's transform, every classification DataModule yields batches of the documented shape and dtype with them,
the defaults keep each DataModule's own transforms, and wrong names are refused in one line."""
from __future__ import annotations

import random

import pytest
import torch
from test_datasets import _write_images, write_cifar
from timm.data.auto_augment import AutoAugment, RandAugment
from timm.data.random_erasing import RandomErasing
from timm.data.transforms import RandomResizedCropAndInterpolation
from zoo_cli import ROOT, error_line, zoo_in_process

from zoo.datasets import (CIFAR10DataModule, DigitsDataModule, FakeDataModule, ImageFolderDataModule,
                          ShapesDataModule)
from zoo.datasets.augment import OnPIL
from zoo.datasets.digits import RandomShift

RAND = 'rand-m9-mstd0.5-inc1'


def _steps(transform) -> list:
    """The steps of a (possibly wrapped or composed) transform, flattened."""
    if isinstance(transform, OnPIL):
        return _steps(transform.transform)
    inner = getattr(transform, 'transforms', None)
    return [s for t in inner for s in _steps(t)] if inner is not None else [transform]


def _train_transform(dm):
    dm.setup('fit')
    ds = dm.train_set
    ds = getattr(ds, 'dataset', ds)  # a Subset of a torchvision dataset
    return ds.transform


def _first_batch(dm, split='train'):
    dm.setup('fit')
    return next(iter(getattr(dm, f'{split}_dataloader')()))


def _of(steps, cls):
    [found] = [s for s in steps if isinstance(s, cls)]
    return found


def test_rand_augment_and_random_erasing_reach_timm():
    dm = DigitsDataModule(batch_size=8, auto_augment=RAND, re_prob=0.5, re_mode='pixel', re_count=2,
                          scale=[0.5, 1.0], ratio=[0.9, 1.1], hflip=0.0, interpolation='bicubic')
    steps = _steps(_train_transform(dm))
    ra = _of(steps, RandAugment)
    assert ra.num_layers == 2 and len(ra.ops) == 15
    assert all(op.magnitude == 9 and op.magnitude_std == 0.5 for op in ra.ops)
    assert 'SolarizeIncreasing' in [op.name for op in ra.ops]  # inc1: the "increasing" variants
    erase = _of(steps, RandomErasing)
    assert (erase.probability, erase.mode, erase.max_count) == (0.5, 'pixel', 2)
    crop = _of(steps, RandomResizedCropAndInterpolation)
    assert crop.scale == (0.5, 1.0) and crop.ratio == (0.9, 1.1)
    assert 'RandomHorizontalFlip' not in [type(s).__name__ for s in steps]  # hflip: 0.0
    assert not any(isinstance(s, RandomShift) for s in steps)  # timm's pipeline replaces the digits' own shift


@pytest.mark.parametrize('policy', ['original', 'v0'])
def test_auto_augment_policies_reach_timm(tmp_path, policy):
    write_cifar(tmp_path)
    dm = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0, auto_augment=policy)
    aa = _of(_steps(_train_transform(dm)), AutoAugment)
    assert len(aa.policy) == 25  # both policies are 25 sub-policies of two ops


def test_every_classification_datamodule_gives_batches_with_timm_augment(tmp_path):
    write_cifar(tmp_path / 'cifar')
    _write_images(tmp_path / 'folder')
    aug = dict(auto_augment=RAND, re_prob=0.5)
    cases = [
        (DigitsDataModule(batch_size=4, img_size=32, **aug), (4, 1, 32, 32)),
        (DigitsDataModule(batch_size=4, img_size=48, in_chans=3, **aug), (4, 3, 48, 48)),
        (ShapesDataModule(batch_size=4, num_samples=30, img_size=32, **aug), (4, 3, 32, 32)),
        (CIFAR10DataModule(root=str(tmp_path / 'cifar'), batch_size=4, num_workers=0, **aug), (4, 3, 32, 32)),
        (ImageFolderDataModule(root=str(tmp_path / 'folder'), img_size=32, batch_size=2, num_workers=0,
                               val_fraction=0.2, **aug), (2, 3, 32, 32)),
    ]
    torch.manual_seed(0)
    random.seed(0)
    for dm, shape in cases:
        x, y = _first_batch(dm)
        assert x.shape == shape and x.dtype == torch.float32 and y.dtype == torch.long, type(dm).__name__
        assert torch.isfinite(x).all()
        assert _first_batch(dm, 'val')[0].shape[1:] == shape[1:]


def test_digits_stay_grey_and_shapes_keep_their_scale():
    torch.manual_seed(0)
    random.seed(0)
    x, _ = _first_batch(DigitsDataModule(batch_size=16, in_chans=3, auto_augment=RAND))
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])  # timm's ops keep R = G = B
    x, _ = _first_batch(ShapesDataModule(batch_size=16, num_samples=40, auto_augment='original', hflip=0.0))
    assert x.min() >= -1 and x.max() <= 1 and x.min() < -0.5 and x.max() > 0.5  # normalised like x / 127.5 - 1


def test_defaults_keep_the_datamodules_own_transforms(tmp_path):
    """Nothing named: the digits' training batch is the upsampled, normalised images shifted by RandomShift under
    the same seed (what the demo trains on), CIFAR's training transform is the padded crop and flip, and no
    timm step is anywhere."""
    dm = DigitsDataModule(batch_size=8)
    dm.setup('fit')
    assert isinstance(dm.train_set.transform, RandomShift) and dm.timm_augment.named == {}
    loader = dm.train_dataloader()
    order = list(loader.sampler)[:8]
    torch.manual_seed(3)
    x, _ = next(iter(loader))
    torch.manual_seed(3)
    shift = RandomShift(2)
    expected = torch.stack([shift(dm.train_set.images[i]) for i in order])
    assert torch.equal(x, expected)

    write_cifar(tmp_path)
    steps = _steps(_train_transform(CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0)))
    assert [type(s).__name__ for s in steps] == ['ToImage', 'RandomCrop', 'RandomHorizontalFlip', 'ToDtype',
                                                 'Normalize']
    assert _train_transform(ShapesDataModule(batch_size=4, num_samples=30)) is None


def test_training_options_leave_evaluation_alone_and_crop_pct_sets_it(tmp_path):
    write_cifar(tmp_path)
    plain = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0)
    aug = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0, auto_augment=RAND, re_prob=1.0)
    assert torch.equal(_first_batch(plain, 'test')[0], _first_batch(aug, 'test')[0])
    cropped = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0, img_size=32, crop_pct=0.5)
    steps = _steps(cropped._transforms(False))
    assert [type(s).__name__ for s in steps][1:3] == ['Resize', 'CenterCrop'] and steps[1].size == 64
    x = _first_batch(cropped, 'test')[0]
    assert x.shape == (4, 3, 32, 32) and not torch.equal(x, _first_batch(plain, 'test')[0])


@pytest.mark.parametrize('kwargs, expected', [
    (dict(auto_augment='rand-m99x'), "auto_augment 'rand-m99x' is not a timm policy"),
    (dict(auto_augment='origial'), 'did you mean original'),
    (dict(re_mode='cnst'), "re_mode 'cnst' is not one of const, rand, pixel; did you mean const"),
    (dict(interpolation='bicubik'), 'did you mean bicubic'),
    (dict(re_prob=1.5), r're_prob must be a probability in \[0, 1\]'),
    (dict(scale=[1.0, 0.5]), 'scale must be two numbers'),
    (dict(auto_augment='v0', augment=False), 'auto_augment .timm augmentations. cannot apply: augment is false'),
    (dict(crop_pct=0.9), 'crop_pct cannot apply'),
])
def test_bad_names_are_one_line_errors(kwargs, expected):
    with pytest.raises(ValueError, match=expected) as e:
        DigitsDataModule(**kwargs)
    assert '\n' not in str(e.value)
    if 'auto_augment' in kwargs and 'augment' not in kwargs:  # the message says what was expected
        assert 'rand-m9-mstd0.5-inc1' in str(e.value) and 'original, originalr, v0' in str(e.value)


def test_fake_data_refuses_timm_augment():
    with pytest.raises(ValueError, match='FakeDataModule: auto_augment .* noise, not images'):
        FakeDataModule(auto_augment=RAND)


def test_a_wrong_policy_on_the_command_line_is_one_line_exit_2(tmp_path):
    proc = zoo_in_process('fit', '-c', str(ROOT / 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'),
                          '--data.init_args.auto_augment', 'rand-m99x', cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc)
    assert "auto_augment 'rand-m99x' is not a timm policy" in line and 'expected RandAugment' in line
    assert not (tmp_path / 'runs').exists() or not any((tmp_path / 'runs').rglob('*'))  # nothing left behind


def test_posterize_to_zero_bits_gives_a_black_image_not_an_error():
    """RandAugment at magnitude 10 (and AutoAugment v0) posterize to 0 bits, which Pillow 13 refuses."""
    from PIL import Image
    dm = ShapesDataModule(batch_size=4, num_samples=30, auto_augment='rand-m10-inc1')
    [op] = [op for op in _of(_steps(_train_transform(dm)), RandAugment).ops if op.name == 'PosterizeIncreasing']
    op.prob = 1.0
    out = op(Image.new('RGB', (8, 8), (200, 120, 40)))
    assert out.size == (8, 8) and out.getextrema() == ((0, 0), (0, 0), (0, 0))
    torch.manual_seed(0)
    random.seed(0)
    for policy in ('v0', 'rand-m10-inc1'):  # every training image of an epoch goes through
        dm = ShapesDataModule(batch_size=16, num_samples=120, auto_augment=policy)
        dm.setup('fit')
        assert sum(len(x) for x, _ in dm.train_dataloader()) == len(dm.train_set)
