"""``zoo sweep``: Optuna studies over recipes, stored in the results database.

A sweep is a Python file under ``recipes/sweeps/`` with a define-by-run search space::

    BASE = 'recipes/configs/poolformer/poolformer_tiny_digits_quick.yaml'   # the recipe every trial starts from
    METRIC = 'val/acc1'                                    # what the trial returns (its final value)
    DIRECTIONS = ('maximize',)                             # or ('maximize', 'minimize'): accuracy vs latency (ms)
    N_TRIALS = 20                                          # default --n-trials

    def space(trial) -> dict:                              # dotted LightningCLI keys -> values
        return {'model.init_args.optimizer.init_args.lr': trial.suggest_float('lr', 1e-4, 1e-2, log=True)}

Optional: ``sampler(seed)`` and ``pruner()`` returning Optuna objects, ``ARGS`` (extra CLI arguments
for every trial), ``SEED``. A shipped sweep is found by name from any folder (``zoo sweep poolformer_digits``).
``ARGS`` and ``--trial-args`` are parsed against the recipe before the study exists (``check_trial_args``), so a
bad one leaves nothing. Each trial writes its run below a run root of its own,
``<run_root>/sweeps/<study>/trial-<n>/`` (``runs.trial_run_root``), never into the recipe's runs.

Storage is the results database URL itself (Optuna's tables beside ``zoo_*``), so ``--study-name``
resumes a study after a crash or kill (``load_if_exists``), and every trial is also a run row with
``study_name`` and ``trial_number``. ``--n-trials N`` is the number of trials the study should hold
when done (complete + pruned + failed, running ones included), so re-running the same command resumes
instead of adding N more. The count is exact with ``--n-jobs`` and several processes: each worker runs
Optuna's ask-and-tell loop (its public interface) and counts and asks under one lock shared by every worker
(``work``), so together they create exactly the missing trials (``MaxTrialsCallback`` counts after a trial
ends, so N workers finishing together would start up to N - 1 too many). A trial whose worker was killed (its
run row ``crashed``) is failed in Optuna and does not count: the resumed sweep replaces it.

Single-objective studies prune with optuna-integration's ``PyTorchLightningPruningCallback``
(``MedianPruner`` by default). Multi-objective studies (the second objective is the trained model's
batch-1 CPU latency in ms) cannot prune (``Trial.report`` raises for them) and use an explicitly
chosen sampler, TPE (multivariate), so results do not move with Optuna's default.

SQLite and several workers: Optuna's FAQ advises against SQLite for parallel optimisation ("database
is locked"). We give Optuna's engine a long busy timeout and record heartbeats, which our tests show
loses no trial with two processes on one file; for many machines use a PostgreSQL URL.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .recording import TrialContext

ROOT = Path(__file__).resolve().parents[1]


class SweepError(ValueError):
    """A sweep file or a sweep run is not usable as given."""




@dataclass
class Sweep:
    path: Path
    base: Path
    metric: str
    directions: tuple
    n_trials: int
    module: Any

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1


SWEEPS = Path(__file__).parent / 'sweeps'  # the shipped sweeps, installed with the package


def shipped_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS.glob('*.py') if not p.name.startswith('_'))


def find_sweep(value: str | os.PathLike) -> Path:
    """A sweep as a file: a path that exists, else a shipped sweep by its name from any folder
    (``poolformer_digits`` or the README's ``recipes/sweeps/poolformer_digits.py``), as ``runs.find_recipe``
    finds recipes. An unknown name lists close matches."""
    path = Path(value)
    if path.is_file():
        return path
    name = str(value).replace('\\', '/').removesuffix('.py').rsplit('recipes/sweeps/', 1)[-1]
    names = shipped_sweeps()
    if name in names:
        return SWEEPS / f'{name}.py'
    close = difflib.get_close_matches(name.rsplit('/', 1)[-1], names, n=3, cutoff=0.6)
    raise SweepError(f'sweep file {value} not found, and no shipped sweep is named so'
                     + (f"; did you mean {' or '.join(close)}?" if close else '')
                     + f' (shipped: {", ".join(f"{n}.py" for n in names) or "none"}; or pass a sweep file)')


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Import a sweep file (or a shipped sweep by name) and check what it declares."""
    path = find_sweep(path)
    spec = importlib.util.spec_from_file_location(f'zoo_sweep_{path.stem}', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    missing = [n for n in ('BASE', 'space') if not hasattr(mod, n)]
    if missing:
        raise SweepError(f'{path} must define {" and ".join(missing)} (BASE = the recipe config, '
                         'space(trial) -> {"model.init_args.lr": trial.suggest_float(...), ...})')
    base = Path(mod.BASE)
    for cand in (base, Path.cwd() / base, ROOT / base, path.parent / base):
        if cand.is_file():
            base = cand.resolve()
            break
    else:
        from .runs import find_recipe

        try:  # a shipped recipe by name, as `zoo fit -c` takes it
            base = find_recipe(str(mod.BASE)).resolve()
        except FileNotFoundError as e:
            raise SweepError(f'{path}: base recipe {mod.BASE} not found (looked in the working directory and '
                             f'{ROOT}): {e}') from None
    metric = getattr(mod, 'METRIC', 'val/acc1')
    known = _metric_direction(metric)   # the task's (zoo.tasks) or the results database's word for the metric
    directions = tuple(getattr(mod, 'DIRECTIONS', (known or 'maximize',)))
    if not 1 <= len(directions) <= 2 or any(d not in ('maximize', 'minimize') for d in directions):
        raise SweepError(f"{path}: DIRECTIONS must be ('maximize'|'minimize',) or (metric direction, 'minimize') "
                         f'for latency; got {directions}')
    if known is not None and directions[0] != known:  # e.g. maximising an error: the sweep would seek the worst
        better = 'higher' if known == 'maximize' else 'lower'
        raise SweepError(f'{path}: DIRECTIONS[0] is {directions[0]!r}, but {better} {metric} is better ({known!r}); '
                         'drop DIRECTIONS (the metric\'s direction is the default) or fix it')
    return Sweep(path=path, base=base, metric=metric, directions=directions,
                 n_trials=int(getattr(mod, 'N_TRIALS', 10)), module=mod)


def _metric_direction(metric: str) -> str | None:
    """'maximize' or 'minimize' for a metric whose direction is known (a task's primary metric or board column,
    or one of the results database's tables), else None."""
    from zoo.eval.results import ResultsDBError, is_higher_better
    try:
        return 'maximize' if is_higher_better(metric) else 'minimize'
    except ResultsDBError:
        return None


def counted_trials(trials, crashed_numbers) -> int:
    """How many trials count towards ``--n-trials``: every trial, running ones included, except those of a
    killed worker (their run row is ``crashed``), which a resumed sweep replaces."""
    return sum(t.number not in crashed_numbers for t in trials)


def fail_crashed_trials(storage, study_id: int, name: str) -> set[int]:
    """Trial numbers of the study whose run row is ``crashed`` (a killed worker); those still RUNNING in Optuna
    are failed now."""
    from optuna.trial import TrialState

    from zoo.eval.results import open_db

    store = open_db(storage.url)
    store.mark_crashed()
    rows = store.runs(study_name=name, status='crashed', columns=['trial_number'])
    crashed = {int(n) for n in rows.trial_number.dropna()}
    for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in crashed:
            storage.set_trial_state_values(storage.get_trial_id_from_study_id_trial_number(study_id, t.number),
                                           TrialState.FAIL)
    return crashed


def storage(db: str | None = None):
    """Optuna's RDB storage on the results database URL (a long busy timeout for SQLite). A killed worker's trial
    is failed through its run row (``fail_crashed_trials``), not left running forever."""
    from zoo.eval.results import open_db, resolve_url

    url = resolve_url(db)
    if url is None:
        raise SweepError('a sweep needs a database (ZOO_DB=none disables it); pass --db PATH')
    open_db(url)            # our tables and migrations first; a bad file is reported by the results store
    kw = {'connect_args': {'timeout': 120}} if url.startswith('sqlite') else {'pool_pre_ping': True}
    # Workers started together on a fresh database race to create Optuna's tables and stamp its schema
    # version: they take turns under one lock, so the later ones open what the first made.
    with _lock(url, open_db(url).engine, 'optuna-lock', _STORAGE_LOCK):
        import optuna
        return optuna.storages.RDBStorage(url, engine_kwargs=kw)


_STORAGE_LOCK = 0x7A6F6F4F50          # PostgreSQL advisory lock key of Optuna's table creation ('zooOP')
_TRIAL_LOCK = 0x7A6F6F0000            # + the study id: one lock per study


def _lock(url: str, engine, name: str, key: int):
    """The results store's lock (``ResultsDB.lock``): a file lock beside a SQLite file, an advisory lock on
    PostgreSQL, shared by every worker on one database."""
    from zoo.eval.results import open_db

    return open_db(url).lock(name, key)


def _sampler(sweep: Sweep, seed: int | None):
    import optuna

    if hasattr(sweep.module, 'sampler'):
        return sweep.module.sampler(seed)
    # Chosen explicitly (Optuna 5 changed the multi-objective default from NSGA-II to TPE): TPE handles
    # the small budgets of CPU sweeps; constant_liar keeps parallel workers from sampling the same point.
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def _pruner(sweep: Sweep):
    import optuna

    if sweep.multi_objective:
        return optuna.pruners.NopPruner()        # Trial.report raises for multi-objective studies
    if hasattr(sweep.module, 'pruner'):
        return sweep.module.pruner()
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)


def _given(sweep: Sweep, extra_args: list[str], option: str) -> str | None:
    """The value the sweep file's ARGS and ``--trial-args`` give ``option`` (the last one wins, as in LightningCLI)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument(option, dest='value')
    return p.parse_known_args([*getattr(sweep.module, 'ARGS', []), *extra_args])[0].value


def _argv(sweep: Sweep, params: dict, extra_args: list[str], ctx: TrialContext) -> list[str]:
    argv = ['fit', '-c', str(sweep.base)]       # absolute: jsonargparse changes directory while it parses
    for key, value in params.items():
        argv.append(f'--{key}={value if isinstance(value, str) else json.dumps(value)}')
    # last: the trial writes below a run root of its own, never into the recipe's runs (runs.trial_run_root)
    from .runs import trial_run_root

    root = _given(sweep, extra_args, '--run_root') or os.environ.get('ZOO_RUNS', 'runs')
    return argv + list(getattr(sweep.module, 'ARGS', [])) + list(extra_args) + [
        f'--run_root={trial_run_root(root, ctx.study_name, ctx.trial_number)}']


def check_trial_args(sweep: Sweep, extra_args: list[str]) -> None:
    """The base recipe with the sweep file's ARGS and ``--trial-args``, parsed as a trial would parse them and
    nothing built, so a bad argument is one line before any study, trial, run folder or row exists."""
    from .cli import check_arguments

    try:
        check_arguments(['fit', '-c', str(sweep.base), *getattr(sweep.module, 'ARGS', []), *extra_args])
    except Exception as e:  # the CLI's one-line error (close matches included)
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise SweepError(f'--trial-args: {msg}') from None


def _run_cli(argv: list[str], ctx: TrialContext | None = None) -> None:
    """Run one trial's ``zoo fit``. A configuration rejected before training (a bad value, an unknown
    model) is raised, not just printed, so the trial's run row keeps the real error."""
    from .cli import run_cli

    try:
        rc = run_cli(argv, raise_errors=True, trial=ctx).code
    except Exception as e:
        msg = f'{type(e).__name__}: {e.args[0] if isinstance(e, KeyError) and e.args else e}'
        if ctx is not None and ctx.status is None:
            ctx.error = msg
        raise SweepError(f'zoo {" ".join(argv)}: {msg}') from e
    if rc not in (None, 0):
        raise SweepError(f'zoo {" ".join(argv)} exited with status {rc}')


