"""Runs that can be trusted in every task (issue 24): for one shipped recipe of every task in the registry,
a run that validates every second epoch writes ``last.ckpt`` at the end of every epoch, and a run killed with
SIGKILL or stopped with Ctrl-C (SIGINT) mid-epoch resumes with ``--ckpt_path last`` to the weights of an
uninterrupted run, bit for bit. Then ``--ckpt_path last|best`` never picks the wrong run.

The tasks and their recipes are enumerated from the registry and ``recipes/configs``: a new task (and its
first recipe) is covered without touching this file, and a task without a shipped recipe fails here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import zoo
from zoo.tasks import names as task_names
from zoo.recipes.main import main
from zoo.recipes.runs import CONFIGS, read_manifest, resolve_checkpoint

ROOT = Path(__file__).resolve().parents[1]
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']
STEPS = 3  # training steps per epoch
IMG = 64  # the largest image side: resuming is exact or not whatever the size (the shipped 128-256 px cost time)


def recipe_task(path: Path) -> str | None:
    """The task of a shipped recipe: its system's ``task``, else its model's in the registry."""
    cfg = yaml.safe_load(path.read_text())
    name = ((cfg.get('model') or {}).get('init_args') or {}).get('name')
    try:
        return zoo.model_info(name).task if name else None
    except KeyError:
        return None


def task_recipes() -> dict[str, Path]:
    """One shipped recipe per task: a tiny one when the task has one (its file name says so), else the first."""
    found: dict[str, list[Path]] = {}
    for path in sorted(CONFIGS.glob('**/*.yaml')):
        found.setdefault(recipe_task(path), []).append(path)
    return {task: min(paths, key=lambda p: ('tiny' not in p.stem, p.stem)) for task, paths in found.items()
            if task is not None}


RECIPES = task_recipes()


def short(config: Path, epochs: int = 4) -> list[str]:
    """``epochs`` epochs of STEPS small batches (images at most IMG px), validating every second epoch on one batch;
    deterministic."""
    data = (yaml.safe_load(config.read_text()).get('data') or {}).get('init_args') or {}
    smaller = ['--data.img_size', str(IMG)] if data.get('img_size', 0) > IMG else []
    return ['-c', str(config), '--seed_everything', '0', '--trainer.max_epochs', str(epochs),
            '--trainer.max_steps', '-1', '--trainer.limit_train_batches', str(STEPS),
            '--trainer.limit_val_batches', '1', '--trainer.val_check_interval', '1.0',
            '--trainer.check_val_every_n_epoch', '2', '--trainer.log_every_n_steps', '50',
            '--data.batch_size', '4', *smaller, '--db', 'none', *QUIET]


def run_dirs(root: Path, stem: str) -> list[Path]:
    return sorted(p for p in (root / stem).glob('*') if p.is_dir() and not p.is_symlink())


def load(path: Path) -> dict:
    return torch.load(path, map_location='cpu', weights_only=True)


def fit_subprocess(runs: Path, args: list[str], callback: str, **init_args) -> subprocess.CompletedProcess:
    """`zoo fit` in a subprocess with one of tests/interrupt_callback.py's callbacks."""
    # One thread here and in this process: float sums (conv backward) depend on the thread count.
    env = {**os.environ, 'ZOO_RUNS': str(runs), 'OMP_NUM_THREADS': '1',
           'PYTHONPATH': os.pathsep.join([str(ROOT / 'tests'), str(ROOT)])}
    env.pop('ZOO_RUN_DIR', None)
    cmd = [sys.executable, '-m', 'zoo.recipes.main', 'fit', *args,
           f'--trainer.callbacks+=interrupt_callback.{callback}']
    cmd += [f'--trainer.callbacks.init_args.{k}={v}' for k, v in init_args.items()]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_every_task_has_a_shipped_recipe():
    tasks = set(task_names())
    assert tasks <= set(RECIPES), f'tasks without a recipe in recipes/configs: {tasks - set(RECIPES)}'


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(RECIPES))
def test_resume_is_exact_in_every_task(task, runs, tmp_path, monkeypatch, one_thread, capsys):
    """Per task: last.ckpt holds epoch e after every epoch e (validation every second epoch: epochs 0 and 2
    have none), and runs killed (SIGKILL) or stopped (SIGINT) mid-way through epoch 2 resume to the final
    weights of the uninterrupted run (max |delta| printed; 0 expected)."""
    config = RECIPES[task]
    args = short(config)
    seen = tmp_path / 'last_epochs.json'
    assert main(['fit', *args, '--trainer.callbacks+=interrupt_callback.RecordLast',
                 f'--trainer.callbacks.init_args.path={seen}']) == 0
    [reference] = run_dirs(runs, config.stem)
    assert json.loads(seen.read_text()) == [[e, e, STEPS * (e + 1)] for e in range(4)]
    expected = load(reference / 'checkpoints' / 'last.ckpt')
    assert (reference / 'metrics.csv').is_file() and read_manifest(reference)['status'] == 'finished'

    report = []
    for sig in ('SIGKILL', 'SIGINT'):
        root = tmp_path / sig
        monkeypatch.setenv('ZOO_RUNS', str(root))
        proc = fit_subprocess(root, args, 'StopAt', step=2 * STEPS + 2, sig=sig)  # mid-way through epoch 2
        assert proc.returncode != 0, proc.stderr[-3000:]
        [killed] = run_dirs(root, config.stem)
        assert load(killed / 'checkpoints' / 'last.ckpt')['epoch'] == 1  # the end of epoch 1
        assert read_manifest(killed)['status'] == ('running' if sig == 'SIGKILL' else 'interrupted')
        if sig == 'SIGINT':  # Ctrl-C also leaves the mid-epoch state
            assert load(killed / 'checkpoints' / 'interrupted.ckpt')['global_step'] == 2 * STEPS + 2
        capsys.readouterr()
        assert main(['fit', *args, '--ckpt_path', 'last']) == 0
        assert 'end of epoch 1, step 6' in capsys.readouterr().err  # says which run and epoch it resumes
        resumed_run = run_dirs(root, config.stem)[-1]
        assert read_manifest(resumed_run)['resumed_from'] == str(killed / 'checkpoints' / 'last.ckpt')
        resumed = load(resumed_run / 'checkpoints' / 'last.ckpt')
        assert resumed['epoch'] == 3 and resumed['global_step'] == expected['global_step']
        delta = max((v.float() - resumed['state_dict'][k].float()).abs().max().item()
                    for k, v in expected['state_dict'].items() if v.is_floating_point())
        report.append(f'{sig} max|delta| {delta:g}')
        for k, v in expected['state_dict'].items():
            assert torch.equal(v, resumed['state_dict'][k]), (task, sig, k)
    print(f'\n{task} ({config.relative_to(CONFIGS)}): last.ckpt epochs {json.loads(seen.read_text())}; '
          + '; '.join(report))


