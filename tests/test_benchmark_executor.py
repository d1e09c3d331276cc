"""``zoo benchmark run NAME --executor submitit-local|slurm`` (recipes/benchmark_executor.py): a tiny benchmark the
test writes (the shape of tests/test_benchmark.py's: the digits recipe, one epoch of two steps, a MetaFormer a few
thousand parameters big) run end to end through submitit's local executor; the Slurm executor's parameters are
checked on the executor built (no Slurm here: nothing is submitted); the task's claim of its row and the runner's
settling of a task that died, on rows the test writes; the submission loop's cap, refusal and interruption on a fake
executor."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from zoo.eval import results as R
from zoo.recipes import benchmark_executor as BE
from zoo.recipes.benchmark_spec import load
from zoo_cli import error_line, zoo

pytest.importorskip('submitit')

SMALL = {'dims': [8, 8, 8, 8], 'depths': [1, 1, 1, 1]}
FAST = {'trainer.max_epochs': 1, 'trainer.limit_train_batches': 2, 'trainer.limit_val_batches': 1,
        'trainer.num_sanity_val_steps': 0, 'trainer.enable_model_summary': False, 'model.name': 'metaformer_tiny'}
# one pytest-xdist worker runs the whole file (make test: --dist loadgroup): the module fixture is built once
pytestmark = pytest.mark.xdist_group(__name__)


def group(entries, **extra) -> dict:
    return {'task': 'classification', 'dataset': 'digits', 'recipe': 'poolformer/poolformer_tiny_digits_15e',
            'overrides': dict(FAST), 'seeds': [0], 'batch_sizes': [1],
            'entries': {e: {'model.model_args': {'token_mixer': e, **SMALL}} for e in entries}, **extra}


def write(tmp: Path, groups: dict, name: str = 'tiny') -> Path:
    path = tmp / 'benchmarks' / f'{name}.yaml'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({'groups': groups}, sort_keys=False))
    return path


def runs(db: Path):
    R.close_all()
    df = R.runs(db=str(db))
    R.close_all()
    return df.sort_values('id').reset_index(drop=True)


@pytest.fixture(scope='module')
def ran(tmp_path_factory):
    """A mixer and a group fine-tuned from it (it must wait for it: a second wave), run through submitit's local
    executor; beside it, in a folder of its own, the mixer alone through the default thread executor, to compare
    the rows."""
    tmp, ref = tmp_path_factory.mktemp('submitit'), tmp_path_factory.mktemp('threads')
    tuned = group(['pooling'], pretrained_from={'group': 'mixers', 'entry': 'pooling'})
    tuned['overrides']['trainer.limit_train_batches'] = 1        # another job key than mixers/pooling's
    write(tmp, {'tuned': tuned, 'mixers': group(['pooling'])})     # the dependent group first
    write(ref, {'mixers': group(['pooling'])})
    with ThreadPoolExecutor(2) as pool:
        sub = pool.submit(zoo, 'benchmark', 'run', 'tiny', '--no-latency', '--executor', 'submitit-local',
                          '--workers', '2', cwd=tmp)
        local = pool.submit(zoo, 'benchmark', 'run', 'tiny', '--no-latency', cwd=ref)
        first, threads = sub.result(), local.result()
    assert first.returncode == 0, first.stderr
    assert threads.returncode == 0, threads.stderr
    return tmp, ref, first


def test_every_job_runs_as_a_submitit_task_in_waves_and_is_finished_in_the_database(ran):
    tmp, _, first = ran
    df = runs(tmp / 'benchmarks' / 'tiny.db')
    assert '2 to run' in first.stderr and '2 finished' in first.stderr, first.stderr
    assert [(h['benchmark']['group'], h['benchmark']['entry']) for h in df.hparams] == [
        ('mixers', 'pooling'), ('tuned', 'pooling')]                                 # the dependency waited
    assert set(df.status) == {'finished'} and df.error.isna().all()
    waves = [ln for ln in first.stderr.splitlines() if 'submitted' in ln]
    assert [w.split(': submitted ')[1].split(' ')[0] for w in waves] == ['1', '1'], first.stderr
    folder = tmp / 'runs' / 'benchmarks' / 'tiny' / 'submitit'           # the default: under the run root
    assert len(list(folder.glob('*_result.pkl'))) == 2
    ckpt = df.config.iloc[1]['model']['init_args']['checkpoint']
    assert ckpt.endswith('mixers/pooling/seed0/poolformer_tiny_digits_15e/latest/checkpoints/last.ckpt'), ckpt
    assert df.host.notna().all() and df.pid.notna().all() and df.heartbeat_s.notna().all()


def test_a_second_invocation_runs_nothing(ran):
    tmp, _, _ = ran
    folder = tmp / 'runs' / 'benchmarks' / 'tiny' / 'submitit'
    before = sorted(p.name for p in folder.iterdir())
    again = zoo('benchmark', 'run', 'tiny', '--no-latency', '--executor', 'submitit-local', cwd=tmp)
    assert again.returncode == 0 and '0 to run' in again.stderr and 'nothing to do' in again.stderr, again.stderr
    assert 'submitted' not in again.stderr and sorted(p.name for p in folder.iterdir()) == before
    assert len(runs(tmp / 'benchmarks' / 'tiny.db')) == 2


def test_the_rows_are_the_local_executors(ran):
    """The pooling mixer's row through submitit and through the threads: the same columns filled, the same job
    key, hparams and config key, and the same summary in results.data()."""
    tmp, ref, _ = ran
    a, b = runs(tmp / 'benchmarks' / 'tiny.db').iloc[0], runs(ref / 'benchmarks' / 'tiny.db').iloc[0]
    assert a.hparams['benchmark'] == b.hparams['benchmark'] and a.hparams == b.hparams
    assert a.config_key == b.config_key and a.status == b.status == 'finished'
    assert set(a.index[a.notna()]) == set(b.index[b.notna()])
    R.close_all()
    da, db = (R.data(db=str(p / 'benchmarks' / 'tiny.db'), status=None) for p in (tmp, ref))
    R.close_all()
    ra, rb = da[da.group == 'mixers'].iloc[0], db.iloc[0]
    assert list(da.columns) == list(db.columns) and set(ra.index[ra.notna()]) == set(rb.index[rb.notna()])
    assert (ra.entry, ra.metric, ra.epochs, ra.params) == (rb.entry, rb.metric, rb.epochs, rb.params)


def fake_srun(tmp: Path, monkeypatch) -> None:
    """An ``srun`` on PATH, so that submitit builds its Slurm executor here (it is never called: nothing is
    submitted)."""
    bin_ = tmp / 'bin'
    bin_.mkdir()
    (bin_ / 'srun').write_text('#!/bin/sh\nexit 1\n')
    (bin_ / 'srun').chmod(0o755)
    monkeypatch.setenv('PATH', f'{bin_}{os.pathsep}{os.environ["PATH"]}')


def test_the_slurm_options_are_mapped_to_submitits_parameters(tmp_path, monkeypatch):
    from zoo.recipes.main import build_parser

    fake_srun(tmp_path, monkeypatch)
    write(tmp_path, {'mixers': group(['pooling'])})
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv('ZOO_RUNS', raising=False)
    args = build_parser().parse_args(['benchmark', 'run', 'tiny', '--executor', 'slurm', '--slurm-partition', 'cpu',
                                      '--slurm-time', '90', '--slurm-cpus', '4', '--workers', '3'])
    got = BE.from_args(args, load('tiny'))
    ex = got['executor']
    assert ex.cluster == 'slurm'
    assert ex.parameters == {'job_name': 'zoo-tiny', 'partition': 'cpu', 'time': 90, 'cpus_per_task': 4}
    assert got['threads'] == 4 and got['at_once'] is None        # Slurm schedules the array; 4 torch threads a job
    assert Path(ex.folder) == (tmp_path / 'runs' / 'benchmarks' / 'tiny' / 'submitit').resolve()
    sbatch = ex._executor._make_submission_file_text('CMD', 'uid')
    for line in ('--partition=cpu', '--time=90', '--cpus-per-task=4', '--job-name=zoo-tiny'):
        assert f'#SBATCH {line}\n' in sbatch, sbatch
    # without --slurm-time, the documented default (submitit's own is 5 minutes); --threads wins over the CPUs
    args = build_parser().parse_args(['benchmark', 'run', 'tiny', '--executor', 'slurm', '--slurm-cpus', '4',
                                      '--threads', '2', '--submitit-folder', str(tmp_path / 'sub')])
    got = BE.from_args(args, load('tiny'))
    assert got['executor'].parameters['time'] == BE.SLURM_TIME_MIN and 'partition' not in got['executor'].parameters
    assert got['threads'] == 2 and Path(got['executor'].folder) == (tmp_path / 'sub').resolve()
    local = BE.make_executor('submitit-local', tmp_path / 'local', time_min=30)
    assert local.cluster == 'local' and local.parameters['timeout_min'] == 30


@pytest.mark.parametrize('args, message', [
    (['--executor', 'slurm'], '--executor slurm needs a Slurm cluster: srun is not on PATH'),
    (['--executor', 'slrum'], 'did you mean slurm?'),
    (['--executor', 'submitit-local', '--slurm-time', '0'], 'argument --slurm-time: expected an integer >= 1, got 0'),
    (['--executor', 'submitit-local', '--slurm-cpus', 'four'], "argument --slurm-cpus: expected an integer >= 1"),
    (['--slurm-partition', 'cpu'], '--slurm-partition is for --executor slurm'),
    (['--executor', 'submitit-local', '--slurm-partition', 'cpu'], '--slurm-partition is for --executor slurm'),
    (['--slurm-time', '60'], '--slurm-time is for --executor slurm or submitit-local'),
])
def test_bad_executor_options_are_one_line_and_exit_2(tmp_path, args, message):
    write(tmp_path, {'mixers': group(['pooling'])})
    env = {'PATH': os.pathsep.join(p for p in os.environ['PATH'].split(os.pathsep)
                                   if not (Path(p) / 'srun').exists())}       # no Slurm, whatever the machine
    proc = zoo('benchmark', 'run', 'tiny', *args, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and message in error_line(proc), proc.stderr
    assert not (tmp_path / 'benchmarks' / 'tiny.db').exists() and not (tmp_path / 'runs').exists()


# ------------------------------------------------------------------------------- the task's row, in this process
def queued_row(tmp: Path, monkeypatch):
    """A benchmark, its database and the row a runner on another host wrote for its job 10 minutes ago (a task
    still queued), as ``Task`` and ``run_task``'s arguments."""
    write(tmp, {'mixers': group(['pooling'])})
    monkeypatch.chdir(tmp)
    bench, db = load('tiny'), str(tmp / 'benchmarks' / 'tiny.db')
    job = bench.jobs()[0]
    store = R.open_db(db)
    run_id = store.start_run('metaformer_tiny', task='classification', seed=0, stage='fit', heartbeat_s=60.0,
                             hparams={'benchmark': {'name': 'tiny', 'key': job.key}})
    store.update_run(run_id, host='login-node', pid=1, heartbeat_at=R.utcnow() - dt.timedelta(minutes=10))
    task = BE.Task(bench, db, str(tmp), {}, None, 60.0)
    return store, task, job, run_id