def _start_trial_run(sweep: Sweep, params: dict, extra_args: list[str], ctx: TrialContext) -> int:
    """The trial's run row, written before anything else, so a trial killed at any moment is a run row
    (``crashed`` once the store sees its process gone). The recording callback fills it in."""
    import yaml

    from zoo.eval.results import open_db

    name = params.get('model.init_args.name') or _given(sweep, extra_args, '--model.init_args.name')
    if name is None:
        cfg = yaml.safe_load(sweep.base.read_text()) or {}
        name = ((cfg.get('model') or {}).get('init_args') or {}).get('name', 'unknown')
    return open_db(ctx.db).start_run(name, recipe=str(sweep.base), hparams=params, study_name=ctx.study_name,
                                     trial_number=ctx.trial_number, stage='fit')


def _fail_unstarted(ctx: TrialContext) -> None:
    """The run never reached the trainer (e.g. a value the system rejected): the row says so."""
    from zoo.eval.results import open_db

    ctx.status = 'failed'
    ctx.error = ctx.error or 'the run stopped before training started (no error was raised; see the log)'
    open_db(ctx.db).finish_run(ctx.run_id, 'failed', error=ctx.error)


def make_objective(sweep: Sweep, study_name: str, extra_args: list[str], db_url: str | None = None):
    import optuna

    def objective(trial: optuna.Trial):
        from optuna_integration import PyTorchLightningPruningCallback

        from .recording import TrialContext

        params = sweep.module.space(trial)
        if not isinstance(params, dict):
            raise SweepError(f'{sweep.path}: space(trial) must return a dict of CLI keys to values')
        ctx = TrialContext(study_name, trial.number, db=db_url)  # the recording callback fills in the outcome
        if not sweep.multi_objective:
            ctx.callbacks.append(PyTorchLightningPruningCallback(trial, monitor=sweep.metric))
        ctx.run_id = _start_trial_run(sweep, params, extra_args, ctx)
        trial.set_user_attr('zoo_run_id', ctx.run_id)
        try:
            _run_cli(_argv(sweep, params, extra_args, ctx), ctx)
        except optuna.TrialPruned:
            raise
        except BaseException as e:
            if ctx.status == 'pruned':
                raise optuna.TrialPruned(str(e)) from e
            raise
        finally:
            if ctx.status is None:
                _fail_unstarted(ctx)
        if ctx.status == 'pruned':
            raise optuna.TrialPruned(ctx.error or 'pruned')
        if ctx.status != 'finished':
            raise SweepError(f'trial {trial.number} ended with status {ctx.status}: {ctx.error}')
        if sweep.metric not in ctx.metrics:
            raise SweepError(f'trial {trial.number}: metric {sweep.metric!r} was not logged; logged: '
                             f'{", ".join(sorted(ctx.metrics)) or "nothing"}')
        value = ctx.metrics[sweep.metric]
        if not sweep.multi_objective:
            return value
        if ctx.latency_ms is None:
            raise SweepError(f'trial {trial.number}: no latency was measured (multi-objective sweeps need it; '
                             'do not set ZOO_RECORD_LATENCY=0)')
        trial.set_user_attr('latency_ms', ctx.latency_ms)
        return value, ctx.latency_ms

    return objective