# --------------------------------------------------------------------------------------------- the wrong run
DET = CONFIGS / 'detection' / 'yolo_det_tiny_shapes_det_128.yaml'
TINY_DET = ['-c', str(DET), '--data.img_size', '64', '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2',
            '--trainer.limit_val_batches', '1', '--trainer.check_val_every_n_epoch', '1', '--data.batch_size', '4',
            '--db', 'none', *QUIET]


def _one_line(capfd) -> str:
    """The one error line (Lightning's own INFO lines on the same stream aside)."""
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith('zoo ')]
    assert len(lines) == 1 and ': error: ' in lines[0], lines
    return lines[0]


def test_best_of_a_run_on_other_data_is_one_line_naming_its_run(runs, capfd):
    """The same recipe name trained on 3-class data, evaluated on 2-class data: refused before anything runs."""
    assert main(['fit', *TINY_DET, '--data.num_classes', '3']) == 0
    [trained] = run_dirs(runs, DET.stem)
    before = sorted(p for p in runs.rglob('*'))
    capfd.readouterr()
    assert main(['test', *TINY_DET, '--data.num_classes', '2', '--ckpt_path', 'best']) == 2
    line = _one_line(capfd)
    assert f'(from run {trained})' in line and 'does not fit the model this config builds' in line, line
    assert 'is (3,' in line or '3 there' in line or 'there and' in line, line
    assert sorted(p for p in runs.rglob('*')) == before  # no new run folder, nothing moved


