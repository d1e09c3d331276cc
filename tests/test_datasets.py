"""The built-in DataModules: documented shapes, dtypes, seeded split sizes, the real CIFAR loading path
(a tiny archive in CIFAR's on-disk format) and the errors for missing or corrupt data."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from zoo.datasets import (CIFAR10DataModule, CIFAR100DataModule, DatasetNotFoundError, DigitsDataModule,
                          FakeDataModule, ImageFolderDataModule, ShapesDataModule, generate_shapes, SHAPES)


def _batch(dm, split='train'):
    dm.setup('fit')
    return next(iter(getattr(dm, f'{split}_dataloader')()))


def test_digits_split_shapes_and_determinism():
    dm = DigitsDataModule(batch_size=32, img_size=24)
    x, y = _batch(dm)
    assert x.shape == (32, 1, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.long
    sizes = len(dm.train_set), len(dm.val_set), len(dm.test_set)
    assert sizes == (1258, 359, 180) and sum(sizes) == 1797  # all of scikit-learn's digits, 20 % / 10 % held out
    assert dm.num_classes == 10 and dm.in_chans == 1 and set(dm.train_set.labels.tolist()) == set(range(10))
    again = DigitsDataModule(batch_size=32, img_size=24)
    again.setup('fit')
    assert torch.equal(again.val_set.images, dm.val_set.images)  # fixed, seeded split
    other = DigitsDataModule(split_seed=1, img_size=24)
    other.setup('fit')
    assert not torch.equal(other.val_set.labels, dm.val_set.labels)
    rgb = DigitsDataModule(in_chans=3, augment=False)
    assert _batch(rgb, 'val')[0].shape[1:] == (3, 32, 32)


def test_shapes_are_deterministic_balanced_and_drawn():
    a, ya = generate_shapes(12, size=16, seed=3)
    b, yb = generate_shapes(12, size=16, seed=3)
    c, _ = generate_shapes(12, size=16, seed=4)
    assert a.shape == (12, 3, 16, 16) and a.dtype == torch.uint8
    assert torch.equal(a, b) and torch.equal(ya, yb) and not torch.equal(a, c)
    assert torch.bincount(ya).tolist() == [2] * len(SHAPES)
    # Every image holds a shape: some pixels differ from the background corner.
    fg = (a.int() - a[:, :, :1, :1].int()).abs().sum(1) > 0
    assert fg.flatten(1).any(1).all()
    # A ring is hollow (its centre is background), a circle is not.
    ring, circle = SHAPES.index('ring'), SHAPES.index('circle')
    assert fg[ya == ring].float().mean() < fg[ya == circle].float().mean()
    dm = ShapesDataModule(batch_size=16, num_samples=60, num_classes=4)
    x, y = _batch(dm)
    assert x.shape == (16, 3, 32, 32) and y.max() < 4 and -1 <= x.min() and x.max() <= 1
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (42, 12, 6)
    with pytest.raises(ValueError, match='between 1 and'):
        ShapesDataModule(num_classes=7)


def test_fake_data():
    dm = FakeDataModule(batch_size=4, num_samples=8, num_classes=3, in_chans=2, img_size=16)
    x, y = _batch(dm)
    assert x.shape == (4, 2, 16, 16) and y.max() < 3


def test_bad_sizes_are_clear_errors():
    dm = DigitsDataModule(batch_size=5000)
    with pytest.raises(ValueError, match='larger than the training set'):
        dm.setup('fit')
    with pytest.raises(ValueError, match='fractions'):
        DigitsDataModule(val_fraction=0.7, test_fraction=0.4)
    with pytest.raises(ValueError, match='batch_size'):
        DigitsDataModule(batch_size=0)


def write_cifar(root, n_per_batch=6, hundred=False, seed=0):
    """A tiny archive in CIFAR's on-disk format (pickled dicts, uint8 rows of 3x32x32 in CHW order)."""
    rng = np.random.default_rng(seed)
    folder = root / ('cifar-100-python' if hundred else 'cifar-10-batches-py')
    folder.mkdir(parents=True)
    classes = 100 if hundred else 10
    label_key = 'fine_labels' if hundred else 'labels'
    files = ['train', 'test'] if hundred else [f'data_batch_{i}' for i in range(1, 6)] + ['test_batch']
    written = {}
    for name in files:
        data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, classes, n_per_batch).tolist()
        with open(folder / name, 'wb') as f:
            pickle.dump({'data': data, label_key: labels, 'batch_label': name}, f)
        written[name] = (data, labels)
    meta, key = ('meta', 'fine_label_names') if hundred else ('batches.meta', 'label_names')
    with open(folder / meta, 'wb') as f:
        pickle.dump({key: [f'class{i}' for i in range(classes)]}, f)
    return written