def test_a_task_claims_its_queued_row_so_no_runner_marks_it_crashed(tmp_path, monkeypatch):
    from zoo.eval.results import store as S
    from zoo.recipes.benchmark import Runner

    store, task, job, run_id = queued_row(tmp_path, monkeypatch)
    seen = {}

    def execute(self, job_, run_id_, extra):       # instead of zoo fit: what a runner sees while the job trains
        row = store.runs(id=run_id_, columns=['host', 'pid', 'status']).iloc[0]
        seen['row'] = (row.host, row.pid, row.status)
        seen['here'] = store.mark_crashed()                                    # a runner on this host
        with monkeypatch.context() as m:
            m.setattr(S.socket, 'gethostname', lambda: 'other-node')         # a runner on another host
            seen['there'] = store.mark_crashed()
        store.finish_run(run_id_, 'finished')
        return 'finished'
    monkeypatch.setattr(Runner, 'execute', execute)
    assert BE.run_task(task, job, run_id, {}) == 'finished'
    assert seen == {'row': (socket.gethostname(), os.getpid(), 'running'), 'here': 0, 'there': 0}
    R.close_all()


def test_a_task_whose_row_ended_while_queued_does_not_run(tmp_path, monkeypatch):
    from zoo.recipes.benchmark import Runner

    store, task, job, run_id = queued_row(tmp_path, monkeypatch)
    assert store.mark_crashed() == 1          # the runner on login-node stopped beating: a later runner took it
    monkeypatch.setattr(Runner, 'execute', lambda *a: pytest.fail('a crashed row was trained again'))
    assert BE.run_task(task, job, run_id, {}) == 'skipped'
    assert store.runs(id=run_id, columns=['status']).status.iloc[0] == 'crashed'
    R.close_all()