def test_a_newest_run_without_checkpoint_is_refused_naming_both(runs, capfd):
    """The newest fit was killed before its first epoch ended: `last` does not silently take the older run."""
    assert main(['fit', *TINY_DET]) == 0
    [older] = run_dirs(runs, DET.stem)
    proc = fit_subprocess(runs, [*TINY_DET, '--trainer.max_epochs', '2'], 'StopAt', step=1, sig='SIGKILL')
    assert proc.returncode != 0
    newest = run_dirs(runs, DET.stem)[-1]
    assert newest != older and not (newest / 'checkpoints' / 'last.ckpt').exists()
    capfd.readouterr()
    assert main(['fit', *TINY_DET, '--ckpt_path', 'last']) == 2
    line = _one_line(capfd)
    assert newest.name in line and older.name in line and 'has no last checkpoint' in line, line
    assert len(run_dirs(runs, DET.stem)) == 2  # the refused run left no folder


def test_a_failed_run_never_becomes_last_or_latest(runs, capfd):
    """A run that fails on bad data after a step writes no interrupted.ckpt, keeps `latest` where it was, and
    `--ckpt_path last` resolves past it to the last good run."""
    assert main(['fit', *TINY_DET]) == 0
    [good] = run_dirs(runs, DET.stem)
    proc = fit_subprocess(runs, TINY_DET, 'FailAt', step=1)
    assert proc.returncode == 2, proc.stderr[-2000:]
    failed = run_dirs(runs, DET.stem)[-1]
    assert failed != good and read_manifest(failed)['status'] == 'failed'
    assert 'bad data at step 1' in read_manifest(failed)['error']
    assert not (failed / 'checkpoints' / 'interrupted.ckpt').exists()
    assert (runs / DET.stem / 'latest').resolve() == good.resolve()
    assert resolve_checkpoint(runs, DET.stem, 'last') == good / 'checkpoints' / 'last.ckpt'


def _fake_run(root: Path, stem: str, name: str, status: str, ckpts=(), resumed_from=None) -> Path:
    run = root / stem / name
    (run / 'checkpoints').mkdir(parents=True)
    for c in ckpts:
        (run / 'checkpoints' / c).write_bytes(b'x')
    (run / 'run.json').write_text(json.dumps({'command': 'fit', 'status': status, 'resumed_from': resumed_from}))
    return run


def test_resolution_rules(tmp_path):
    """The rules of runs.resolve_checkpoint on folders written here: newest non-failed fit; a newest fit without
    one resolves to where it resumed from, else is refused naming both runs; evaluation runs never count."""
    root = tmp_path
    a = _fake_run(root, 's', '20260101-000000', 'finished', ['last.ckpt', 'best-epoch0-step1.ckpt'])
    assert resolve_checkpoint(root, 's', 'last') == a / 'checkpoints' / 'last.ckpt'
    ev = root / 's' / '20260101-000001'
    ev.mkdir()
    (ev / 'run.json').write_text(json.dumps({'command': 'test', 'status': 'finished'}))
    assert resolve_checkpoint(root, 's', 'best') == a / 'checkpoints' / 'best-epoch0-step1.ckpt'
    _fake_run(root, 's', '20260101-000002', 'failed', ['last.ckpt'])
    assert resolve_checkpoint(root, 's', 'last') == a / 'checkpoints' / 'last.ckpt'
    b = _fake_run(root, 's', '20260101-000003', 'running', resumed_from=str(a / 'checkpoints' / 'last.ckpt'))
    assert resolve_checkpoint(root, 's', 'last') == a / 'checkpoints' / 'last.ckpt'  # where b started from
    with pytest.raises(FileNotFoundError, match=f'{b.name}.*has no best checkpoint.*{a.name}'):
        resolve_checkpoint(root, 's', 'best')
    c = _fake_run(root, 's', '20260101-000004', 'interrupted', ['interrupted.ckpt'])
    assert resolve_checkpoint(root, 's', 'last') == c / 'checkpoints' / 'interrupted.ckpt'
    with pytest.raises(FileNotFoundError, match='no run of'):
        resolve_checkpoint(root, 'other', 'last')


def test_a_one_epoch_fit_without_validation_leaves_its_checkpoint_metrics_and_latest(runs):
    """Validation every second epoch and one epoch: Lightning would save no checkpoint and log nothing."""
    assert main(['fit', *TINY_DET, '--trainer.check_val_every_n_epoch', '2']) == 0
    [run] = run_dirs(runs, DET.stem)
    assert load(run / 'checkpoints' / 'last.ckpt')['epoch'] == 0
    header = (run / 'metrics.csv').read_text().splitlines()[0].split(',')
    assert {'train/epoch_time_s', 'train/samples_per_s', 'train/peak_mem_mb'} <= set(header)
    assert (runs / DET.stem / 'latest').resolve() == run.resolve()
