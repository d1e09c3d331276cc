"""Issue 42, defect 3 and the sweep/benchmark rough edges, through the command line as a new user meets them:
a sweep's trials run in folders of their own (the recipe's ``latest`` and ``best`` stay its own), shipped sweeps
are found by name from any folder, a sweep whose every trial fails exits 1, bad ``--trial-args`` leave nothing,
and ``zoo benchmark`` writes beside the working folder."""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from zoo_cli import ROOT, error_line, tree, zoo, zoo_in_process

RECIPE = 'poolformer/poolformer_tiny_digits_15e'
STEM = 'poolformer_tiny_digits_15e'
# one epoch of one training and one validation batch
FAST = ['--trainer.max_epochs=1', '--trainer.limit_train_batches=1', '--trainer.limit_val_batches=1',
        '--trainer.enable_progress_bar=false', '--trainer.enable_model_summary=false']


def write_sweep(folder: Path, space: str, name: str = 'lr', base: str = f'recipes/configs/{RECIPE}.yaml') -> Path:
    path = folder / f'{name}.py'
    path.write_text(f'BASE = {base!r}\nMETRIC = "val/acc1"\n\ndef space(trial):\n    return {space}\n')
    return path


def _studies(db: Path) -> list[str]:
    import optuna
    return [s.study_name for s in optuna.get_all_study_summaries(f'sqlite:///{db}')]