def test_cifar10_reads_the_on_disk_format(tmp_path):
    written = write_cifar(tmp_path)
    dm = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0, val_fraction=0.2, augment=False)
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (24, 6, 6)
    x, y = next(iter(dm.test_dataloader()))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    data, labels = written['test_batch']
    assert y.tolist() == labels[:4]
    # Pixel (c=0, 0, 0) of the first test image, through ToTensor and Normalize.
    expected = (data[0, 0] / 255 - dm.mean[0]) / dm.std[0]
    assert x[0, 0, 0, 0].item() == pytest.approx(expected, abs=1e-5)
    aug = CIFAR10DataModule(root=str(tmp_path), batch_size=4, num_workers=0)
    assert _batch(aug)[0].shape == (4, 3, 32, 32)


def test_cifar100_reads_the_on_disk_format(tmp_path):
    write_cifar(tmp_path, hundred=True, n_per_batch=10)
    dm = CIFAR100DataModule(root=str(tmp_path), batch_size=2, num_workers=0, val_fraction=0.2)
    dm.setup('fit')
    assert dm.num_classes == 100 and (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (8, 2, 10)


def test_cifar_missing_or_corrupt_names_path_and_remedy(tmp_path):
    dm = CIFAR10DataModule(root=str(tmp_path / 'nowhere'), num_workers=0)
    with pytest.raises(DatasetNotFoundError) as e:
        dm.setup('fit')
    msg = str(e.value)
    assert 'cifar-10-batches-py' in msg and 'download' in msg and 'cs.toronto.edu' in msg
    write_cifar(tmp_path)
    (tmp_path / 'cifar-10-batches-py' / 'data_batch_3').write_bytes(b'not a pickle')
    with pytest.raises(DatasetNotFoundError, match='corrupt'):
        CIFAR10DataModule(root=str(tmp_path), num_workers=0).setup('fit')


def _write_images(folder, classes=('cat', 'dog'), per_class=5):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (folder / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / c / f'{i}.png')


def test_image_folder_split_ratio_and_train_val_folders(tmp_path):
    _write_images(tmp_path / 'flat')
    dm = ImageFolderDataModule(str(tmp_path / 'flat'), batch_size=2, num_workers=0, img_size=16, val_fraction=0.2)
    x, y = _batch(dm)
    assert dm.num_classes == 2 and x.shape == (2, 3, 16, 16)
    assert (len(dm.train_set), len(dm.val_set)) == (8, 2)
    _write_images(tmp_path / 'split' / 'train')
    _write_images(tmp_path / 'split' / 'val', per_class=2)
    dm = ImageFolderDataModule(str(tmp_path / 'split'), batch_size=2, num_workers=0, img_size=16)
    dm.setup('fit')
    assert (len(dm.train_set), len(dm.val_set)) == (10, 4)
    assert next(iter(dm.val_dataloader()))[0].shape == (2, 3, 16, 16)


def test_image_folder_errors_name_the_path(tmp_path):
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / 'missing')):
        ImageFolderDataModule(str(tmp_path / 'missing'))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DatasetNotFoundError, match='no class sub-folders'):
        ImageFolderDataModule(str(tmp_path / 'empty'))
    _write_images(tmp_path / 'noval' / 'train')
    with pytest.raises(DatasetNotFoundError, match='no val/ folder'):
        ImageFolderDataModule(str(tmp_path / 'noval'))


def test_epoch_loader_batches_depend_only_on_seed_and_epoch():
    """Order and the worker processes' random draws (augmentation) are those of (seed, epoch): a loader made
    afresh at epoch 3, as after a resume, gives epoch 3's batches; another epoch gives others."""
    import torch
    from torch.utils.data import Dataset

    from zoo.datasets._base import EpochLoader

    class Noisy(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return torch.tensor([float(i)]), torch.rand(1)  # the sample, and a random "augmentation"

    def epoch(e, workers):
        loader = EpochLoader(Noisy(), batch_size=4, shuffle=True, seed=5, num_workers=workers)
        loader.sampler.set_epoch(e)
        return [torch.cat(b, 1) for b in loader]

    for workers in (0, 2):
        if workers == 0:
            torch.manual_seed(0)  # in-process draws come from the global RNG, reseeded per epoch by EpochSeed
        a = epoch(3, workers)
        if workers == 0:
            torch.manual_seed(0)
        b = epoch(3, workers)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x[:, 0], y[:, 0]) for x, y in zip(a, epoch(2, workers)))  # another order
