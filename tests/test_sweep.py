"""``zoo sweep``: every sweep file for two trials, resume after a kill, two processes on one SQLite file,
pruned and failed trials kept, trials linked to run rows."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zoo.recipes.main import main
from zoo.eval import results as R

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted(p for p in (ROOT / 'recipes' / 'sweeps').glob('*.py') if not p.name.startswith('_'))
BASE = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
# Each trial: one epoch of one training batch and one validation batch.
FAST = '--trainer.max_epochs=1 --trainer.limit_train_batches=1 --trainer.limit_val_batches=1'


@pytest.fixture(autouse=True)
def zoo_db(tmp_path, monkeypatch):
    path = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(path))
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'runs'))     # run folders out of the checkout
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '1')
    yield path
    R.close_all()


def _study(name, db):
    import optuna
    return optuna.load_study(study_name=name, storage=R.resolve_url(str(db)))


def _check_links(study, db):
    """Every trial of the study is a run row with its study name and trial number, and vice versa."""
    rows = R.runs(study_name=study.study_name)
    numbers = sorted(t.number for t in study.trials)
    assert sorted(rows.trial_number) == numbers
    for t in study.trials:
        if 'zoo_run_id' in t.user_attrs:
            assert rows.set_index('id').loc[t.user_attrs['zoo_run_id'], 'trial_number'] == t.number
    return rows


def test_there_are_sweeps():
    assert {p.stem for p in SWEEPS} >= {'poolformer_digits', 'metaformer_digits_latency'}


@pytest.mark.parametrize('path', SWEEPS, ids=[p.stem for p in SWEEPS])
def test_every_sweep_runs_two_trials(path, zoo_db, capsys):
    assert main(['sweep', str(path), '--n-trials', '2', '--trial-args', FAST]) == 0
    study = _study(path.stem, zoo_db)
    assert len(study.trials) == 2 and all(t.state.name == 'COMPLETE' for t in study.trials)
    rows = _check_links(study, zoo_db)
    assert (rows.status == 'finished').all() and rows.recipe.str.endswith(BASE.name).all()
    assert set(rows.dataset) == {'digits'} and rows['val/acc1'].between(0, 1).all()
    if len(study.directions) == 2:      # accuracy vs latency: the latency objective is the run's latency row
        lat = R.latency()
        for t in study.trials:
            assert lat.set_index('run_id').loc[t.user_attrs['zoo_run_id'], 'median_ms'] == pytest.approx(t.values[1])
        assert study.best_trials
    # running the same command again resumes: the study already holds 2 trials, nothing is added
    assert main(['sweep', str(path), '--n-trials', '2', '--trial-args', FAST]) == 0
    assert len(_study(path.stem, zoo_db).trials) == 2


def _write_sweep(tmp_path, body: str, name='custom') -> Path:
    p = tmp_path / f'{name}.py'
    p.write_text(f'BASE = {str(BASE)!r}\nMETRIC = "val/acc1"\n' + body)
    return p


def test_pruned_and_failed_trials_are_kept(tmp_path, zoo_db):
    from zoo.recipes.sweep import run_sweep

    sweep = _write_sweep(tmp_path, '''
def space(trial):
    lr = trial.suggest_categorical("lr", [0.002, "nan"])
    return {"model.init_args.optimizer.init_args.lr": lr}

def pruner():
    import optuna
    return optuna.pruners.ThresholdPruner(lower=1.01)      # prunes every trial at its first report

def sampler(seed):
    import optuna
    return optuna.samplers.BruteForceSampler(seed=0)
''')
    study = run_sweep(sweep, n_trials=2, extra_args=FAST.split())
    states = sorted(t.state.name for t in study.trials)
    rows = _check_links(study, zoo_db).set_index('trial_number')
    by_lr = {t.params['lr']: t for t in study.trials}
    assert states == ['FAIL', 'PRUNED']
    assert by_lr[0.002].state.name == 'PRUNED' and rows.loc[by_lr[0.002].number, 'status'] == 'pruned'
    assert by_lr['nan'].state.name == 'FAIL' and rows.loc[by_lr['nan'].number, 'status'] == 'failed'
    assert rows.loc[by_lr['nan'].number, 'error']


def test_a_killed_sweep_resumes_and_its_trial_is_marked_crashed(tmp_path, zoo_db):
    sweep = _write_sweep(tmp_path, '''
N_TRIALS = 2
def space(trial):
    return {"model.init_args.optimizer.init_args.lr": trial.suggest_float("lr", 1e-3, 1e-2, log=True)}
''', name='killme')
    env = {**os.environ, 'ZOO_DB': str(zoo_db)}
    proc = subprocess.Popen([sys.executable, '-m', 'zoo.recipes.main', 'sweep', str(sweep), '--trial-args', FAST],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:                                 # kill it once the first trial has finished and the second has started
        deadline = time.time() + 240
        while time.time() < deadline:
            if zoo_db.exists():
                peek = R.ResultsDB(str(zoo_db), check_crashed=False)
                status = peek.runs().status.tolist()
                peek.close()
                if status == ['finished', 'running']:
                    break
            assert proc.poll() is None, 'the sweep ended before it could be killed'
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    from zoo.recipes.sweep import run_sweep
    study = run_sweep(sweep, extra_args=FAST.split())        # same name: resumes to N_TRIALS trials
    rows = _check_links(study, zoo_db)
    # the trial that was running when the process died is a crashed run, not lost; Optuna's copy is failed
    # at once (not after its heartbeat grace period), and the resumed sweep replaced it: exactly 2 count
    crashed = sorted(rows[rows.status == 'crashed'].trial_number)
    assert len(crashed) == 1 and [t.state.name for t in study.trials if t.number in crashed] == ['FAIL']
    assert sorted(t.state.name for t in study.trials if t.number not in crashed) == ['COMPLETE', 'COMPLETE']
    assert (rows.status == 'finished').sum() == 2 and len(study.trials) == 3
    # and the same command again adds nothing
    assert len(run_sweep(sweep, extra_args=FAST.split()).trials) == 3


def two_worker_gate(gate) -> str:
    """Sweep-file code whose ``wait_for_both_workers()`` holds a worker's first trial until a second worker
    process has started one too (3 minutes at most), so each of two workers is known to run a trial, however
    slowly the second one starts (a fast first worker could otherwise take every trial of a small study)."""
    return f'''
import os, pathlib, time
GATE = pathlib.Path({str(gate)!r})

def wait_for_both_workers():
    GATE.mkdir(exist_ok=True)
    (GATE / str(os.getpid())).touch()
    deadline = time.monotonic() + 180
    while len(list(GATE.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
'''


def test_two_processes_on_one_sqlite_file_lose_no_trial_and_add_none(tmp_path, zoo_db):
    sweep = _write_sweep(tmp_path, two_worker_gate(tmp_path / 'gate') + '''
def space(trial):
    wait_for_both_workers()
    return {"model.init_args.optimizer.init_args.lr": trial.suggest_float("lr", 1e-3, 1e-2, log=True)}

def pruner():
    import optuna
    return optuna.pruners.NopPruner()
''', name='shared')
    env = {**os.environ, 'ZOO_DB': str(zoo_db)}
    R.open_db()
    procs = [subprocess.Popen([sys.executable, '-m', 'zoo.recipes.main', 'sweep', str(sweep), '--n-trials', '3',
                               '--trial-args', FAST], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-3000:]
    study = _study('shared', zoo_db)
    assert len(study.trials) == 3            # exact: trials are created under a lock, never past the target
    assert all(t.state.name == 'COMPLETE' for t in study.trials)
    assert sorted(t.number for t in study.trials) == [0, 1, 2]
    rows = _check_links(study, zoo_db)
    assert (rows.status == 'finished').all() and rows.pid.nunique() == 2   # the gate: each worker ran one
    # a larger target resumes the study and adds exactly the difference (--n-jobs: also exact, see the
    # PostgreSQL test for two workers sharing one study)
    assert main(['sweep', str(sweep), '--n-trials', '4', '--n-jobs', '2', '--trial-args', FAST]) == 0
    assert len(_study('shared', zoo_db).trials) == 4


def test_the_trial_cap_is_exact_with_four_racing_processes(zoo_db):
    """Four processes ask for trials as fast as they can (no training): the study ends with exactly its
    target. Without the lock each worker passes the count before the others' trials exist."""
    code = ('import optuna, sys\nfrom zoo.recipes import sweep as S\n'
            'optuna.logging.set_verbosity(optuna.logging.WARNING)\n'
            'st = S.storage(sys.argv[1])\n'
            'study = optuna.load_study(study_name="race", storage=st)\n'
            'S.work(study, st, 12, lambda t: t.suggest_float("x", 0, 1))\nprint("full")\n')
    import optuna

    from zoo.recipes.sweep import storage
    optuna.create_study(study_name='race', storage=storage(str(zoo_db)))
    procs = [subprocess.Popen([sys.executable, '-c', code, str(zoo_db)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    assert all(o.strip() == 'full' for o, _ in outs)          # every worker stopped on the cap
    trials = _study('race', zoo_db).trials
    assert len(trials) == 12 and sorted(t.number for t in trials) == list(range(12))


def test_a_rejected_configuration_keeps_its_real_error(tmp_path, zoo_db):
    from zoo.recipes.sweep import run_sweep

    sweep = _write_sweep(tmp_path, '''
def space(trial):
    which = trial.suggest_categorical("which", ["bad_name", "bad_value"])
    if which == "bad_name":
        return {"model.init_args.name": "poolformer_nope"}
    return {"model.init_args.optimizer.init_args.lr": "fast"}

def sampler(seed):
    import optuna
    return optuna.samplers.BruteForceSampler(seed=0)
''', name='rejected')
    study = run_sweep(sweep, n_trials=2, extra_args=FAST.split())
    assert [t.state.name for t in study.trials] == ['FAIL', 'FAIL']
    rows = _check_links(study, zoo_db).set_index('trial_number')
    errors = {t.params['which']: rows.loc[t.number, 'error'] for t in study.trials}
    assert (rows.status == 'failed').all()
    assert errors['bad_name'].startswith("KeyError: no model named 'poolformer_nope'"), errors['bad_name']
    assert 'poolformer_tiny' in errors['bad_name']                        # with the registry's close matches
    assert errors['bad_value'].startswith('ArgumentError:') and 'lr' in errors['bad_value'] \
        and 'fast' in errors['bad_value'], errors['bad_value']


def test_bad_sweep_files_are_clear_errors(tmp_path, capsys):
    assert main(['sweep', str(tmp_path / 'nope.py')]) == 2
    assert 'poolformer_digits.py' in capsys.readouterr().err
    bad = tmp_path / 'bad.py'
    bad.write_text('X = 1\n')
    assert main(['sweep', str(bad)]) == 2
    assert 'must define BASE and space' in capsys.readouterr().err
    bad.write_text('BASE = "missing.yaml"\ndef space(t):\n    return {}\n')
    assert main(['sweep', str(bad)]) == 2
    assert 'base recipe missing.yaml not found' in capsys.readouterr().err
    good = SWEEPS[0]
    assert main(['sweep', str(good), '--n-jobs', '0']) == 2
    assert '--n-jobs must be at least 1' in capsys.readouterr().err
    assert main(['sweep', str(good), '--n-trials', '-3']) == 2
    assert '--n-trials must be at least 1' in capsys.readouterr().err
