"""`zoo predict -c RECIPE --ckpt_path last --images DIR` (issue 42): a folder of new, unlabelled images, for every
image task, through the command line as a user runs it.

One tiny recipe per task is trained for a couple of batches (a module fixture each), then predicts a folder the test
writes: images of other sizes and modes (RGB, grey, RGBA; PNG and JPEG; a sub-folder) than the recipe's. The files
must be prepared exactly as the test split is (a test image written as a file predicts what the test split
predicts for it), and boxes and masks must land on each file's own pixels. Bad folders, other commands and a
language-modelling recipe are one line, exit 2, nothing written.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from zoo_cli import db_runs, error_line, tree, zoo, zoo_in_process

pytestmark = pytest.mark.xdist_group('test_new_user_predict')

QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']
TRAINER = {'accelerator': 'cpu', 'devices': 1, 'max_epochs': 1, 'limit_train_batches': 2, 'limit_val_batches': 0}


def _recipe(root: Path, name: str, model: dict, data: dict) -> Path:
    path = root / f'{name}.yaml'
    path.write_text(yaml.safe_dump({'seed_everything': 0, 'trainer': TRAINER, 'model': model, 'data': data}))
    return path


def _fit(root: Path, recipe: Path) -> None:
    """``zoo fit`` in this process: the tests check what the fitted run predicts, not the command line of the fit."""
    proc = zoo_in_process('fit', '-c', recipe, *QUIET, cwd=root)
    assert proc.returncode == 0, proc.stderr


def _predict(root: Path, recipe: Path, *args) -> Path:
    """``zoo predict`` of the latest fit: the new run folder, which the closing line names. In this process: the
    tests check the files it writes (the bad-input tests below run the command line itself)."""
    proc = zoo_in_process('predict', '-c', recipe, '--ckpt_path', 'last', *QUIET, *args, cwd=root)
    assert proc.returncode == 0, proc.stderr
    runs = root / 'runs' / recipe.stem
    run = max(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    assert str(run) in proc.stdout + proc.stderr  # the closing line says where the files are
    return run


def _save(path: Path, array: np.ndarray, mode: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode).save(path)


def _noise(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    shape = (h, w, channels) if channels > 1 else (h, w)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


# ------------------------------------------------------------------------------------------------ classification
@pytest.fixture(scope='module')
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp('cls')
    recipe = _recipe(root, 'cls', {'class_path': 'zoo.recipes.ImageClassifier', 'init_args': {'name': 'resnet_tiny'}},
                     {'class_path': 'zoo.datasets.ShapesDataModule',
                      'init_args': {'img_size': 32, 'batch_size': 8, 'num_samples': 60}})
    _fit(root, recipe)
    return root, recipe


def test_classification_writes_file_label_score_top5_as_the_test_split(classifier):
    """predictions.csv: file (below DIR), class name, score and the next four; a test image written as a file
    gets the test split's own probabilities (the same preprocessing); files of any size and mode are read."""
    from zoo.datasets import ShapesDataModule
    from zoo.datasets.shapes import SHAPES

    root, recipe = classifier
    test_run = _predict(root, recipe)
    test_probs = torch.load(test_run / 'predictions.pt')
    dm = ShapesDataModule(img_size=32, batch_size=8, num_samples=60)
    dm.setup()
    folder = root / 'new'
    first = ((dm.test_set.images[0] + 1) * 127.5).round().to(torch.uint8)  # the test split's first image, as uint8
    _save(folder / 'test0.png', first.permute(1, 2, 0).numpy())
    _save(folder / 'wide.jpg', _noise(40, 90, 1))
    _save(folder / 'sub' / 'grey.png', _noise(17, 23, 2, channels=1), 'L')
    _save(folder / 'alpha.png', _noise(64, 48, 3, channels=4), 'RGBA')
    run = _predict(root, recipe, '--images', folder)
    rows = list(csv.DictReader((run / 'predictions.csv').open()))
    assert [r['file'] for r in rows] == ['alpha.png', 'sub/grey.png', 'test0.png', 'wide.jpg']
    assert list(rows[0]) == ['file', 'label', 'score'] + [f'{k}_{r}' for r in range(2, 6) for k in ('label', 'score')]
    for r in rows:
        assert r['label'] in SHAPES and 0 < float(r['score']) <= 1
        assert float(r['score']) >= float(r['score_2']) >= float(r['score_5'])
    row = rows[2]
    assert row['label'] == SHAPES[int(test_probs[0].argmax())]
    assert float(row['score']) == pytest.approx(float(test_probs[0].max()), abs=1e-5)


