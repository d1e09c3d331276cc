"""The detection recipe from the command line: fit records val/map and val/map50 and writes the PNG grid,
validate / test / predict from the latest run (predict draws boxes and writes COCO JSON), bad input."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / 'recipes' / 'configs' / 'detection' / 'yolo_det_tiny_shapes_det_128.yaml'
SMALL = ['--data.img_size', 64, '--data.num_samples', 40, '--data.batch_size', 4, '--data.min_px', 8,
         '--data.max_px', 24, '--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']

pytest.importorskip('faster_coco_eval')


@pytest.fixture
def runs(runs, monkeypatch):
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '0')
    return runs


def run(command, *args) -> int:
    return main([command, '-c', str(TINY), *map(str, args), *map(str, SMALL)])


def latest(root: Path) -> Path:
    """The newest run folder (evaluation runs included; `latest` points at the newest fit only)."""
    return max(p for p in (root / TINY.stem).iterdir() if p.is_dir() and not p.is_symlink())


def test_fit_logs_map_writes_the_grid_then_validate_test_predict(runs):
    assert run('fit', '--trainer.max_epochs', 1, '--trainer.limit_train_batches', 2, '--trainer.log_every_n_steps',
               1) == 0
    fit_run = latest(runs)
    with open(fit_run / 'metrics.csv') as f:
        rows = list(csv.DictReader(f))
    maps = [float(r['val/map50']) for r in rows if r.get('val/map50')]
    assert maps and all(0.0 <= m <= 1.0 for m in maps) and any(r.get('val/map') for r in rows)
    assert any(r.get('train/box_loss') for r in rows)
    assert list((fit_run / 'val_predictions').glob('epoch000-*.png'))
    assert list(fit_run.glob('checkpoints/best-*.ckpt'))  # monitored on val/map

    assert run('validate', '--ckpt_path', 'last') == 0
    assert run('test', '--ckpt_path', 'best') == 0
    assert run('predict', '--ckpt_path', 'best', '--model.predict_conf', 0.0, '--trainer.limit_predict_batches',
               1) == 0
    pred_run = latest(runs)
    pngs = sorted((pred_run / 'predictions').glob('*.png'))
    assert len(pngs) == 2  # the test split: 5 % of 40 images
    dets = json.loads((pred_run / 'predictions.json').read_text())
    assert dets and {'image_id', 'category_id', 'bbox', 'score'} <= set(dets[0])
    assert all(len(d['bbox']) == 4 and d['bbox'][2] >= 0 for d in dets)


def test_results_database_direction_for_map():
    from zoo.eval.results import is_higher_better
    assert is_higher_better('val/map') and is_higher_better('val/map50')


def test_detection_rejects_a_classifier(runs, capsys):
    assert run('fit', '--model.name', 'poolformer_tiny', '--trainer.fast_dev_run', 'true') == 2
    assert 'Detection trains task="detection" models' in capsys.readouterr().err
