"""Runs that lose nothing: `last.ckpt` is the end of the latest epoch, a checkpoint of another model is
refused, and evaluation runs do not move `latest` (issue 15, items 1-4). Exact resume in every task, and the
checkpoint resolution rules: tests/test_runs.py."""
from __future__ import annotations

from pathlib import Path

import torch

from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
TNT = ROOT / 'recipes' / 'configs' / 'tnt' / 'tnt_tiny_digits_40e.yaml'
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']
# 3 epochs of 4 steps
SHORT = ['-c', str(DEMO), '--seed_everything', '0', '--trainer.max_epochs', '3',
         '--trainer.limit_train_batches', '4', '--trainer.limit_val_batches', '1', *QUIET]


def run_dirs(root: Path, stem: str = DEMO.stem) -> list[Path]:
    return sorted(p for p in (root / stem).glob('*') if p.is_dir() and not p.is_symlink())


def load(path: Path) -> dict:
    return torch.load(path, map_location='cpu', weights_only=False)


def test_last_ckpt_is_the_end_of_the_latest_epoch_not_the_best(runs):
    """Lightning's save_last rewrites last.ckpt only with a new best; with lr 0 the best never improves
    after epoch 0, so that bug would leave last.ckpt at epoch 0."""
    assert main(['fit', *SHORT, '--model.optimizer.lr', '0']) == 0
    [run] = run_dirs(runs)
    last = load(run / 'checkpoints' / 'last.ckpt')
    assert last['epoch'] == 2 and last['global_step'] == 12
    [best] = run.glob('checkpoints/best-*.ckpt')
    assert load(best)['global_step'] == 4  # val accuracy never improves with lr 0: the best stays epoch 0


def test_a_checkpoint_of_another_model_is_refused(runs, capsys):
    tnt = ['-c', str(TNT), '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '1',
           '--trainer.limit_val_batches', '1', *QUIET]
    assert main(['fit', *tnt]) == 0
    [tnt_run] = run_dirs(runs, TNT.stem)
    ckpt = tnt_run / 'checkpoints' / 'last.ckpt'
    before = sorted(p.name for p in runs.rglob('*'))
    capsys.readouterr()
    assert main(['test', '-c', str(DEMO), '--ckpt_path', str(ckpt), *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'holds a tnt_tiny model but the config builds poolformer_tiny' in err[0]
    assert sorted(p.name for p in runs.rglob('*')) == before  # no run folder, nothing moved


def test_a_garbage_ckpt_path_is_one_line(runs, tmp_path, capsys):
    bad = tmp_path / 'bad.ckpt'
    bad.write_bytes(b'not a checkpoint at all')
    assert main(['test', '-c', str(DEMO), '--ckpt_path', str(bad), *QUIET]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'is not a readable Lightning checkpoint' in err[0]
    assert main(['test', '-c', str(DEMO), '--ckpt_path', str(tmp_path / 'missing.ckpt'), *QUIET]) == 2
    assert 'no such file' in capsys.readouterr().err


def test_evaluation_runs_and_failed_fits_leave_latest_alone(runs):
    short = ['-c', str(DEMO), '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2',
             '--trainer.limit_val_batches', '1', *QUIET]
    assert main(['fit', *short]) == 0
    [fit_run] = run_dirs(runs)
    latest = runs / DEMO.stem / 'latest'
    assert latest.resolve() == fit_run.resolve()
    assert main(['validate', *short, '--ckpt_path', 'last']) == 0
    assert main(['test', *short, '--ckpt_path', 'best']) == 0
    assert main(['predict', *short, '--ckpt_path', 'best', '--trainer.limit_predict_batches', '1']) == 0
    assert main(['fit', *short, '--data.batch_size', '100000']) == 2  # fails before training
    assert len(run_dirs(runs)) >= 4 and latest.resolve() == fit_run.resolve()
    assert (latest / 'checkpoints' / 'last.ckpt').is_file()


def test_predict_writes_ids_labels_and_scores(runs):
    short = ['-c', str(DEMO), '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2',
             '--trainer.limit_val_batches', '1', *QUIET]
    assert main(['fit', *short]) == 0
    assert main(['predict', *short, '--ckpt_path', 'last', '--trainer.limit_predict_batches', '2']) == 0
    pred_run = run_dirs(runs)[-1]
    rows = (pred_run / 'predictions.csv').read_text().splitlines()
    assert rows[0] == 'id,label,score' and len(rows) == 1 + 128
    probs = torch.load(pred_run / 'predictions.pt')
    for line in rows[1:4]:
        i, label, score = line.split(',')
        assert int(label) == int(probs[int(i)].argmax()) and abs(float(score) - float(probs[int(i)].max())) < 1e-5
