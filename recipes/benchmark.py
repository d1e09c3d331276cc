"""``zoo benchmark run NAME``: train every (group, entry, seed) of ``benchmarks/NAME.yaml`` that the results
database does not hold yet, then measure each trained network's latency in one process.

Each job is an ordinary recorded run: ``zoo fit -c RECIPE --KEY=VALUE ... --seed_everything=S --db URL`` in a
subprocess (a crash, an out-of-memory kill or a hung import cannot take the runner down), recorded by the
results logger (``recording.ResultsLogger``) in a row the runner writes first, under the database's lock
(``ResultsDB.lock``), so workers never start one job twice:

- the row carries the job's key (``benchmark_spec.job_key``: recipe, overrides and seed) in its hparams
  (``benchmark``), so a second invocation finds every finished job and does nothing;
- a runner killed mid-way leaves its jobs ``running`` with a dead pid: the next runner's store marks them
  ``crashed`` and runs them again (at most the runs in progress are lost); a ``zoo fit`` killed by a signal
  under a live runner (out of memory) is ``crashed`` too and runs again at the next invocation;
- a job that fails is recorded ``failed`` with its error (the run's own, or the tail of its log when it died
  before recording one) and is retried only with ``--retry-failed``;
- ``--workers N`` runs N jobs at a time; several runners (machines) may share one database (SQLite file or
  PostgreSQL URL): the lock is a file lock beside a SQLite file, an advisory lock on PostgreSQL.

Latency (unless ``--no-latency``): once no job is left, every finished network of the benchmark without a
``zoo bench`` record at the group's batch sizes is re-measured in this process, interleaved
(``zoo.eval.bench.remeasure``, the path of ``zoo bench --db``). A runtime that fails on a network (compile or
export error) is recorded as a latency failure with its error, shown in the report, and tried again only with
``--retry-failed``. A record above the busy load or with IQR/median above 0.15 (``zoo.eval.bench.untrusted``) is
re-taken (``remeasure`` waits for a quiet machine and tries ``attempts`` times) and never published: one still noisy
is recorded as an ``untrusted:`` failure, which the next invocation tries again. ONNX Runtime sessions do not spin
their thread pools, so the runtime timed after them is not slowed. ``--threads K`` sets the threads of training and
timing.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from . import benchmark_executor
from .benchmark_spec import Benchmark, BenchmarkError, Job, check, load
from .errors import at_least

LOCK = 'benchmark-{name}'
LOG_TAIL = 4000       # characters of a job's log kept as its error when it died before recording one


def default_db(bench: Benchmark) -> str:
    """``benchmarks/<name>.db`` below the working folder, never the installed checkout's (unless that is where the
    user is: from the checkout root it is the shipped ``benchmarks/paper_blocks.db``)."""
    return str(Path('benchmarks') / f'{bench.path.stem}.db')


def run_root(bench: Benchmark) -> Path:
    """Where the jobs' run folders (checkpoints) and logs go: ``$ZOO_RUNS/benchmarks/<name>`` (default ``runs/``)."""
    return Path(os.environ.get('ZOO_RUNS', 'runs')) / 'benchmarks' / bench.name


def job_dir(bench: Benchmark, job: Job) -> Path:
    return run_root(bench) / job.group / job.entry / f'seed{job.seed}'


def checkpoint_of(bench: Benchmark, job: Job) -> Path:
    """The last checkpoint a finished job left (``runs.point_latest`` keeps ``latest`` on the newest fit)."""
    from .runs import find_recipe

    return job_dir(bench, job) / find_recipe(job.recipe).stem / 'latest' / 'checkpoints' / 'last.ckpt'


def states(store, bench: Benchmark) -> dict[str, dict]:
    """Job key -> its newest run row (``id``, ``status``, ``error``) in the database."""
    df = store.runs(columns=['id', 'status', 'error', 'hparams'])
    out: dict[str, dict] = {}
    for r in df.sort_values('id').itertuples():
        job = r.hparams.get('benchmark') if isinstance(r.hparams, dict) else None
        if isinstance(job, dict) and job.get('name') == bench.name and job.get('key'):
            out[job['key']] = {'id': int(r.id), 'status': r.status, 'error': r.error}
    return out