def test_trials_run_in_folders_of_their_own_and_the_recipe_keeps_its_best(tmp_path):
    """Where the runs go and which checkpoint ``best`` names: the sweep, the tests and the fit run in this process;
    the one refused command runs as the command line."""
    sweep = write_sweep(tmp_path, "{'model.init_args.optimizer.init_args.lr': "
                                  "trial.suggest_float('lr', 1e-3, 1e-2, log=True)}")
    proc = zoo_in_process('sweep', sweep, '--n-trials', '2', '--trial-args', shlex.join(FAST), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = tmp_path / 'runs'
    assert not (runs / STEM).exists(), tree(runs)      # nothing in the recipe's own runs, no `latest` moved
    for n in (0, 1):
        folders = [p for p in (runs / 'sweeps' / 'lr' / f'trial-{n}' / STEM).iterdir() if not p.is_symlink()]
        assert len(folders) == 1 and (folders[0] / 'checkpoints' / 'last.ckpt').is_file()
        assert (runs / 'sweeps' / 'lr' / f'trial-{n}' / STEM / 'latest').resolve() == folders[0].resolve()
    # the recipe has no run of its own yet: `best` says so instead of taking a trial's weights
    none = zoo('test', '-c', RECIPE, '--ckpt_path', 'best', cwd=tmp_path)
    assert none.returncode == 2 and f"no run of {STEM!r}" in error_line(none)
    # a trial's run is testable with its own config and checkpoint (docs/results.md, "Sweeps")
    trial = runs / 'sweeps' / 'lr' / 'trial-1' / STEM / 'latest'
    tested = zoo_in_process('test', '-c', trial / 'config.yaml', '--ckpt_path', trial / 'checkpoints' / 'last.ckpt',
                            '--trainer.limit_test_batches=1', '--trainer.enable_progress_bar=false', cwd=tmp_path)
    assert tested.returncode == 0 and 'test/acc1' in tested.stdout, tested.stderr[-3000:]
    # once the recipe is fitted, `best` is that fit's, whatever the sweep did before
    fit = zoo_in_process('fit', '-c', RECIPE, *FAST, cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    own = [p for p in (runs / STEM).iterdir() if not p.is_symlink()]
    assert len(own) == 1
    best = zoo_in_process('test', '-c', RECIPE, '--ckpt_path', 'best', '--trainer.limit_test_batches=1',
                          '--trainer.enable_progress_bar=false', cwd=tmp_path)
    assert best.returncode == 0, best.stderr[-3000:]
    assert f'--ckpt_path best is {own[0]}/checkpoints/best-' in best.stderr, best.stderr[-3000:]


def test_a_shipped_sweep_is_found_by_name_from_any_folder(tmp_path):
    # --timeout 0: the study is created (the file was found and loaded) and no trial is started; in this process
    # (what is checked is which file was found), the misspelt name below through the command line
    for i, name in enumerate(['poolformer_digits', 'recipes/sweeps/poolformer_digits.py']):
        proc = zoo_in_process('sweep', name, '--study-name', f'by-name-{i}', '--timeout', '0', cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(_studies(tmp_path / 'zoo-results.db')) == ['by-name-0', 'by-name-1']
    before = tree(tmp_path)
    wrong = zoo('sweep', 'poolformr_digits', cwd=tmp_path)
    assert wrong.returncode == 2 and 'did you mean poolformer_digits?' in error_line(wrong)
    assert tree(tmp_path) == before


def test_a_sweep_whose_every_trial_fails_exits_1_saying_why(tmp_path):
    sweep = write_sweep(tmp_path, "{'model.init_args.name': trial.suggest_categorical('name', "
                                  "['poolformer_nope', 'poolformer_tinyy'])}", name='broken',
                        base=RECIPE)           # the base recipe by name, as `zoo fit -c` takes it
    proc = zoo('sweep', sweep, '--n-trials', '2', '--trial-args', shlex.join(FAST), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("zoo sweep: error: every trial of study 'broken' failed (2 of 2); the first, trial 0 "
                           "(failed): KeyError: no model named"), last


def test_bad_trial_args_are_one_line_and_leave_nothing(tmp_path):
    sweep = write_sweep(tmp_path, "{'model.init_args.optimizer.init_args.lr': trial.suggest_float('lr', 1e-3, 1e-2)}")
    before = tree(tmp_path)
    proc = zoo('sweep', sweep, '--trial-args', '--trainer.max_epoch=2', cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc)
    assert 'unknown option --trainer.max_epoch' in line and 'did you mean --trainer.max_epochs' in line, line
    assert tree(tmp_path) == before           # no database (so no study, trial or row) and no run folder


def test_benchmark_run_and_report_write_beside_the_working_folder(tmp_path):
    home, user = tmp_path / 'elsewhere', tmp_path / 'user'
    spec = home / 'benchmarks' / 'tiny.yaml'
    spec.parent.mkdir(parents=True)
    user.mkdir()
    fast = {'trainer.max_epochs': 1, 'trainer.limit_train_batches': 1, 'trainer.limit_val_batches': 1,
            'trainer.num_sanity_val_steps': 0, 'trainer.enable_model_summary': False, 'model.name': 'metaformer_tiny'}
    spec.write_text(yaml.safe_dump({'groups': {'mixers': {
        'task': 'classification', 'dataset': 'digits', 'recipe': RECIPE, 'overrides': fast, 'seeds': [0],
        'entries': {'pooling': {'model.model_args': {'token_mixer': 'pooling', 'dims': [8, 8, 8, 8],
                                                     'depths': [1, 1, 1, 1]}}}}}}, sort_keys=False))
    # run and report in this process (where they write is checked; the run's fit is a subprocess of its own)
    ran = zoo_in_process('benchmark', 'run', spec, '--no-latency', cwd=user)
    assert ran.returncode == 0, ran.stderr[-3000:]
    reported = zoo_in_process('benchmark', 'report', spec, cwd=user)
    assert reported.returncode == 0, reported.stderr[-3000:]
    assert (user / 'benchmarks' / 'tiny.db').is_file() and (user / 'docs' / 'benchmarks' / 'tiny.md').is_file()
    assert tree(home) == {'benchmarks', 'benchmarks/tiny.yaml'}       # nothing beside the benchmark's file
    # the shipped benchmark by name from another folder: its checkout's page is not the default output
    page = ROOT / 'docs' / 'benchmarks' / 'paper_blocks.md'
    mtime = page.stat().st_mtime_ns
    shipped = zoo('benchmark', 'report', 'paper_blocks', cwd=user)
    assert shipped.returncode == 2 and 'benchmarks/paper_blocks.db' in error_line(shipped)
    assert page.stat().st_mtime_ns == mtime