# ----------------------------------------------------------------------------------------------------- detection
DET_DATA = {'img_size': 64, 'batch_size': 8, 'num_samples': 240, 'min_px': 12, 'max_px': 32, 'augment': None}


@pytest.fixture(scope='module')
def detector(tmp_path_factory):
    """25 batches at a high learning rate: enough for boxes that no longer cover the whole image."""
    root = tmp_path_factory.mktemp('det')
    recipe = _recipe(root, 'det', {'class_path': 'zoo.recipes.Detection',
                                   'init_args': {'name': 'yolo_det_tiny', 'predict_conf': 0.001, 'optimizer': {
                                       'class_path': 'torch.optim.AdamW', 'init_args': {'lr': 0.01}}}},
                     {'class_path': 'zoo.datasets.ShapesDetDataModule', 'init_args': DET_DATA})
    recipe.write_text(recipe.read_text().replace('limit_train_batches: 2', 'limit_train_batches: 25'))
    _fit(root, recipe)
    return root, recipe


def test_detection_draws_boxes_on_each_file_and_undoes_the_letterbox(detector):
    """A 32 x 64 file is letterboxed to the 64-px input with 16 grey rows above and below; the same picture with
    those rows already in it (64 x 64) gives the network the same input, so each of its detections is the first
    file's moved down by exactly 16 px (clipped to each file): the padding is undone to the file's pixels. Each
    picture is drawn at its file's size, and predictions.json names each detection's file."""
    from torchvision.io import decode_image

    from zoo.datasets import ShapesDetDataModule
    from zoo.datasets.detection.transforms import PAD_VALUE

    root, recipe = detector
    dm = ShapesDetDataModule(**DET_DATA)
    dm.setup()
    folder = root / 'new'
    content = np.asarray(Image.fromarray(dm.test_set.original(0).permute(1, 2, 0).numpy()).resize((64, 32)))
    padded = np.full((64, 64, 3), PAD_VALUE, np.uint8)
    padded[16:48] = content
    _save(folder / 'strip.png', content)
    _save(folder / 'padded.png', padded)
    _save(folder / 'sub' / 'big.jpg', _noise(150, 100, 5))
    run = _predict(root, recipe, '--images', folder)
    sizes = {p.relative_to(run / 'predictions').as_posix(): tuple(decode_image(str(p)).shape)
             for p in (run / 'predictions').rglob('*.png')}
    assert sizes == {'strip.png': (3, 32, 64), 'padded.png': (3, 64, 64), 'sub/big.png': (3, 150, 100)}
    dets = json.loads((run / 'predictions.json').read_text())
    by_file = {f: [d for d in dets if d['file'] == f] for f in ('strip.png', 'padded.png', 'sub/big.jpg')}
    assert all(by_file.values()) and len(dets) == sum(map(len, by_file.values()))
    strip, padded = by_file['strip.png'], by_file['padded.png']
    assert len(strip) == len(padded)

    def xyxy(d):
        x, y, w, h = d['bbox']
        return np.array([x, y, x + w, y + h])

    for s, p in zip(strip, padded):  # the same detections in the same order (the same input)
        assert s['category_id'] == p['category_id'] and s['score'] == pytest.approx(p['score'], abs=1e-6)
        expected = np.clip(xyxy(p) - [0, 16, 0, 16], 0, [64, 32, 64, 32])
        assert np.allclose(xyxy(s), expected, atol=1e-3), (s, p)
    assert any(xyxy(s)[1] > 0.5 or xyxy(s)[3] < 31.5 for s in strip), 'every box spans the strip: nothing checked'
    assert all(xyxy(d)[0] >= 0 and xyxy(d)[2] <= 100 + 1e-3 and xyxy(d)[3] <= 150 + 1e-3
               for d in by_file['sub/big.jpg'])  # within the 100 x 150 file


# -------------------------------------------------------------------------------------------------- segmentation
@pytest.fixture(scope='module')
def segmenter(tmp_path_factory):
    root = tmp_path_factory.mktemp('seg')
    recipe = _recipe(root, 'seg', {'class_path': 'zoo.recipes.Segmentation',
                                   'init_args': {'name': 'semfpn_seg_tiny', 'plot_images': 0}},
                     {'class_path': 'zoo.datasets.ShapesSegDataModule',
                      'init_args': {'img_size': 64, 'batch_size': 2, 'num_samples': 24, 'min_px': 12, 'max_px': 32}})
    _fit(root, recipe)
    return root, recipe