class Runner:
    """The jobs of one benchmark on one database, taken by ``workers`` threads (see the module docstring)."""

    def __init__(self, bench: Benchmark, db: str, workers: int = 1, retry_failed: bool = False,
                 threads: int | None = None, say=None, time_s: float | None = None):
        from zoo.eval.results import open_db

        self.bench, self.db, self.workers, self.retry, self.threads = bench, db, max(1, workers), retry_failed, threads
        self.time_s = time_s                 # zoo bench --time: the timing budget per network (None: its default)
        self.store = open_db(db)
        self.say = say or (lambda msg: print(msg, file=sys.stderr))
        # the first seeds, and the further seeds the sequential rule added in an earlier invocation
        base = bench.jobs()
        known = self.states()
        keys = {j.key for j in base}
        self.jobs = self._with_dependencies(base + [j for j in bench.possible_jobs()
                                                    if j.key in known and j.key not in keys])
        self.tried: set[str] = set()       # jobs this invocation started (a failure is not retried twice)
        self.done: list[tuple[Job, str, float]] = []
        self._mutex = threading.Lock()

    def _with_dependencies(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` and, for a seed the sequential rule added to a fine-tuning group, the pretraining job of that
        same seed (so the seed fixes the checkpoint too), where the pretraining group's cap allows the seed."""
        have, out = {j.key for j in jobs}, list(jobs)
        possible = {j.key for j in self.bench.possible_jobs()}
        for j in jobs:
            g = self.bench.groups[j.group]
            if g.pretrained_from is None:
                continue
            dep = self.bench.job(g.pretrained_from['group'], g.pretrained_entry(j.entry), j.seed)
            if dep.key in possible and dep.key not in have:
                out.insert(0, dep)
                have.add(dep.key)
        return out

    # -- what is left
    def _dependency(self, job: Job) -> Job | None:
        g = self.bench.groups[job.group]
        if g.pretrained_from is None:
            return None
        group, entry = g.pretrained_from['group'], g.pretrained_entry(job.entry)
        deps = [j for j in self.jobs if j.group == group and j.entry == entry]
        return next((j for j in deps if j.seed == job.seed), deps[0])

    def pending(self, state: dict | None = None) -> list[Job]:
        """Jobs to run now or later: never run, crashed (killed), or failed with ``--retry-failed``; a job this
        invocation already ran is not run again by it (a job killed every time does not loop)."""
        state = self.states() if state is None else state
        out = []
        for j in self.jobs:
            s = state.get(j.key, {}).get('status')
            if s is None or (j.key not in self.tried and (s == 'crashed' or (s == 'failed' and self.retry))):
                out.append(j)
        return out

    def states(self) -> dict:
        return states(self.store, self.bench)

    def _take(self) -> tuple[Job, int, dict] | str:
        """Under the lock: the next job ready to run, with the row written for it; else 'wait' or 'done'."""
        with self.store.lock(LOCK.format(name=self.bench.name)):
            self.store.mark_crashed()
            state = self.states()
            waiting = False
            pending = self.pending(state)
            keys = {j.key for j in pending}
            for job in pending:
                dep = self._dependency(job)
                extra = {}
                if dep is not None:
                    ds = state.get(dep.key, {}).get('status')
                    if ds != 'finished':
                        if dep.key in keys or ds == 'running':     # it will run, or runs now
                            waiting = True
                            continue
                        self._record(job, 'failed', f'its pretrained_from job {dep.group}/{dep.entry} seed '
                                                    f'{dep.seed} {ds}; nothing to fine-tune')
                        self.tried.add(job.key)
                        continue
                    extra[self.bench.groups[job.group].pretrained_from['arg']] = str(checkpoint_of(self.bench, dep))
                run_id = self._record(job, 'running', None)
                self.tried.add(job.key)
                return job, run_id, extra
            if waiting or any(s.get('status') == 'running' for k, s in state.items()
                              if k in {j.key for j in self.jobs}):
                return 'wait'
            return 'done'

    def _record(self, job: Job, status: str, error: str | None) -> int:
        from zoo.eval.results import HEARTBEAT_ENV

        g = self.bench.groups[job.group]
        # heartbeat_s: another host presumes the row dead 5 beats after it was written if no zoo fit took it over
        # (a zoo fit takes it within seconds and beats from then on)
        run_id = self.store.start_run(self.bench.model_of(job), task=g.task, dataset=g.dataset or None,
                                      seed=job.seed, stage='fit', hparams={'benchmark': self.identity(job)},
                                      recipe=job.recipe, heartbeat_s=float(os.environ.get(HEARTBEAT_ENV, 60)))
        if status != 'running':
            self.store.finish_run(run_id, status, error=error)
        return run_id

    def identity(self, job: Job) -> dict:
        return {'name': self.bench.name, 'group': job.group, 'entry': job.entry, 'key': job.key}

    # -- one job
    def execute(self, job: Job, run_id: int, extra: dict) -> str:
        """``zoo fit`` of one job in a subprocess; returns the status its row ends with."""
        import subprocess

        import zoo

        folder = job_dir(self.bench, job)
        folder.mkdir(parents=True, exist_ok=True)
        argv = [*job.argv(extra), f'--db={self.db}', f'--run_root={folder}',
                '--trainer.enable_progress_bar=false']
        env = {**os.environ, 'ZOO_RUN_ID': str(run_id), 'ZOO_BENCHMARK_JOB': json.dumps(self.identity(job)),
               'PYTHONPATH': os.pathsep.join(filter(None, (str(Path(zoo.__file__).resolve().parents[1]),
                                                          os.environ.get('PYTHONPATH'))))}
        env.pop('ZOO_RUN_DIR', None)
        if self.threads:
            env.update(OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        log = folder / 'fit.log'
        with open(log, 'w') as f:
            f.write('zoo ' + ' '.join(argv) + '\n')
            f.flush()
            code = subprocess.call([sys.executable, '-m', 'zoo.recipes.main', *argv], stdout=f,
                                   stderr=subprocess.STDOUT, env=env, cwd=os.getcwd())
        row = self.store.runs(id=run_id, columns=['status'])
        status = row.status.iloc[0] if len(row) else 'failed'
        if status == 'running' or (code != 0 and status == 'finished'):
            # it died before the logger ended the row: a kill (out of memory, a signal) is ``crashed`` and runs again
            # at the next invocation; an error (a bad config, an import error) is ``failed``
            tail = log.read_text(errors='replace')[-LOG_TAIL:]
            why = f'zoo fit exited with code {code}' if code >= 0 else f'zoo fit was killed by signal {-code}'
            status = 'crashed' if code < 0 else 'failed'
            self.store.finish_run(run_id, status, error=f'{why}; log {log}:\n{tail}')
        return status

    # -- the loop
    def run(self, progress: bool = True) -> dict:
        """Run every pending job, then the seeds the sequential rule adds to the claims still inconclusive, until
        it adds none; returns {'finished': n, 'failed': n, ...}."""
        counts: dict[str, int] = {}
        while True:
            for k, v in self.run_pending(progress).items():
                counts[k] = counts.get(k, 0) + v
            if not self.add_seeds():
                return counts

    def add_seeds(self) -> int:
        """Add the jobs of the next seed of every claim still inconclusive past the convergence gate, below its
        group's cap (``benchmark_claims.seeds_to_add``); returns how many were added."""
        from zoo.eval import results

        from .benchmark_claims import current, decide_claims, seeds_to_add

        if not any(g.max_seeds for g in self.bench.groups.values()):
            return 0
        df = current(self.bench, results.data(db=self.store, status=None), self.store)
        state = self.states()
        attempted: dict = {}
        for j in self.bench.possible_jobs():
            if j.key in state:
                attempted.setdefault((j.group, j.entry), set()).add(j.seed)
        have = {j.key for j in self.jobs}
        added = 0
        claims = decide_claims(self.bench, df, self.store)
        for group, entry, seed in seeds_to_add(self.bench, claims, attempted):
            job = self.bench.job(group, entry, seed)
            if job.key in have:
                continue
            for j in self._with_dependencies([job]):
                if j.key not in have:
                    self.jobs.append(j)
                    have.add(j.key)
                    added += 1
            self.say(f'{group}/{entry}: adding seed {seed} (a claim on it is still inconclusive; cap '
                     f'{self.bench.groups[group].max_seeds} seeds)')
        return added

    def run_pending(self, progress: bool = True) -> dict:
        """Run every pending job with ``workers`` threads; returns {'finished': n, 'failed': n, ...}."""
        todo = len(self.pending())
        counts: dict[str, int] = {}
        if todo == 0:
            return counts
        bar = _progress(progress)
        task = bar.add_task(f'{self.bench.name}', total=todo) if bar is not None else None

        def work():
            while True:
                got = self._take()
                if got == 'done':
                    return
                if got == 'wait':
                    time.sleep(2.0)
                    continue
                job, run_id, extra = got
                t0 = time.perf_counter()
                status = self.execute(job, run_id, extra)
                with self._mutex:
                    counts[status] = counts.get(status, 0) + 1
                    self.done.append((job, status, time.perf_counter() - t0))
                    line = f'{job.group}/{job.entry} seed {job.seed}: {status} ({time.perf_counter() - t0:.0f} s)'
                    if bar is not None:
                        bar.console.print(line)
                        bar.advance(task)
                    else:
                        self.say(line)

        threads = [threading.Thread(target=work, name=f'zoo-benchmark-{i}', daemon=True) for i in range(self.workers)]
        if bar is not None:
            bar.start()
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        finally:
            if bar is not None:
                bar.stop()
        return counts

    # -- latency
    def measure_latency(self) -> int:
        """``zoo bench --db``'s re-measurement of every finished network of the benchmark that has no ``zoo bench``
        record at its group's batch sizes yet; one process, interleaved. Returns the rows written."""
        from zoo.eval import bench as zbench

        with self.store.lock(LOCK.format(name=self.bench.name) + '-latency'):
            state = self.states()
            lat, failed = self.store.latency(), self.store.latency_failures()
            runs = self.store.runs(columns=['id', 'arch_fingerprint', 'hparams'], status='finished')
            fp = dict(zip(runs.id, runs.arch_fingerprint))
            written = 0
            for g in self.bench.groups.values():
                ids = [state[j.key]['id'] for j in self.jobs if j.group == g.name and
                       state.get(j.key, {}).get('status') == 'finished']
                if not ids:
                    continue
                for rt in g.runtimes:
                    for bs in g.batch_sizes:
                        # measured: a trusted record only (zbench.untrusted: load and IQR limits); an old record
                        # taken under load is re-taken
                        ok = zbench.trusted(lat)
                        have = set() if ok is None or ok.empty else set(
                            ok[(ok.source == 'bench') & (ok.batch_size == bs) & _runtime_is(ok, rt)
                               & (ok.device.astype(str) == 'cpu')]     # a GPU's record is not this CPU figure
                            .arch_fingerprint.dropna())
                        if not self.retry and not failed.empty:   # a recorded failure is retried on request only,
                            gave_up = failed[(failed.batch_size == bs) & (failed.runtime == rt)   # but a noisy
                                             & ~failed.error.astype(str).str.startswith('untrusted:')]  # one re-taken
                            have |= set(gave_up.arch_fingerprint.dropna())
                        missing = [i for i in ids if fp.get(i) not in have]
                        if not missing:
                            continue
                        kw = {'runtimes': (rt,)}
                        if self.time_s is not None:
                            kw['budget_s'] = self.time_s
                        fails = []
                        rows = zbench.remeasure(self.db, run_ids=missing, batch_sizes=(bs,), threads=self.threads,
                                                warn=self.say, failures=fails, **kw)
                        written += zbench.record(rows, db=self.db, failures=fails)
                        lat, failed = self.store.latency(), self.store.latency_failures()
            return written


def _runtime_is(lat, runtime: str):
    return lat.runtime.fillna('eager') == runtime


def _progress(enabled: bool):
    """A rich progress bar on stderr with the time left (rich's estimate from the jobs done so far)."""
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    return Progress(TextColumn('[bold]{task.description}'), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn('left'), TimeRemainingColumn(), console=Console(stderr=True))


# ------------------------------------------------------------------------------------------------ the command
def add_parser(sub) -> None:
    """``zoo benchmark run|report NAME``."""
    import argparse

    p = sub.add_parser('benchmark', help='run a benchmark file (benchmarks/NAME.yaml) into its database, or publish '
                                         'its report (docs/benchmarks/NAME.md)',
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog='examples:\n  zoo benchmark run paper_blocks --workers 2\n'
                              '  zoo benchmark report paper_blocks\n\n'
                              '`--dry-run` checks every name of the file against the registry and trains nothing. '
                              'The same run command resumes: it runs only what the database does not hold.')
    p.add_argument('action', choices=['run', 'report'],
                   help='run: train and time what is missing; report: write docs/benchmarks/NAME.md and its figures '
                        'from the database')
    p.add_argument('name', help='benchmarks/NAME.yaml (or a path to a benchmark file)')
    p.add_argument('--db', help='results database (path or SQLAlchemy URL; default ./benchmarks/NAME.db in the '
                                'working folder)')
    p.add_argument('--workers', type=at_least(1), default=1, metavar='N', help='jobs trained at a time (default 1)')
    p.add_argument('--retry-failed', action='store_true',
                   help='run the failed jobs, and the failed latency measurements, again')
    p.add_argument('--no-latency', action='store_true', help='train only; do not measure latency afterwards')
    p.add_argument('--group', action='append', metavar='GROUP',
                   help='run only this group (repeatable; a group it fine-tunes from runs too)')
    p.add_argument('--fresh-seeds', action='store_true',
                   help="run: the file's recheck groups on fresh seeds (recheck: seeds_from), the stability check "
                        'the report sets beside the main verdicts')
    p.add_argument('--dry-run', action='store_true',
                   help='check every name of the file and list what would run; train nothing')
    p.add_argument('--threads', type=at_least(1), metavar='K', help='torch threads of each job and of the timing')
    p.add_argument('--time', type=at_least(0, float), metavar='SECONDS',
                   help='timing budget per network and batch size (as zoo bench --time; default 2; 0: 20 calls)')
    p.add_argument('--out', help='report: the folder to write NAME.md into (default ./docs/benchmarks in the '
                                 'working folder)')
    benchmark_executor.add_arguments(p)           # --executor slurm|submitit-local and its options
    p.set_defaults(func=command)


def command(args) -> int:
    try:
        bench = load(args.name)
    except BenchmarkError as e:
        print(f'zoo benchmark: error: {e}', file=sys.stderr)
        return 2
    db = args.db or default_db(bench)
    if args.action == 'report' and (args.group or args.fresh_seeds):
        # the page is the whole file's: a partial one written over it would lose its other groups
        print('zoo benchmark: error: --group and --fresh-seeds select what `run` trains; `report` writes the whole '
              "file's page (the fresh seeds' verdicts are on it)", file=sys.stderr)
        return 2
    try:
        if args.fresh_seeds:
            bench = bench.fresh_seeds()
        if args.group:
            bench = only_groups(bench, args.group)
    except BenchmarkError as e:
        print(f'zoo benchmark: error: {e}', file=sys.stderr)
        return 2
    if args.action == 'report':
        from .benchmark_report import write_report

        from zoo.eval.results import open_db
        try:
            open_db(db, create=False)
        except ValueError as e:
            print(f'zoo benchmark: error: {e} (run `zoo benchmark run {args.name}` first)', file=sys.stderr)
            return 2
        md = write_report(bench, db, out=args.out)
        print(f'zoo benchmark: wrote {md}', file=sys.stderr)
        return 0
    if args.dry_run:
        try:
            n = check(bench, say=print)
        except BenchmarkError as e:
            print(f'zoo benchmark: error: {e}', file=sys.stderr)
            return 2
        pending = Runner(bench, db).pending() if _exists(db) else bench.jobs()
        print(f'{bench.name}: {len(bench.groups)} groups, {n} jobs, {len(pending)} not yet in {db}')
        return 0
    try:
        submitit_run = benchmark_executor.from_args(args, bench)      # None: the runner's threads
    except benchmark_executor.ExecutorError as e:
        print(f'zoo benchmark: error: {e}', file=sys.stderr)
        return 2
    runner = Runner(bench, db, workers=args.workers, retry_failed=args.retry_failed, threads=args.threads,
                    time_s=args.time)
    todo = len(runner.pending())
    print(f'zoo benchmark: {bench.name}: {len(runner.jobs)} jobs, {todo} to run, database {db}', file=sys.stderr)
    counts = (runner.run(progress=sys.stderr.isatty()) if submitit_run is None else
              benchmark_executor.submit(runner, **submitit_run))
    if not args.no_latency:
        n = runner.measure_latency()
        if n:
            print(f'zoo benchmark: {n} latency rows written', file=sys.stderr)
    failed = [k for k, s in runner.states().items() if s['status'] == 'failed' and k in {j.key for j in runner.jobs}]
    summary = ', '.join(f'{v} {k}' for k, v in sorted(counts.items())) or 'nothing to do'
    print(f'zoo benchmark: {summary}' + (f'; {len(failed)} job(s) failed (see `zoo results --runs --db {db}`; '
                                          f'--retry-failed runs them again)' if failed else ''), file=sys.stderr)
    return 1 if failed else 0


def only_groups(bench: Benchmark, names: list[str]) -> Benchmark:
    """The benchmark restricted to ``names`` and the groups they fine-tune from (``pretrained_from``)."""
    import dataclasses

    from .benchmark_spec import _close

    keep = []
    for n in names:
        if n not in bench.groups:
            raise BenchmarkError(f'no group {n!r} in {bench.path}{_close(n, list(bench.groups))}')
        while n is not None and n not in keep:
            keep.append(n)
            pf = bench.groups[n].pretrained_from
            n = pf['group'] if pf else None
    across = {k: v for k, v in bench.across.items() if set(v['groups']) <= set(keep)}
    return dataclasses.replace(bench, groups={k: g for k, g in bench.groups.items() if k in keep}, across=across)


def _exists(db: str) -> bool:
    from zoo.eval.results import resolve_url
    url = resolve_url(db)
    if url is None:
        return False
    return not url.startswith('sqlite:///') or Path(url.split(':///', 1)[1]).exists()
