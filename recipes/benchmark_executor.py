"""``zoo benchmark run NAME --executor slurm|submitit-local``: the benchmark's training jobs as the tasks of job
arrays submitted through submitit (https://github.com/facebookincubator/submitit), instead of the runner's threads
(``--executor local``, the default).

The database stays the record of what is done. The runner's own ``Runner._take`` takes every job, so the rows, the
job keys and the lock are the local executor's: a second invocation, a thread runner or a runner on another machine
sees the same rows and never starts a job twice. Each taken job becomes one task of a submitit job array, which runs
``Runner.execute`` (the same ``zoo fit`` subprocess, given the row's id in ``ZOO_RUN_ID``) on its node.

Dependencies (``pretrained_from``) are submitted in waves: ``_take`` hands out only jobs whose dependency has
finished, so everything ready is submitted as one array, and whatever a finished task frees is submitted as the
next one as soon as the runner sees the task end (it polls every ``poll_s`` seconds).

Liveness, so that no live job is marked ``crashed`` and no dead one stays ``running``:

- while a task waits in the queue its row carries the runner's host and pid (``_take`` wrote it), so a process on
  the runner's host sees it alive while the runner lives; the runner also refreshes the heartbeat of every task
  not yet ended, so a runner on another host (several machines on one PostgreSQL database) does not presume a
  long-queued row dead;
- when the task starts on its node it first checks that its row is still ``running`` (a row that a later runner
  marked ``crashed`` and ran again is skipped, not trained twice), claims the row for its own host and pid
  (``ResultsDB.claim_run``) and beats it until its ``zoo fit`` has ended; ``zoo fit`` claims it in turn when it
  starts recording (``ZOO_RUN_ID``, ``recording.ResultsLogger``), exactly as under the local executor;
- a task that ends without a result (a time limit, a node failure, a cancellation) leaves its row ``running``:
  the runner sees the submitit job end and records the row ``crashed`` with submitit's error and the task's log,
  so the next invocation runs it again, as a killed local job is (a task Slurm preempts and requeues starts again
  on the same row); a runner interrupted (Ctrl-C) cancels the tasks it has in flight and ends their rows
  ``crashed``.

The task's check and its claim are two statements: a row ended between them (its runner died at that instant and
another runner on its host marked it) is trained twice, never lost; the newest row of a job is its record.

On a cluster the nodes need the checkout, its virtualenv, the working folder and the database: a shared file
system, and a PostgreSQL URL for ``--db`` (a SQLite file's lock is a file lock, unreliable on NFS). The tasks run
with the submitting shell's ``ZOO_*`` variables and in its working folder. Latency is still measured afterwards
by the runner's own process (``--no-latency`` skips it; ``zoo bench --db`` can measure it later on a quiet node).
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

EXECUTORS = ('local', 'slurm', 'submitit-local')
CLUSTER = {'slurm': 'slurm', 'submitit-local': 'local'}   # our name -> submitit.AutoExecutor's cluster
SLURM_TIME_MIN = 240        # a task's time limit when --slurm-time is not given (submitit's own default is 5 min)
LOCAL_TIME_MIN = 7 * 24 * 60  # submitit's LocalExecutor kills a task after 2 min unless told otherwise
NOT_SUBMITTED = 'not submitted'


class ExecutorError(ValueError):
    """An executor that cannot be used as asked: one line saying what was expected (exit code 2)."""


def add_arguments(p) -> None:
    """The executor options of ``zoo benchmark run``."""
    from .errors import at_least

    p.add_argument('--executor', choices=EXECUTORS, default='local',
                   help='local: --workers threads on this machine (default); slurm: one Slurm array task per job '
                        'through submitit; submitit-local: submitit\'s local executor (--workers tasks at a time)')
    p.add_argument('--slurm-partition', metavar='NAME', help='--executor slurm: the partition (default: the '
                                                              "cluster's)")
    p.add_argument('--slurm-time', type=at_least(1), metavar='MIN',
                   help=f'a task\'s time limit in minutes (default {SLURM_TIME_MIN} on Slurm, none locally)')
    p.add_argument('--slurm-cpus', type=at_least(1), metavar='N',
                   help='CPUs per task (Slurm --cpus-per-task); also the torch threads of its job unless --threads')
    p.add_argument('--submitit-folder', metavar='DIR',
                   help="submitit's folder of task scripts, pickles and logs (default: submitit/ under the "
                        "benchmark's run root, runs/benchmarks/NAME)")


def make_executor(kind: str, folder: str | os.PathLike, *, name: str = 'zoo-benchmark',
                  partition: str | None = None, time_min: int | None = None, cpus: int | None = None):
    """A ``submitit.AutoExecutor`` for ``kind`` ('slurm' or 'submitit-local') with the command line's options mapped
    to submitit's parameters: ``partition`` -> ``slurm_partition``, ``time_min`` -> ``timeout_min`` (sbatch
    ``--time``), ``cpus`` -> ``cpus_per_task``, ``name`` -> the job name. Raises ``ExecutorError`` when submitit or
    (for Slurm) ``srun`` is missing."""
    if kind not in CLUSTER:
        raise ExecutorError(f'unknown executor {kind!r} (expected one of: {", ".join(CLUSTER)})')
    if partition is not None and (kind != 'slurm' or not partition.strip()):
        raise ExecutorError('--slurm-partition is for --executor slurm' if kind != 'slurm' else
                            '--slurm-partition expects a partition name; got an empty string')
    try:
        import submitit
    except ImportError:
        raise ExecutorError(f'--executor {kind} needs submitit: pip install submitit (or zoo[sweep])') from None
    if kind == 'slurm' and shutil.which('srun') is None:
        raise ExecutorError('--executor slurm needs a Slurm cluster: srun is not on PATH (run it where sbatch '
                            'works, or use --executor submitit-local on this machine)')
    executor = submitit.AutoExecutor(folder=str(folder), cluster=CLUSTER[kind])
    default_time = SLURM_TIME_MIN if kind == 'slurm' else LOCAL_TIME_MIN
    params = {'name': name, 'timeout_min': time_min or default_time, 'cpus_per_task': cpus}
    if kind == 'slurm':
        params['slurm_partition'] = partition
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def from_args(args, bench) -> dict | None:
    """The command line's executor: None for the runner's threads, else ``submit``'s keyword arguments (the executor
    built, the threads of each job, how many tasks at a time). Checked before anything is written."""
    from .benchmark import run_root

    kind = args.executor
    if kind == 'local':
        if args.slurm_partition is not None:
            raise ExecutorError('--slurm-partition is for --executor slurm')
        given = [opt for opt, v in (('--slurm-time', args.slurm_time), ('--slurm-cpus', args.slurm_cpus),
                                    ('--submitit-folder', args.submitit_folder)) if v is not None]
        if given:
            raise ExecutorError(f'{given[0]} is for --executor slurm or submitit-local (the default, local, runs '
                                f'--workers threads here)')
        return None
    folder = Path(args.submitit_folder) if args.submitit_folder else run_root(bench) / 'submitit'
    executor = make_executor(kind, folder, name=f'zoo-{bench.name}', partition=args.slurm_partition,
                             time_min=args.slurm_time, cpus=args.slurm_cpus)
    # Slurm schedules the array itself; the local executor starts every task at once unless capped
    return {'executor': executor, 'threads': args.threads or args.slurm_cpus,
            'at_once': args.workers if kind == 'submitit-local' else None}


# ------------------------------------------------------------------------------------------------------ the task
@dataclass(frozen=True)
class Task:
    """What every array task of one benchmark needs on its node (pickled by submitit with each task)."""
    bench: object                  # benchmark_spec.Benchmark
    db: str                        # the runner's --db, as given (the task works in the runner's folder)
    cwd: str
    env: dict                      # the runner's ZOO_* variables (ZOO_RUNS, ZOO_HEARTBEAT_S, ...)
    threads: int | None
    heartbeat_s: float


def run_task(task: Task, job, run_id: int, extra: dict) -> str:
    """One array task, on its node: ``Runner.execute`` of the job whose row ``run_id`` the runner wrote; returns the
    status the row ends with ('skipped' when the row was no longer ``running``: see the module docstring)."""
    os.chdir(task.cwd)
    os.environ.update(task.env)
    from .benchmark import Runner

    runner = Runner(task.bench, task.db, threads=task.threads)
    store = runner.store
    if not store.heartbeat(run_id):      # ended while queued: a later runner marked it crashed and took the job
        return 'skipped'
    store.claim_run(run_id)              # this task's host and pid, alive until its zoo fit has ended
    beat = store.start_heartbeat(run_id, task.heartbeat_s)
    try:
        return runner.execute(job, run_id, extra)
    finally:
        beat.stop()


# ------------------------------------------------------------------------------------------------------ the loop
def submit(runner, executor, *, threads: int | None = None, at_once: int | None = None,
           poll_s: float = 2.0) -> dict:
    """Run the runner's jobs as submitit tasks, then the seeds its sequential rule adds (``Runner.add_seeds``), as
    ``Runner.run`` does with threads; returns {'finished': n, 'failed': n, ...}. ``executor``: a submitit executor
    (``make_executor``); ``at_once``: at most that many tasks submitted and not yet ended (None: no cap)."""
    counts: dict[str, int] = {}
    while True:
        for k, v in submit_pending(runner, executor, threads=threads, at_once=at_once, poll_s=poll_s).items():
            counts[k] = counts.get(k, 0) + v
        if NOT_SUBMITTED in counts or not runner.add_seeds():
            return counts


def submit_pending(runner, executor, *, threads: int | None = None, at_once: int | None = None,
                   poll_s: float = 2.0) -> dict:
    """Every job ``_take`` hands out, in waves (see the module docstring), until none is left. A submission that
    fails (sbatch refuses the partition, the controller is down) records the jobs it held ``failed`` with its error
    (run again with ``--retry-failed``), counted as 'not submitted'; nothing more is submitted, the tasks in flight
    are still waited for."""
    from zoo.eval.results import DEFAULT_HEARTBEAT_S, HEARTBEAT_ENV

    beat_s = float(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S))
    task = Task(runner.bench, runner.db, os.getcwd(), {k: v for k, v in os.environ.items() if k.startswith('ZOO_')},
                threads or runner.threads, beat_s)
    outstanding: dict = {}            # submitit job -> (benchmark job, run id, start time)
    counts: dict[str, int] = {}
    last_beat = time.monotonic()
    broken = False
    try:
        while True:
            taken, left = [], 'done'      # left: what _take said once it had no job to hand out
            while not broken and (at_once is None or len(outstanding) + len(taken) < at_once):
                got = runner._take()
                if isinstance(got, str):          # 'wait' or 'done'
                    left = got
                    break
                taken.append(got)
            if taken:
                try:
                    _submit(runner, executor, task, taken, outstanding)
                except Exception as e:
                    why = _first_line(e)
                    for job, run_id, _ in taken:
                        runner.store.finish_run(run_id, 'failed', error=f'not submitted: {why}')
                    counts[NOT_SUBMITTED] = counts.get(NOT_SUBMITTED, 0) + len(taken)
                    runner.say(f'{runner.bench.name}: submitting {len(taken)} job(s) failed: {why}')
                    broken = True
            if not outstanding and (left == 'done' or broken):
                return counts
            ended = [s for s in outstanding if s.done()]
            for sub in ended:
                job, run_id, t0 = outstanding.pop(sub)
                status = _settle(runner, sub, run_id)
                counts[status] = counts.get(status, 0) + 1
                runner.done.append((job, status, time.perf_counter() - t0))
                runner.say(f'{job.group}/{job.entry} seed {job.seed}: {status} ({time.perf_counter() - t0:.0f} s; '
                           f'submitit job {sub.job_id})')
            if not ended:
                time.sleep(poll_s)
            if time.monotonic() - last_beat >= beat_s:
                for _, run_id, _ in outstanding.values():
                    runner.store.heartbeat(run_id)
                last_beat = time.monotonic()
    except BaseException:
        # interrupted (Ctrl-C) or an error here: the tasks still queued or running are cancelled and their rows ended, so
        # the next invocation runs them again at once
        for sub, (job, run_id, _) in outstanding.items():
            sub.cancel(check=False)
            _end_if_running(runner, run_id, f'cancelled: the runner that submitted submitit job {sub.job_id} stopped')
        raise


def _submit(runner, executor, task: Task, taken: list, outstanding: dict) -> None:
    with executor.batch():                # one job array (on Slurm; local tasks are processes of their own)
        subs = [executor.submit(run_task, task, job, run_id, extra) for job, run_id, extra in taken]
    t0 = time.perf_counter()
    for sub, (job, run_id, _) in zip(subs, taken):
        outstanding[sub] = (job, run_id, t0)
    ids = subs[0].job_id + (f' .. {subs[-1].job_id}' if len(subs) > 1 else '')
    runner.say(f'{runner.bench.name}: submitted {len(subs)} job(s) as submitit job(s) {ids} '
               f'(logs in {executor.folder})')


def _settle(runner, sub, run_id: int) -> str:
    """The status of an ended task's row; a row left ``running`` (the task died without recording how its job
    ended) is recorded ``crashed`` with submitit's error and the task's log, to run again next time."""
    try:
        result = sub.result()
    except Exception as e:            # submitit's UncompletedJobError / FailedJobError: a multi-line report
        _end_if_running(runner, run_id, f'submitit job {sub.job_id} ended without a result: {_first_line(e)}; '
                                        f'log {sub.paths.stdout}')
        result = None
    if result == 'skipped':
        return result
    row = runner.store.runs(id=run_id, columns=['status'])
    return str(row.status.iloc[0]) if len(row) else 'failed'


def _first_line(e: BaseException) -> str:
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)


def _end_if_running(runner, run_id: int, why: str) -> None:
    row = runner.store.runs(id=run_id, columns=['status'])
    if len(row) and row.status.iloc[0] == 'running':
        runner.store.finish_run(run_id, 'crashed', error=why)