def run_sweep(path: str | os.PathLike, n_trials: int | None = None, n_jobs: int = 1, db: str | None = None,
              study_name: str | None = None, timeout: float | None = None, extra_args: list[str] | None = None,
              seed: int | None = None):
    """Create or resume the study and run trials until it holds ``n_trials`` (default: the file's N_TRIALS)."""
    import optuna

    if n_jobs < 1:
        raise SweepError(f'--n-jobs must be at least 1 (worker processes on the study); got {n_jobs}')
    if n_trials is not None and n_trials < 1:
        raise SweepError(f'--n-trials must be at least 1 (the number of trials the study should hold); got {n_trials}')
    sweep = load_sweep(path)
    check_trial_args(sweep, extra_args or [])
    study_name = study_name or sweep.path.stem
    seed = seed if seed is not None else getattr(sweep.module, 'SEED', None)
    st = storage(db)
    study = optuna.create_study(study_name=study_name, storage=st, load_if_exists=True, directions=list(sweep.directions),
                                sampler=_sampler(sweep, seed), pruner=_pruner(sweep))
    stored = [d.value for d in study.directions]
    wanted = [optuna.study.StudyDirection.MAXIMIZE if d == 'maximize' else optuna.study.StudyDirection.MINIMIZE
              for d in sweep.directions]
    if stored != [w.value for w in wanted]:
        raise SweepError(f'study {study_name!r} exists with other directions; pick another --study-name')
    with warnings.catch_warnings():  # Optuna marks it experimental (v3.2): a note on every sweep, not for a user
        warnings.simplefilter('ignore', optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([sweep.metric] + (['latency_ms'] if sweep.multi_objective else []))
    study.set_user_attr('base_recipe', str(sweep.base.relative_to(ROOT) if sweep.base.is_relative_to(ROOT)
                                           else sweep.base))
    study.set_user_attr('sweep_file', sweep.path.name)
    target = n_trials if n_trials is not None else sweep.n_trials
    study_id = st.get_study_id_from_name(study_name)
    crashed = fail_crashed_trials(st, study_id, study_name)
    remaining = target - counted_trials(study.get_trials(deepcopy=False), crashed)
    if remaining > 0:
        # --n-jobs N: N - 1 more worker processes on the same study (not threads: Lightning, seeding and
        # jsonargparse's directory changes are process-global). Each asks for a trial only while the study is
        # short of the target (under the shared lock), so together they run exactly the missing trials.
        workers = [_spawn_worker(sweep.path, target, study_name, st.url, timeout, extra_args, seed, i)
                   for i in range(1, min(n_jobs, remaining))]
        try:
            work(study, st, target, make_objective(sweep, study_name, extra_args or [], st.url), timeout)
        finally:
            codes = [w.wait() for w in workers]
        # a worker whose every trial failed exits 1 as `zoo sweep` does; that is said once, by failure_summary
        if any(codes) and not failure_summary(study, st.url):
            raise SweepError(f'{sum(map(bool, codes))} of {len(workers)} extra worker processes failed (exit codes '
                             f'{codes}); the study is stored, re-run the command to resume')
    _report(study, sweep)
    return study


def work(study, storage, target: int, objective, timeout: float | None = None) -> None:
    """Optuna's ask-and-tell loop until the study holds ``target`` trials (or ``timeout`` seconds pass): each trial
    is counted and asked for under the study's lock, so workers on one database together create exactly
    ``target``. A trial that fails (its error is in its run row) or is pruned is told so and the loop goes on."""
    import time

    import optuna
    from optuna.trial import TrialState

    start, name = time.monotonic(), study.study_name
    study_id = storage.get_study_id_from_name(name)
    while timeout is None or time.monotonic() - start < timeout:
        with _lock(storage.url, storage.engine, 'trial-lock', _TRIAL_LOCK + int(study_id)):
            crashed = fail_crashed_trials(storage, study_id, name)
            if counted_trials(study.get_trials(deepcopy=False), crashed) >= target:
                return
            trial = study.ask()
        try:
            values = objective(trial)
        except optuna.TrialPruned:
            told = dict(state=TrialState.PRUNED)
        except (SweepError, RuntimeError, ValueError) as e:
            told = dict(state=TrialState.FAIL)
            print(f'zoo sweep: trial {trial.number} failed: {e}', file=sys.stderr)
        except BaseException:
            study.tell(trial, state=TrialState.FAIL)
            raise
        else:
            told = dict(values=values)
        try:
            study.tell(trial, **told)
        except RuntimeError as e:  # the sampler ended the study (BruteForceSampler: space exhausted); the trial
            if 'Study.stop' not in str(e):  # is stored before its after_trial hook runs
                raise
            return


def _spawn_worker(path, n_trials: int, study_name: str, url: str, timeout, extra_args, seed, index: int):
    import shlex
    import subprocess

    cmd = [sys.executable, '-m', 'zoo.recipes.main', 'sweep', str(Path(path).resolve()), '--n-trials', str(n_trials),
           '--study-name', study_name, '--db', url, '--trial-args', shlex.join(extra_args or [])]
    if timeout is not None:
        cmd += ['--timeout', str(timeout)]
    if seed is not None:        # distinct seeds, or both workers would sample the same points
        cmd += ['--seed', str(seed + index)]
    return subprocess.Popen(cmd, cwd=os.getcwd())


def _report(study, sweep: Sweep) -> None:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    print(f'study {study.study_name}: ' + ', '.join(f'{n} {k}' for k, n in counts.items() if n), file=sys.stderr)
    if sweep.multi_objective:
        for t in study.best_trials:
            print(f'  Pareto trial {t.number}: {sweep.metric}={t.values[0]:.4f} latency={t.values[1]:.2f} ms '
                  f'{t.params}', file=sys.stderr)
    elif counts.get('complete'):
        print(f'  best trial {study.best_trial.number}: {sweep.metric}={study.best_value:.4f} '
              f'{study.best_trial.params}', file=sys.stderr)


def failure_summary(study, db: str | None = None) -> str | None:
    """One line when every trial of the study failed (``zoo sweep`` then exits 1): how many, and why the first
    one failed (its run row's error). None when any trial completed or was pruned."""
    from optuna.trial import TrialState

    from zoo.eval.results import open_db

    trials = study.get_trials(deepcopy=False)
    if not trials or any(t.state != TrialState.FAIL for t in trials):
        return None
    rows = open_db(db).runs(study_name=study.study_name, columns=['trial_number', 'status', 'error'])
    rows = rows.sort_values('trial_number')
    first = next((r for r in rows.itertuples() if isinstance(r.error, str) and r.error.strip()), None)
    why = (f'trial {int(first.trial_number)} ({first.status}): {" ".join(first.error.split())[:400]}' if first
           else 'no error was recorded (see the log above)')
    return f'every trial of study {study.study_name!r} failed ({len(trials)} of {len(trials)}); the first, {why}'