def test_a_task_that_died_without_a_result_leaves_its_row_crashed_to_run_again(tmp_path, monkeypatch):
    from submitit.core.utils import UncompletedJobError

    store, _, _, run_id = queued_row(tmp_path, monkeypatch)

    def result():
        raise UncompletedJobError('Job not requeued because: timed-out and not checkpointable.\nmore lines')
    sub = SimpleNamespace(job_id='77_3', result=result, paths=SimpleNamespace(stdout=tmp_path / '77_3_0_log.out'))
    runner = SimpleNamespace(store=store)
    assert BE._settle(runner, sub, run_id) == 'crashed'
    error = store.runs(id=run_id, columns=['error']).error.iloc[0]
    assert error == (f'submitit job 77_3 ended without a result: Job not requeued because: timed-out and not '
                     f'checkpointable.; log {tmp_path / "77_3_0_log.out"}')
    store.finish_run(run_id, 'finished')      # a row its zoo fit ended is left as it is
    assert BE._settle(runner, sub, run_id) == 'finished'
    R.close_all()


# ------------------------------------------------------------------------------- the loop, on a fake executor
class FakeRunner:
    """``_take`` hands out the jobs named, one row each; the store is a dict of the rows' statuses."""

    def __init__(self, jobs):
        import pandas as pd

        self.left, self.status, self.done, self.lines = list(jobs), {}, [], []
        self.bench, self.db, self.threads, self.say = SimpleNamespace(name='fake'), 'db', None, self.lines.append
        self.store = SimpleNamespace(
            runs=lambda id, columns: pd.DataFrame({'status': [self.status[id]]}),
            heartbeat=lambda run_id: True,
            finish_run=lambda run_id, status, error=None: self.status.__setitem__(run_id, status))

    def _take(self):
        if not self.left:
            return 'done'
        run_id = len(self.status) + 1
        self.status[run_id] = 'running'
        return SimpleNamespace(group='g', entry=self.left.pop(0), seed=0), run_id, {}

    def add_seeds(self):
        return 0