def test_segmentation_writes_masks_at_each_files_size_and_the_overlay(segmenter):
    """Per file a palette label PNG at the file's size and the prediction drawn on it (no ground-truth half); the
    test split's image written as a file gets the test split's own mask, pixel for pixel."""
    from zoo.datasets import ShapesSegDataModule

    root, recipe = segmenter
    test_run = _predict(root, recipe)
    [test_label] = (test_run / 'predictions').glob('*.png')
    dm = ShapesSegDataModule(img_size=64, batch_size=2, num_samples=24, min_px=12, max_px=32)
    dm.setup()
    folder = root / 'new'
    image, _ = dm.test_set.original(0)
    _save(folder / 'test0.png', image.permute(1, 2, 0).numpy())
    _save(folder / 'wide.jpg', _noise(40, 100, 6))
    _save(folder / 'sub' / 'alpha.png', _noise(90, 30, 7, channels=4), 'RGBA')
    run = _predict(root, recipe, '--images', folder)
    for name, size in (('test0.png', (64, 64)), ('wide.png', (100, 40)), ('sub/alpha.png', (30, 90))):
        label = Image.open(run / 'predictions' / name)
        assert label.mode == 'P' and label.size == size and max(label.getdata()) < dm.num_classes, name
        assert Image.open(run / 'overlays' / name).size == size, name  # the prediction on the image, no truth half
    assert np.array_equal(np.asarray(Image.open(run / 'predictions' / 'test0.png')), np.asarray(Image.open(test_label)))


# ----------------------------------------------------------------------------------------------------- denoising
def test_denoising_writes_each_denoised_file_at_its_size(tmp_path):
    """The files are the noisy inputs (no noise is added): each comes back as a grey PNG of its own size."""
    recipe = _recipe(tmp_path, 'dn', {'class_path': 'zoo.recipes.Denoiser', 'init_args': {'name': 'dncnn_tiny'}},
                     {'class_path': 'zoo.datasets.PhotoPatchesDataModule',
                      'init_args': {'patch_size': 24, 'batch_size': 4, 'patches_per_epoch': 8, 'max_side': 48,
                                    'train_images': ['camera'], 'held_out_images': ['coins']}})
    _fit(tmp_path, recipe)
    folder = tmp_path / 'noisy'
    _save(folder / 'a.png', _noise(30, 50, 8))
    _save(folder / 'b.jpg', _noise(41, 27, 9, channels=1), 'L')
    run = _predict(tmp_path, recipe, '--images', folder)
    out = {p.name: Image.open(p) for p in (run / 'denoised').glob('*.png')}
    assert {k: (v.mode, v.size) for k, v in out.items()} == {'a.png': ('L', (50, 30)), 'b.png': ('L', (27, 41))}


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize('case, expected', [
    ('missing', 'no such folder'),
    ('empty', 'the folder is empty'),
    ('no_images', 'no image file in it'),
    ('broken', 'broken.png: could not read the image'),
    ('clash', 'a.jpg and a.png would both be written as a.png'),
])
def test_a_bad_folder_is_one_line_and_leaves_nothing(case, expected, classifier):
    root, recipe = classifier
    folder = root / f'bad_{case}'
    if case != 'missing':
        folder.mkdir()
    if case == 'no_images':
        (folder / 'notes.txt').write_text('not an image\n')
    if case == 'broken':
        _save(folder / 'good.png', _noise(8, 8, 0))
        (folder / 'broken.png').write_bytes(b'not a png')
    if case == 'clash':
        _save(folder / 'a.png', _noise(8, 8, 0))
        _save(folder / 'a.jpg', _noise(8, 8, 1))
    before, rows = tree(root / 'runs'), db_runs(root / 'zoo-results.db')
    proc = zoo('predict', '-c', recipe, '--ckpt_path', 'last', '--images', folder, *QUIET, cwd=root)
    line = error_line(proc)
    assert proc.returncode == 2 and line.startswith('zoo predict: error: ') and expected in line, line
    assert tree(root / 'runs') == before and db_runs(root / 'zoo-results.db') == rows


def test_images_on_another_command_is_one_line(tmp_path):
    proc = zoo('fit', '-c', 'poolformer/poolformer_tiny_digits_15e', '--images', tmp_path, cwd=tmp_path)
    assert proc.returncode == 2 and '--images is for zoo predict' in error_line(proc)
    assert tree(tmp_path) == set()


def test_a_language_modelling_recipe_refuses_images(tmp_path):
    _save(tmp_path / 'new' / 'a.png', _noise(8, 8, 0))
    proc = zoo('predict', '-c', 'lm/llama_tiny_copy', '--images', tmp_path / 'new', cwd=tmp_path)
    assert proc.returncode == 2
    assert error_line(proc) == ('zoo predict: error: --images is for image tasks; llama_tiny_copy is a '
                                'language-modelling recipe')
    assert tree(tmp_path) == {'new', 'new/a.png'}