class FakeExecutor:
    """Tasks that end (their row finished) on the runner's second look; ``interrupt``: the first look at a task
    is a Ctrl-C instead."""

    def __init__(self, runner, interrupt=False, refuse=False):
        self.runner, self.interrupt, self.refuse, self.folder = runner, interrupt, refuse, 'f'
        self.batches, self.cancelled = [], []

    @contextlib.contextmanager
    def batch(self):
        self.batches.append([])
        yield

    def submit(self, fn, task, job, run_id, extra):
        assert fn is BE.run_task and task.bench is self.runner.bench
        if self.refuse:
            raise RuntimeError('sbatch: error: invalid partition specified: cpux\nsbatch: error: Batch job '
                               'submission failed')
        self.batches[-1].append(job.entry)
        ex, looks = self, []

        class Job:
            job_id = f'{run_id}'

            def done(self):
                if ex.interrupt:
                    raise KeyboardInterrupt
                looks.append(1)
                return len(looks) > 1

            def result(self):
                ex.runner.status[run_id] = 'finished'
                return 'finished'

            def cancel(self, check=True):
                ex.cancelled.append(job.entry)
        return Job()


def test_submitit_local_keeps_at_most_workers_tasks_in_flight():
    runner = FakeRunner(['a', 'b', 'c'])
    ex = FakeExecutor(runner)
    assert BE.submit(runner, ex, at_once=2, poll_s=0) == {'finished': 3}
    assert ex.batches == [['a', 'b'], ['c']] and set(runner.status.values()) == {'finished'}
    assert [j.entry for j, status, _ in runner.done] == ['a', 'b', 'c']
    runner = FakeRunner(['a', 'b', 'c'])
    ex = FakeExecutor(runner)
    assert BE.submit(runner, ex, poll_s=0) == {'finished': 3} and ex.batches == [['a', 'b', 'c']]   # Slurm's way


def test_a_refused_submission_records_its_jobs_failed_and_submits_nothing_more():
    runner = FakeRunner(['a', 'b', 'c'])
    assert BE.submit(runner, FakeExecutor(runner, refuse=True), at_once=2, poll_s=0) == {'not submitted': 2}
    assert runner.status == {1: 'failed', 2: 'failed'} and runner.left == ['c']
    assert runner.lines == ['fake: submitting 2 job(s) failed: sbatch: error: invalid partition specified: cpux']


def test_an_interrupted_runner_cancels_its_tasks_and_ends_their_rows():
    runner = FakeRunner(['a', 'b'])
    ex = FakeExecutor(runner, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        BE.submit(runner, ex, poll_s=0)
    assert ex.cancelled == ['a', 'b'] and set(runner.status.values()) == {'crashed'}
