"""The results database: every run, its metrics, and every latency measurement, in one store.

LEMUR-style (ABrain-One/nn-dataset keeps per-model accuracy and latency in SQLite), with the points
LEMUR misses done differently:

- failed, pruned and crashed runs are kept with their status (LEMUR drops sub-threshold trials);
- latency is keyed by model, architecture fingerprint, input shape, batch, device, threads, dtype,
  layout and compilation (LEMUR keys it by model name);
- Optuna studies live in the same database (its own tables beside ours), so sweeps resume;
- every run records its seed, and comparisons report a bootstrap interval over seeds;
- a schema version with a migration list, and an architecture fingerprint that recognises two
  names for the same network.

The store is any SQLAlchemy URL; the default is one SQLite file, ``$ZOO_DB`` or ``./zoo-results.db``
(``ZOO_DB=none`` disables recording). Our tables are prefixed ``zoo_`` and the schema version lives in
``zoo_schema`` (Optuna uses ``alembic_version`` and ``version_info`` in the same database, so we keep
out of both). Migrations are a short ordered list of functions that use Alembic's ``Operations``
(which handles SQLite's limited ``ALTER TABLE``).

>>> from zoo.eval import results
>>> results.runs(status='finished')                       # a pandas DataFrame
>>> results.leaderboard('classification', 'digits', 'val/acc1')
>>> results.plot_pareto(results.leaderboard(...), 'pareto.png')
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy import event, exc as sa_exc

from .profile import fingerprint  # noqa: F401  (re-exported: part of the results API)

SCHEMA_VERSION = 3
DEFAULT_PATH = 'zoo-results.db'
STATUSES = ('running', 'finished', 'failed', 'pruned', 'crashed')
DISABLED = ('none', 'off', '0', 'false', '')
# Crash detection. On the run's own host its pid is checked. Elsewhere (a shared server, a shared file)
# the heartbeat decides: the recording callback refreshes ``heartbeat_at`` every ``heartbeat_s`` seconds
# (``$ZOO_HEARTBEAT_S``, default 60) from a background thread, and a run whose heartbeat is older than
# STALE_BEATS intervals (at least STALE_MIN, which also absorbs clock skew between hosts) is crashed.
# Runs without a heartbeat interval (written before schema 3, or by hand) fall back to STALE_AFTER.
HEARTBEAT_ENV = 'ZOO_HEARTBEAT_S'
DEFAULT_HEARTBEAT_S = 60.0
STALE_BEATS = 5
STALE_MIN = _dt.timedelta(minutes=2)
STALE_AFTER = _dt.timedelta(hours=24)


_PG_MIGRATION_LOCK = 0x7A6F6F5343       # PostgreSQL advisory lock key of schema migrations ('zooSC')


class ResultsDBError(ValueError):
    """The results database cannot be used as asked (bad file, newer schema, unreachable server, bad query).
    A ValueError, so the CLI reports it as a one-line error."""


# ----------------------------------------------------------------------------------------------------- schema
metadata = sa.MetaData()

schema_table = sa.Table(
    'zoo_schema', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('version', sa.Integer, nullable=False),
    sa.Column('updated_at', sa.DateTime, nullable=False),
)

runs_table = sa.Table(
    'zoo_runs', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('uid', sa.String(32), nullable=False, unique=True),
    sa.Column('model', sa.String(200), nullable=False, index=True),
    sa.Column('variant', sa.String(100)),
    sa.Column('family', sa.String(100)),
    sa.Column('task', sa.String(50), index=True),
    sa.Column('dataset', sa.String(100), index=True),
    sa.Column('stage', sa.String(20)),                        # fit | validate | test | predict
    sa.Column('recipe', sa.String(500)),                      # the config file(s) the run came from
    sa.Column('config', sa.JSON),                             # resolved config
    sa.Column('hparams', sa.JSON),                            # the system's save_hyperparameters()
    sa.Column('block_choices', sa.JSON),                      # {'token_mixer': 'pooling', ...}
    sa.Column('config_key', sa.String(16), index=True),       # hash of everything but the seed: repeats share it
    sa.Column('seed', sa.Integer),
    sa.Column('max_epochs', sa.Integer),                      # the epoch budget (LEMUR mixes 1- and 5-epoch rows)
    sa.Column('status', sa.String(10), nullable=False, index=True),
    sa.Column('error', sa.Text),
    sa.Column('started_at', sa.DateTime, nullable=False),
    sa.Column('ended_at', sa.DateTime),
    sa.Column('heartbeat_at', sa.DateTime),
    sa.Column('wall_s', sa.Float),
    sa.Column('git_commit', sa.String(64)),
    sa.Column('env', sa.JSON),                                # torch/lightning versions, device, threads, cpu
    sa.Column('host', sa.String(200)),
    sa.Column('pid', sa.Integer),
    sa.Column('proc_start', sa.String(32)),                   # process start time (pid reuse guard)
    # v2
    sa.Column('arch_fingerprint', sa.String(16), index=True),
    sa.Column('params', sa.BigInteger),
    sa.Column('macs', sa.BigInteger),
    sa.Column('study_name', sa.String(200), index=True),
    sa.Column('trial_number', sa.Integer),
    # v3
    sa.Column('heartbeat_s', sa.Float),                       # the writer's heartbeat interval (crash detection)
)

metrics_table = sa.Table(
    'zoo_metrics', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('run_id', sa.Integer, sa.ForeignKey('zoo_runs.id', ondelete='CASCADE'), nullable=False, index=True),
    sa.Column('name', sa.String(100), nullable=False),        # 'val/acc1'
    sa.Column('split', sa.String(20)),                        # 'val'
    sa.Column('value', sa.Float),
    sa.Column('epoch', sa.Integer),
    sa.Column('step', sa.Integer),
    sa.Column('final', sa.Boolean, nullable=False, default=False),
)

latency_table = sa.Table(
    'zoo_latency', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('run_id', sa.Integer, sa.ForeignKey('zoo_runs.id', ondelete='SET NULL'), index=True),
    sa.Column('model', sa.String(200), nullable=False, index=True),
    sa.Column('input_shape', sa.String(50), nullable=False),  # '3x224x224' (one sample)
    sa.Column('batch_size', sa.Integer, nullable=False),
    sa.Column('device', sa.String(100), nullable=False),
    sa.Column('threads', sa.Integer),
    sa.Column('dtype', sa.String(20)),
    sa.Column('channels_last', sa.Boolean),
    sa.Column('compiled', sa.Boolean),
    sa.Column('mode', sa.String(20)),                         # inference | train
    sa.Column('median_ms', sa.Float, nullable=False),
    sa.Column('min_ms', sa.Float),
    sa.Column('max_ms', sa.Float),
    sa.Column('iqr_ms', sa.Float),
    sa.Column('throughput', sa.Float),                        # samples / s at the median
    sa.Column('repeats', sa.Integer),
    sa.Column('params', sa.BigInteger),
    sa.Column('macs', sa.BigInteger),
    sa.Column('torch_version', sa.String(50)),
    sa.Column('host', sa.String(200)),
    sa.Column('measured_at', sa.DateTime, nullable=False),
    # v2
    sa.Column('arch_fingerprint', sa.String(16), index=True),
)

architectures_table = sa.Table(                               # v2: every name a fingerprint was seen under
    'zoo_architectures', metadata,
    sa.Column('fingerprint', sa.String(16), primary_key=True),
    sa.Column('model', sa.String(200), primary_key=True),
    sa.Column('params', sa.BigInteger),
    sa.Column('first_seen', sa.DateTime, nullable=False),
)


# ------------------------------------------------------------------------------------------------- migrations
def _col(table: sa.Table, name: str) -> sa.Column:
    """A copy of a current column for a migration; indexes are created explicitly, by name."""
    c = table.c[name]._copy()      # (foreign keys are not copied: migrations add them as constraints)
    c.index = None
    return c


def _v1(op) -> None:
    """Version 1: runs, metrics and latency, without fingerprints or sweep links."""
    later = {'zoo_runs': {'arch_fingerprint', 'params', 'macs', 'study_name', 'trial_number', 'heartbeat_s'},
             'zoo_latency': {'arch_fingerprint'}, 'zoo_metrics': set()}
    fks = {'zoo_runs': [], 'zoo_metrics': [sa.ForeignKeyConstraint(['run_id'], ['zoo_runs.id'], ondelete='CASCADE')],
           'zoo_latency': [sa.ForeignKeyConstraint(['run_id'], ['zoo_runs.id'], ondelete='SET NULL')]}
    for table in (runs_table, metrics_table, latency_table):
        op.create_table(table.name, *[_col(table, c.name) for c in table.columns if c.name not in later[table.name]],
                        *fks[table.name])
    for table, col in (('zoo_runs', 'model'), ('zoo_runs', 'task'), ('zoo_runs', 'dataset'), ('zoo_runs', 'status'),
                       ('zoo_runs', 'config_key'), ('zoo_metrics', 'run_id'), ('zoo_latency', 'run_id'),
                       ('zoo_latency', 'model')):
        op.create_index(f'ix_{table}_{col}', table, [col])


def _v2(op) -> None:
    """Version 2: architecture fingerprints (and the name table), params/MACs on runs, sweep links."""
    for name in ('arch_fingerprint', 'params', 'macs', 'study_name', 'trial_number'):
        op.add_column('zoo_runs', _col(runs_table, name))
    op.add_column('zoo_latency', _col(latency_table, 'arch_fingerprint'))
    for table, col in (('zoo_runs', 'arch_fingerprint'), ('zoo_runs', 'study_name'),
                       ('zoo_latency', 'arch_fingerprint')):
        op.create_index(f'ix_{table}_{col}', table, [col])
    op.create_table('zoo_architectures', *[_col(architectures_table, c.name) for c in architectures_table.columns])


def _v3(op) -> None:
    """Version 3: the heartbeat interval of a run, so other hosts can tell a dead run in minutes, not a day."""
    op.add_column('zoo_runs', _col(runs_table, 'heartbeat_s'))


MIGRATIONS = [_v1, _v2, _v3]          # MIGRATIONS[i] takes the schema from version i to version i + 1
assert len(MIGRATIONS) == SCHEMA_VERSION


# -------------------------------------------------------------------------------------------------- the store
def resolve_url(db: str | os.PathLike | None = None) -> str | None:
    """``db`` → an SQLAlchemy URL. ``None`` reads ``$ZOO_DB`` (default ``./zoo-results.db``);
    'none' disables recording (returns None); a plain path becomes a SQLite URL."""
    if db is None:
        db = os.environ.get('ZOO_DB', DEFAULT_PATH)
    db = str(db)
    if db.strip().lower() in DISABLED:
        return None
    if '://' in db:
        return db
    return f'sqlite:///{Path(db).expanduser().resolve()}'


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux), to tell a live run from a recycled pid."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                                    # exists, owned by someone else
    return proc_start is None or _proc_start(pid) in (None, proc_start)


class ResultsDB:
    """One results store. Writes are transactions; opening it marks runs whose process died ``crashed``."""

    def __init__(self, url: str | None = None, *, check_crashed: bool = True):
        url = resolve_url(url)
        if url is None:
            raise ResultsDBError('the results database is disabled (ZOO_DB=none); pass a path or URL')
        self.url = url
        self._sqlite = url.startswith('sqlite')
        if self._sqlite:
            path = sa.engine.make_url(url).database
            if path and path != ':memory:':
                if Path(path).is_dir():
                    raise ResultsDBError(f'results database path {path} is a directory; expected a SQLite file')
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        kw = {'connect_args': {'timeout': 120}} if self._sqlite else {'pool_pre_ping': True}
        try:
            self.engine = sa.create_engine(url, **kw)
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as e:
            raise ResultsDBError(f'cannot use results database URL {url!r}: {e}') from e
        if self._sqlite:
            self._sqlite_events()
        try:
            self._migrate()
            if check_crashed:
                self.mark_crashed()
        except sa_exc.DatabaseError as e:
            self.engine.dispose()
            orig = getattr(e, 'orig', e)
            if self._sqlite and any(m in str(orig) for m in ('not a database', 'malformed')):
                raise ResultsDBError(f'{path} is not a SQLite database (or it is corrupt); it was left untouched. '
                                     'Point ZOO_DB/--db at another file.') from e
            raise ResultsDBError(f'cannot open results database {self._safe_url()}: {orig}') from e

    def _safe_url(self) -> str:
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

    def _sqlite_events(self) -> None:
        # pysqlite's own transaction handling starts transactions lazily and deferred, so two writers
        # can deadlock upgrading their locks ("database is locked" without waiting). We issue BEGIN
        # IMMEDIATE for writes ourselves, which waits on the busy timeout instead (SQLAlchemy's recipe).
        @event.listens_for(self.engine, 'connect')
        def _connect(dbapi_conn, _):
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute('PRAGMA foreign_keys=ON')
            # WAL: readers never block the writer (a notebook open while a sweep runs), and with
            # synchronous=NORMAL a commit needs no fsync (durable across process crashes; a power cut may
            # lose the last commits, never corrupt the file). Not for network file systems (use a server URL).
            if cur.execute('PRAGMA journal_mode').fetchone()[0].lower() != 'wal':
                cur.execute('PRAGMA journal_mode=WAL')
            cur.execute('PRAGMA synchronous=NORMAL')
            cur.close()

        @event.listens_for(self.engine, 'begin')
        def _begin(conn):
            conn.exec_driver_sql('BEGIN IMMEDIATE' if conn.get_execution_options().get('write') else 'BEGIN')

    @contextlib.contextmanager
    def write(self):
        """A write transaction (committed on exit, rolled back on error)."""
        with self.engine.connect().execution_options(write=True) as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def read(self):
        with self.engine.connect() as conn:
            yield conn

    # --- schema
    def schema_version(self) -> int:
        with self.read() as conn:
            if not sa.inspect(conn).has_table('zoo_schema'):
                return 0
            return conn.execute(sa.select(schema_table.c.version)).scalar() or 0

    def _migrate(self) -> None:
        from alembic.migration import MigrationContext
        from alembic.operations import Operations

        with self.write() as conn:
            if conn.dialect.name == 'postgresql':
                # Processes opening a fresh server database together would race to create the tables
                # (SQLite serialises them with BEGIN IMMEDIATE): one migrates, the others wait, then see it done.
                conn.execute(sa.text('SELECT pg_advisory_xact_lock(:k)'), {'k': _PG_MIGRATION_LOCK})
            has = sa.inspect(conn).has_table('zoo_schema')
            version = conn.execute(sa.select(schema_table.c.version)).scalar() if has else 0
            version = version or 0
            if version > SCHEMA_VERSION:
                raise ResultsDBError(
                    f'results database {self._safe_url()} has schema version {version}, newer than this zoo '
                    f'(version {SCHEMA_VERSION}); upgrade zoo to use it. Nothing was changed.')
            if version == SCHEMA_VERSION:
                return
            if not has:
                schema_table.create(conn)
            op = Operations(MigrationContext.configure(conn))
            for migration in MIGRATIONS[version:]:
                migration(op)
            if has:
                conn.execute(schema_table.update().values(version=SCHEMA_VERSION, updated_at=_now()))
            else:
                conn.execute(schema_table.insert().values(id=1, version=SCHEMA_VERSION, updated_at=_now()))

    # --- runs
    def start_run(self, model: str, **fields) -> int:
        """Insert a ``running`` run (host and pid recorded for crash detection); returns its id."""
        unknown = set(fields) - set(runs_table.c.keys())
        if unknown:
            raise ResultsDBError(f'unknown run field(s) {sorted(unknown)}; known: {sorted(runs_table.c.keys())}')
        now = _now()
        row = dict(uid=os.urandom(16).hex(), model=model, status='running', started_at=now, heartbeat_at=now,
                   host=socket.gethostname(), pid=os.getpid(), proc_start=_proc_start(os.getpid()))
        row.update(fields)
        if row.get('config_key') is None:
            row['config_key'] = config_key(model, row.get('dataset'), row.get('hparams'), row.get('block_choices'),
                                           row.get('max_epochs'))
        with self.write() as conn:
            run_id = conn.execute(runs_table.insert().values(**_jsonable_row(row))).inserted_primary_key[0]
            if row.get('arch_fingerprint'):
                self._add_architecture(conn, row['arch_fingerprint'], model, row.get('params'))
        return run_id

    def update_run(self, run_id: int, **fields) -> None:
        with self.write() as conn:
            conn.execute(runs_table.update().where(runs_table.c.id == run_id).values(**_jsonable_row(fields)))
            if fields.get('arch_fingerprint'):
                model = conn.execute(sa.select(runs_table.c.model).where(runs_table.c.id == run_id)).scalar()
                self._add_architecture(conn, fields['arch_fingerprint'], model, fields.get('params'))

    def log_metrics(self, run_id: int, metrics: dict[str, float], epoch: int | None = None, step: int | None = None,
                    final: bool = False) -> None:
        """Metric values of one epoch (or the final ones), written together with a heartbeat."""
        rows = [dict(run_id=run_id, name=k, split=k.split('/', 1)[0] if '/' in k else None, value=float(v),
                     epoch=epoch, step=step, final=final) for k, v in metrics.items()]
        with self.write() as conn:
            if final:       # one final value per metric: a repeated stage (fit then test) replaces it
                conn.execute(metrics_table.delete().where(metrics_table.c.run_id == run_id, metrics_table.c.final,
                                                          metrics_table.c.name.in_(list(metrics))))
            if rows:
                conn.execute(metrics_table.insert(), rows)
            conn.execute(runs_table.update().where(runs_table.c.id == run_id).values(heartbeat_at=_now()))

    def finish_run(self, run_id: int, status: str = 'finished', error: str | None = None) -> None:
        if status not in STATUSES:
            raise ResultsDBError(f'unknown status {status!r}; expected one of {STATUSES}')
        now = _now()
        with self.write() as conn:
            started = conn.execute(sa.select(runs_table.c.started_at).where(runs_table.c.id == run_id)).scalar()
            if started is None:
                raise ResultsDBError(f'no run with id {run_id} in {self._safe_url()}')
            conn.execute(runs_table.update().where(runs_table.c.id == run_id).values(
                status=status, error=error, ended_at=now, heartbeat_at=now,
                wall_s=(now - started).total_seconds()))

    def heartbeat(self, run_id: int) -> bool:
        """Refresh a running run's ``heartbeat_at``; False once the run is no longer ``running``."""
        with self.write() as conn:
            return conn.execute(runs_table.update().where(runs_table.c.id == run_id, runs_table.c.status == 'running')
                                .values(heartbeat_at=_now())).rowcount > 0

    def start_heartbeat(self, run_id: int, interval_s: float | None = None) -> 'Heartbeat':
        """Record ``interval_s`` on the run and refresh its heartbeat from a daemon thread until stopped."""
        if interval_s is None:
            raw = os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S)
            try:
                interval_s = float(raw)
            except ValueError:
                raise ResultsDBError(f'{HEARTBEAT_ENV} must be a positive number of seconds; got {raw!r}') from None
        if not interval_s > 0:
            raise ResultsDBError(f'{HEARTBEAT_ENV} must be a positive number of seconds; got {interval_s}')
        self.update_run(run_id, heartbeat_s=float(interval_s), heartbeat_at=_now())
        return Heartbeat(self, run_id, float(interval_s))

    @staticmethod
    def stale_after(heartbeat_s: float | None) -> _dt.timedelta:
        """How old a heartbeat written every ``heartbeat_s`` seconds may be before its run is presumed dead."""
        if heartbeat_s is None or heartbeat_s != heartbeat_s:
            return STALE_AFTER
        return max(STALE_MIN, _dt.timedelta(seconds=STALE_BEATS * heartbeat_s))

    def mark_crashed(self) -> int:
        """Mark ``running`` runs whose process is gone as ``crashed``; returns how many.

        On this host the pid (and its start time) is checked. A run from another host is presumed dead
        when its heartbeat is older than ``stale_after(heartbeat_s)``: 5 intervals, at least 2 minutes
        (5 minutes with the default 60 s interval), or 24 h for runs that record no interval."""
        host, now = socket.gethostname(), _now()
        with self.read() as conn:
            running = conn.execute(sa.select(runs_table.c.id, runs_table.c.host, runs_table.c.pid,
                                             runs_table.c.proc_start, runs_table.c.heartbeat_at,
                                             runs_table.c.heartbeat_s)
                                   .where(runs_table.c.status == 'running')).all()
        dead = [r.id for r in running
                if (r.host == host and r.pid is not None and not _pid_alive(r.pid, r.proc_start))
                or ((r.host != host or r.pid is None) and r.heartbeat_at is not None
                    and now - r.heartbeat_at > self.stale_after(r.heartbeat_s))]
        if dead:
            with self.write() as conn:
                conn.execute(runs_table.update().where(runs_table.c.id.in_(dead), runs_table.c.status == 'running')
                             .values(status='crashed', ended_at=now,
                                     error='process ended without recording a result (killed or crashed)'))
        return len(dead)

    # --- latency
    def add_latency(self, model: str, median_ms: float, *, input_shape, batch_size: int, device: str = 'cpu',
                    **fields) -> int:
        """One latency row. ``fields``: threads, dtype, channels_last, compiled, mode, min_ms, max_ms, iqr_ms,
        throughput, repeats, params, macs, arch_fingerprint, run_id."""
        unknown = set(fields) - set(latency_table.c.keys())
        if unknown:
            raise ResultsDBError(f'unknown latency field(s) {sorted(unknown)}; known: {sorted(latency_table.c.keys())}')
        if not isinstance(input_shape, str):
            input_shape = 'x'.join(str(int(s)) for s in input_shape)
        import torch
        row = dict(model=model, median_ms=float(median_ms), input_shape=input_shape, batch_size=int(batch_size),
                   device=device, torch_version=torch.__version__, host=socket.gethostname(), measured_at=_now())
        row.update(fields)
        with self.write() as conn:
            lat_id = conn.execute(latency_table.insert().values(**row)).inserted_primary_key[0]
            if row.get('arch_fingerprint'):
                self._add_architecture(conn, row['arch_fingerprint'], model, row.get('params'))
        return lat_id

    def add_latency_record(self, rec: dict, **extra) -> int:
        """A row from ``eval.profile.Latency.as_dict()`` (plus params/macs), as ``zoo bench`` produces."""
        keys = set(latency_table.c.keys()) - {'id', 'model', 'median_ms', 'input_shape', 'batch_size', 'device'}
        fields = {k: v for k, v in {**rec, **extra}.items() if k in keys}
        return self.add_latency(rec['model'], rec['median_ms'], input_shape=rec.get('input_size') or rec['input_shape'],
                                batch_size=rec['batch_size'], device=rec.get('device', 'cpu'), **fields)

    def _add_architecture(self, conn, fingerprint: str, model: str, params: int | None) -> None:
        seen = conn.execute(sa.select(architectures_table.c.model).where(
            architectures_table.c.fingerprint == fingerprint, architectures_table.c.model == model)).first()
        if seen is None:
            conn.execute(architectures_table.insert().values(fingerprint=fingerprint, model=model, params=params,
                                                             first_seen=_now()))

    # --- queries
    def runs(self, *, model: str | None = None, columns: Iterable[str] | None = None, **filters):
        """Runs as a DataFrame. ``model`` is a glob pattern; other keywords filter by equality (a list means
        'any of'). Final metrics are added as columns named after the metric ('val/acc1')."""
        import pandas as pd

        q = sa.select(runs_table)
        with self.read() as conn:
            q = _filter(q, runs_table, _expand_glob(conn, runs_table, model), filters)
            df = pd.read_sql(q.order_by(runs_table.c.id), conn)
            fm = pd.read_sql(sa.select(metrics_table.c.run_id, metrics_table.c.name, metrics_table.c.value)
                             .where(metrics_table.c.final), conn)
        if not fm.empty and not df.empty:
            wide = fm.pivot_table(index='run_id', columns='name', values='value', aggfunc='last')
            df = df.merge(wide, left_on='id', right_index=True, how='left')
        return _select_columns(df, columns)

    def metrics(self, run_id: int | None = None, *, name: str | None = None, final: bool | None = None):
        """Metric rows (per epoch and final) as a DataFrame, joined with the run's model, dataset and seed."""
        import pandas as pd

        q = (sa.select(metrics_table, runs_table.c.model, runs_table.c.dataset, runs_table.c.seed,
                       runs_table.c.status)
             .join(runs_table, runs_table.c.id == metrics_table.c.run_id))
        if run_id is not None:
            q = q.where(metrics_table.c.run_id == run_id)
        if name is not None:
            q = q.where(metrics_table.c.name == name)
        if final is not None:
            q = q.where(metrics_table.c.final == final)
        with self.read() as conn:
            return pd.read_sql(q.order_by(metrics_table.c.id), conn)

    def latency(self, *, model: str | None = None, columns: Iterable[str] | None = None, **filters):
        """Latency rows as a DataFrame (``model`` is a glob pattern; other keywords filter by equality)."""
        import pandas as pd

        with self.read() as conn:
            q = _filter(sa.select(latency_table), latency_table, _expand_glob(conn, latency_table, model), filters)
            df = pd.read_sql(q.order_by(latency_table.c.id), conn)
        return _select_columns(df, columns)

    def aliases(self, model_or_fingerprint: str) -> list[str]:
        """Every model name recorded with the same architecture fingerprint."""
        t = architectures_table
        with self.read() as conn:
            fps = conn.execute(sa.select(t.c.fingerprint).where(
                (t.c.model == model_or_fingerprint) | (t.c.fingerprint == model_or_fingerprint))).scalars().all()
            if not fps:
                return []
            return sorted(set(conn.execute(sa.select(t.c.model).where(t.c.fingerprint.in_(fps))).scalars()))

    def leaderboard(self, task: str | None = None, dataset: str | None = None, metric: str = 'val/acc1', *,
                    model: str | None = None, higher_is_better: bool | None = None, n_boot: int = 2000):
        """Best configuration per model: mean ± 95 % bootstrap CI of the final ``metric`` over seeds, with
        params, MACs and batch-1 latency. One row per model, best first."""
        return leaderboard(task, dataset, metric, db=self, model=model, higher_is_better=higher_is_better,
                           n_boot=n_boot)

    def close(self) -> None:
        self.engine.dispose()


def _jsonable_row(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        col = runs_table.c.get(k)
        out[k] = _jsonable(v) if col is not None and isinstance(col.type, sa.JSON) else v
    return out


def _jsonable(v):
    """Round-trip through JSON with ``str`` for anything exotic (paths, dtypes, classes)."""
    return json.loads(json.dumps(v, default=str))


def _filter(q, table, model: str | None, filters: dict):
    cols = table.c
    for k, v in filters.items():
        if v is None:
            continue
        if k not in cols:
            raise ResultsDBError(f'unknown column {k!r} for {table.name}; known: {", ".join(cols.keys())}')
        q = q.where(cols[k].in_(list(v)) if isinstance(v, (list, tuple, set)) else cols[k] == v)
    if isinstance(model, list):          # a bracket pattern, already expanded to the names it matches
        q = q.where(cols.model.in_(model))
    elif model:
        if any(ch in model for ch in '*?'):
            like = model.replace('%', r'\%').replace('_', r'\_').replace('*', '%').replace('?', '_')
            q = q.where(cols.model.like(like, escape='\\'))
        else:
            q = q.where(cols.model == model)
    return q


def _expand_glob(conn, table, model):
    """A glob with a character class ('[ab]*') has no SQL LIKE equivalent: match the stored names here."""
    if not model or '[' not in model:
        return model
    names = conn.execute(sa.select(table.c.model).distinct()).scalars()
    return [m for m in names if fnmatch.fnmatchcase(m, model)]


def _select_columns(df, columns):
    if columns is None:
        return df
    columns = list(columns)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ResultsDBError(f'unknown column(s) {missing}; available: {", ".join(map(str, df.columns))}')
    return df[columns]


# ----------------------------------------------------------------------------------------- fingerprints, keys
def config_key(model: str, dataset: str | None, hparams: dict | None, block_choices: dict | None,
               max_epochs: int | None) -> str:
    """What makes two runs repeats of one configuration: everything but the seed."""
    hp = {k: v for k, v in (hparams or {}).items() if k not in ('seed', 'seed_everything')}
    blob = json.dumps([model, dataset, hp, block_choices or {}, max_epochs], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def git_commit(path: str | None = None) -> str | None:
    """HEAD of the checkout (with '+dirty' when the working tree has changes), or None outside git."""
    cwd = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=cwd, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ('+dirty' if dirty else '')
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str = 'cpu') -> dict:
    """The facts a number depends on, as columns of the run (not a file name, unlike timm's CSVs)."""
    import torch
    env = {'torch': torch.__version__, 'python': platform.python_version(), 'device': device,
           'threads': torch.get_num_threads(), 'cpu': _cpu_name(), 'os': platform.platform(terse=True)}
    if torch.cuda.is_available():
        env['cuda'] = torch.version.cuda
        env['gpu'] = torch.cuda.get_device_name()
    for mod in ('lightning', 'optuna'):
        try:
            env[mod] = __import__(mod).__version__ if mod in __import__('sys').modules else None
        except Exception:               # pragma: no cover - a broken install must not stop recording
            env[mod] = None
    return env


@functools.lru_cache(maxsize=None)
def _cpu_name() -> str:
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Heartbeat:
    """A daemon thread that refreshes one run's heartbeat every ``interval_s`` seconds (a thread rather than
    a training hook, so a long epoch, a slow validation or a compile keeps the run alive too)."""

    def __init__(self, store: ResultsDB, run_id: int, interval_s: float):
        self.store, self.run_id, self.interval_s = store, run_id, interval_s
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f'zoo-heartbeat-{run_id}', daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.store.heartbeat(self.run_id):
                    return                      # the run has ended
                self.beats += 1
            except sa_exc.SQLAlchemyError:      # a busy or briefly unreachable server: try again next beat
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


# --------------------------------------------------------------------------------------------- module-level API
_DBS: dict[str, ResultsDB] = {}
_LOCK = threading.Lock()


def open_db(db: str | os.PathLike | ResultsDB | None = None) -> ResultsDB:
    """The store for ``db`` (a path, a URL, None for ``$ZOO_DB``), opened once per process and URL."""
    if isinstance(db, ResultsDB):
        return db
    url = resolve_url(db)
    if url is None:
        raise ResultsDBError('the results database is disabled (ZOO_DB=none); pass --db PATH or set ZOO_DB')
    with _LOCK:
        if url not in _DBS:
            _DBS[url] = ResultsDB(url)
        return _DBS[url]


def runs(*, db=None, **kw):
    """Runs as a pandas DataFrame (see ``ResultsDB.runs``)."""
    return open_db(db).runs(**kw)


def metrics(run_id: int | None = None, *, db=None, **kw):
    return open_db(db).metrics(run_id, **kw)


def latency(*, db=None, **kw):
    """Latency rows as a pandas DataFrame (see ``ResultsDB.latency``)."""
    return open_db(db).latency(**kw)


# ------------------------------------------------------------------------------------------------- statistics
def bootstrap_ci(values, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (NaN for fewer than two values)."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return float('nan'), float('nan')
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def iqm(values) -> float:
    """Interquartile mean (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", 2021):
    the mean of the middle 50 %, robust to one outlying seed."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    return float(_iqm_rows(x)) if len(x) else float('nan')


def _iqm_rows(x):
    """IQM along the last axis: the mean of the middle 50 % of the scores (25 % trimmed each side)."""
    from scipy.stats import trim_mean
    return trim_mean(x, 0.25, axis=-1)


AGGREGATE_STATISTICS = {'iqm': _iqm_rows, 'mean': lambda x: x.mean(axis=-1)}


def stratified_bootstrap(strata, statistic, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile interval of ``statistic`` over the pooled scores of several strata (tasks), resampling
    the runs of each stratum independently, so every replicate keeps each task's number of runs
    (Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice";
    google-research/rliable). ``statistic`` maps an (n_boot, n_runs) array to n_boot values.
    Returns (low, high); NaN when a stratum has fewer than two runs (nothing to resample)."""
    import numpy as np

    strata = [np.asarray(x, dtype=float) for x in strata]
    if not strata or any(len(x) < 2 for x in strata):
        return float('nan'), float('nan')
    rng = np.random.default_rng(seed)
    # (n_boot, n_i) per stratum, drawn within it only, then side by side: (n_boot, sum n_i)
    sample = np.concatenate([x[rng.integers(0, len(x), size=(n_boot, len(x)))] for x in strata], axis=1)
    reps = statistic(sample)
    a = (1 - level) / 2
    return float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


AGGREGATE_COLUMNS = ['model', 'n_tasks', 'n_runs', 'runs_per_task', 'iqm', 'iqm_low', 'iqm_high', 'mean',
                     'mean_low', 'mean_high', 'note']


def aggregate(metric: str = 'val/acc1', *, db=None, model: str | None = None, task: str | None = None,
              dataset: str | None = None, by: tuple[str, ...] = ('task', 'dataset'), configs: str = 'best',
              common: bool = True, normalize: dict | None = None, higher_is_better: bool | None = None,
              n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Compare models over several tasks and seeds: interquartile mean and mean of the final ``metric``
    with stratified-bootstrap confidence intervals (Agarwal et al. 2021), one row per model.

    A task (stratum) is a distinct value of the ``by`` columns of the finished runs, by default each
    (task, dataset). For every model and task the runs of its best configuration (``configs='best'``, the
    one the leaderboard shows: highest mean over seeds) or all its runs (``configs='all'``) are the
    samples. IQM and mean pool the scores of all tasks (a task with more runs weighs more); the interval
    resamples runs within each task independently. ``common=True`` keeps only the tasks every compared
    model has, so the numbers are comparable. Scores of different tasks must share a scale: pass
    ``normalize={'digits': (0.1, 1.0), ...}`` (stratum label -> (low, high), e.g. chance and perfect
    accuracy) to map each task to [0, 1]. A model with fewer than two runs in some task gets no
    interval (NaN) and says so in ``note``. Returns a DataFrame sorted best first."""
    import numpy as np
    import pandas as pd

    by = (by,) if isinstance(by, str) else tuple(by)
    if configs not in ('best', 'all'):
        raise ResultsDBError(f"configs must be 'best' or 'all'; got {configs!r}")
    store = open_db(db)
    higher = not _lower_is_better(metric) if higher_is_better is None else higher_is_better
    df = store.runs(model=model, task=task, dataset=dataset, status='finished')
    unknown = [c for c in by if c not in runs_table.c]
    if unknown:
        raise ResultsDBError(f'unknown column(s) {unknown} to stratify by; known: {", ".join(runs_table.c.keys())}')
    out = pd.DataFrame(columns=AGGREGATE_COLUMNS)
    out.attrs.update(metric=metric, higher_is_better=higher, tasks=[])
    if df.empty or metric not in df.columns:
        known = sorted(c for c in df.columns if '/' in str(c))
        if not df.empty and known:
            raise ResultsDBError(f'no final metric {metric!r} among the finished runs; recorded: {", ".join(known)}')
        return out
    df = df[df[metric].notna()].copy()
    df['_task'] = df[list(by)].astype(str).agg('/'.join, axis=1)
    if normalize:
        missing = sorted(set(df._task) - set(normalize))
        if missing:
            raise ResultsDBError(f'normalize has no (low, high) for task(s) {missing}; tasks: {sorted(set(df._task))}')
        lo = df._task.map(lambda t: float(normalize[t][0]))
        hi = df._task.map(lambda t: float(normalize[t][1]))
        df[metric] = (df[metric] - lo) / (hi - lo)
    if configs == 'best':     # per model and task, the runs of the configuration with the best mean
        means = df.groupby(['model', '_task', 'config_key'], dropna=False)[metric].mean().reset_index()
        best = means.sort_values(metric, ascending=not higher, kind='stable').drop_duplicates(['model', '_task'])
        df = df.merge(best[['model', '_task', 'config_key']], on=['model', '_task', 'config_key'])
    tasks = {m: set(g._task) for m, g in df.groupby('model')}
    shared = set.intersection(*tasks.values()) if common else set().union(*tasks.values())
    if not shared:
        raise ResultsDBError('the models have no task in common: ' + '; '.join(
            f'{m}: {", ".join(sorted(t))}' for m, t in sorted(tasks.items())) + ' (pass common=False to aggregate '
            'each model over its own tasks, or filter with model=/task=/dataset=)')
    rows = []
    for name, g in df[df._task.isin(shared)].groupby('model', sort=False):
        strata = [t[metric].to_numpy(dtype=float) for _, t in g.groupby('_task', sort=True)]
        pooled = np.concatenate(strata)
        counts = [len(x) for x in strata]
        row = dict(model=name, n_tasks=len(strata), n_runs=len(pooled),
                   runs_per_task=str(counts[0]) if min(counts) == max(counts) else f'{min(counts)}-{max(counts)}',
                   note='')
        for stat, fn in AGGREGATE_STATISTICS.items():
            row[stat] = float(fn(pooled))
            row[f'{stat}_low'], row[f'{stat}_high'] = stratified_bootstrap(strata, fn, n_boot, level, seed)
        if min(counts) < 2:
            row['note'] = (f'no interval: {sum(c < 2 for c in counts)} of {len(counts)} task(s) have a single run '
                           '(run more seeds, e.g. zoo fit --seeds 0,1,2)')
        elif len(pooled) < 4:
            row['note'] = 'IQM of fewer than 4 runs trims nothing (it equals the mean)'
        rows.append(row)
    out = pd.DataFrame(rows, columns=AGGREGATE_COLUMNS).sort_values('iqm', ascending=not higher, kind='stable')
    out = out.reset_index(drop=True)
    out.attrs.update(metric=metric, higher_is_better=higher, tasks=sorted(shared), level=level)
    return out


def format_aggregate(agg, fmt: str = 'table') -> str:
    """The ``aggregate`` table as text: 'table' (rich), 'markdown', 'csv' or 'json'."""
    if fmt == 'csv':
        return agg.to_csv(index=False)
    if fmt == 'json':
        return agg.to_json(orient='records', indent=2)
    if fmt not in ('table', 'markdown'):
        raise ResultsDBError(f'unknown format {fmt!r}; expected table, csv, json or markdown')
    if agg.empty:
        return '(no finished runs with this metric)'

    def ci(lo, hi):
        return '' if lo != lo else f'[{lo:.4f}, {hi:.4f}]'

    pct = f"{round(100 * agg.attrs.get('level', 0.95))}%"
    rows = [{'model': r.model, 'tasks': r.n_tasks, 'runs': r.n_runs, 'runs/task': r.runs_per_task,
             'IQM': f'{r.iqm:.4f}', f'IQM {pct} CI': ci(r.iqm_low, r.iqm_high), 'mean': f'{r.mean:.4f}',
             f'mean {pct} CI': ci(r.mean_low, r.mean_high), 'note': r.note} for r in agg.itertuples()]
    import pandas as pd
    if fmt == 'markdown':
        return pd.DataFrame(rows).to_markdown(index=False)
    tasks = agg.attrs.get('tasks') or []
    return _rich_table(f"{agg.attrs.get('metric')} over {len(tasks)} task(s): {', '.join(tasks)} "
                       f'(stratified bootstrap, Agarwal et al. 2021)', rows, left=('model', 'note'))


def _lower_is_better(metric: str) -> bool:
    leaf = metric.rsplit('/', 1)[-1].lower()
    return any(s in leaf for s in ('loss', 'err', 'ppl', 'perplexity', 'mse', 'mae', 'latency', 'bpb', 'nll'))


LEADERBOARD_COLUMNS = ['model', 'family', 'block_choices', 'n_seeds', 'mean', 'ci_low', 'ci_high', 'iqm', 'std',
                       'best', 'params', 'macs', 'latency_ms', 'latency_batch', 'arch_fingerprint', 'aliases',
                       'config_key', 'run_ids']


def leaderboard(task: str | None = None, dataset: str | None = None, metric: str = 'val/acc1', *, db=None,
                model: str | None = None, higher_is_better: bool | None = None, n_boot: int = 2000):
    """Best configuration per model on (task, dataset) by the final ``metric`` of finished runs.

    Runs of one configuration (same model, hyper-parameters, blocks and epoch budget; different seeds)
    are pooled: ``mean``, a 95 % percentile-bootstrap ``ci_low``/``ci_high`` over seeds (NaN with one
    seed), ``iqm``, ``std``. Latency is the median at batch 1 measured for the run, else for the same
    architecture fingerprint, else for the model name (the fastest such measurement on record)."""
    import numpy as np
    import pandas as pd

    store = open_db(db)
    higher = not _lower_is_better(metric) if higher_is_better is None else higher_is_better
    df = store.runs(model=model, task=task, dataset=dataset, status='finished')
    if df.empty or metric not in df.columns:
        known = sorted(c for c in df.columns if '/' in str(c))
        if not df.empty and known:
            raise ResultsDBError(f'no final metric {metric!r} among the finished runs; recorded: {", ".join(known)}')
        return pd.DataFrame(columns=LEADERBOARD_COLUMNS)
    df = df[df[metric].notna()]
    lat = store.latency()
    lat1 = lat[lat.batch_size == 1] if not lat.empty else lat
    rows = []
    for (name, key), g in df.groupby(['model', 'config_key'], dropna=False, sort=False):
        vals = g[metric].to_numpy(dtype=float)
        lo, hi = bootstrap_ci(vals, n_boot=n_boot)
        fp = g.arch_fingerprint.dropna().iloc[0] if g.arch_fingerprint.notna().any() else None
        rows.append(dict(
            model=name, family=g.family.iloc[0], block_choices=_fmt_choices(g.block_choices.iloc[0]),
            n_seeds=int(g.seed.nunique(dropna=False)), mean=float(vals.mean()), ci_low=lo, ci_high=hi,
            iqm=iqm(vals), std=float(vals.std(ddof=1)) if len(vals) > 1 else float('nan'),
            best=float(vals.max() if higher else vals.min()),
            params=_first(g.params), macs=_first(g.macs),
            **_latency_for(lat1, g.id.tolist(), fp, name),
            arch_fingerprint=fp, aliases=', '.join(a for a in store.aliases(fp) if a != name) if fp else '',
            config_key=key, run_ids=','.join(map(str, g.id.tolist()))))
    board = pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS)
    board = board.sort_values('mean', ascending=not higher, kind='stable')
    board = board.drop_duplicates('model', keep='first').reset_index(drop=True)
    board.attrs.update(metric=metric, higher_is_better=higher, task=task, dataset=dataset)
    board[['params', 'macs']] = board[['params', 'macs']].astype('Float64')
    return board.replace({np.nan: None}).astype({'mean': float})


def _first(s):
    s = s.dropna()
    return int(s.iloc[0]) if len(s) else None


def _fmt_choices(c) -> str:
    if isinstance(c, str):
        with contextlib.suppress(ValueError):
            c = json.loads(c)
    if not c:
        return ''
    return ', '.join(f'{k}={v}' for k, v in c.items()) if isinstance(c, dict) else str(c)


def _latency_for(lat, run_ids: list[int], fp: str | None, model: str) -> dict:
    if lat.empty:
        return dict(latency_ms=None, latency_batch=None)
    for sel in (lat.run_id.isin(run_ids), (lat.arch_fingerprint == fp) if fp else None, lat.model == model):
        if sel is not None and sel.any():
            return dict(latency_ms=float(lat[sel].median_ms.min()), latency_batch=1)
    return dict(latency_ms=None, latency_batch=None)


# ---------------------------------------------------------------------------------------------------- tables
def format_board(board, fmt: str = 'table') -> str:
    """The leaderboard as text: 'table' (rich), 'markdown', 'csv' or 'json'."""
    if fmt == 'csv':
        return board.to_csv(index=False)
    if fmt == 'json':
        return board.to_json(orient='records', indent=2)
    rows = _display_rows(board)
    if fmt == 'markdown':
        import pandas as pd
        return pd.DataFrame(rows).to_markdown(index=False) if rows else '(no finished runs)'
    if fmt != 'table':
        raise ResultsDBError(f'unknown format {fmt!r}; expected table, csv, json or markdown')
    metric = board.attrs.get('metric', 'metric')
    title = f"leaderboard: {metric} ({'higher' if board.attrs.get('higher_is_better', True) else 'lower'} is better)"
    return _rich_table(title, rows, left=('model', 'blocks', 'aliases'))


def _rich_table(title: str, rows: list[dict], left: tuple[str, ...]) -> str:
    """Rows (dicts with the same keys) as a rich table rendered to text; ``left`` columns left-aligned."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    cols = list(rows[0]) if rows else ['model']
    for c in cols:
        table.add_column(c, justify='left' if c in left else 'right')
    for r in rows:
        table.add_row(*[str(r[c]) for c in cols])
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=False).print(table)
    return buf.getvalue()


def _display_rows(board) -> list[dict]:
    def num(v, f):
        return '' if v is None or v != v else f.format(v)
    metric = board.attrs.get('metric', 'metric')
    rows = []
    for r in board.itertuples():
        ci = f'[{num(r.ci_low, "{:.4f}")}, {num(r.ci_high, "{:.4f}")}]' if r.ci_low is not None and r.ci_low == r.ci_low else ''
        rows.append({'model': r.model, 'blocks': r.block_choices, 'seeds': r.n_seeds, metric: num(r.mean, '{:.4f}'),
                     '95% CI': ci, 'params (M)': num(None if r.params is None else r.params / 1e6, '{:.3f}'),
                     'MACs (M)': num(None if r.macs is None else r.macs / 1e6, '{:.1f}'),
                     'latency ms (bs 1)': num(r.latency_ms, '{:.2f}'), 'aliases': r.aliases})
    return rows


# ------------------------------------------------------------------------------------------------------ plots
def pareto_front(latency_ms, score, higher_is_better: bool = True) -> list[int]:
    """Indices of the non-dominated points (lower latency, better score), in order of latency."""
    pts = sorted((lat, -s if higher_is_better else s, i) for i, (lat, s) in enumerate(zip(latency_ms, score))
                 if lat is not None and s is not None and lat == lat and s == s)
    front, best = [], float('inf')
    for lat, s, i in pts:
        if s < best:
            front.append(i)
            best = s
    return front


def plot_pareto(board, path: str | os.PathLike | None = None, *, title: str | None = None):
    """Accuracy (or any metric) against batch-1 latency, one point per model with its 95 % CI, the Pareto
    front drawn as a step line. Saves to ``path`` when given; returns the matplotlib Figure."""
    import matplotlib
    if path is not None:
        matplotlib.use('Agg', force=False)
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    metric = board.attrs.get('metric', 'metric')
    higher = board.attrs.get('higher_is_better', True)
    b = board[board.latency_ms.notna()].reset_index(drop=True)
    fig = Figure(figsize=(7, 4.5)) if path is not None else plt.figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    if b.empty:
        ax.text(0.5, 0.5, 'no model has both a result and a latency', ha='center', va='center', transform=ax.transAxes)
    else:
        lat, mean = b.latency_ms.astype(float).to_numpy(), b['mean'].astype(float).to_numpy()
        lo = b.ci_low.astype(float).to_numpy()
        hi = b.ci_high.astype(float).to_numpy()
        import numpy as np
        yerr = np.vstack([np.where(np.isnan(lo), 0, mean - lo), np.where(np.isnan(hi), 0, hi - mean)])
        front = pareto_front(lat, mean, higher)
        on = np.zeros(len(b), bool)
        on[front] = True
        ax.errorbar(lat[~on], mean[~on], yerr=yerr[:, ~on], fmt='o', color='0.55', capsize=3, label='dominated')
        ax.errorbar(lat[on], mean[on], yerr=yerr[:, on], fmt='o', color='C3', capsize=3, label='Pareto front')
        ax.step(lat[front], mean[front], where='post', color='C3', alpha=0.6)
        for x, y, name in zip(lat, mean, b.model):
            ax.annotate(name, (x, y), textcoords='offset points', xytext=(4, 4), fontsize=8)
        ax.legend(loc='lower right' if higher else 'upper right')
    ax.set_xlabel('latency, batch 1 (ms, median)')
    ax.set_ylabel(f'{metric} (mean over seeds, 95 % CI)')
    parts = [board.attrs.get('task'), board.attrs.get('dataset')]
    ax.set_title(title or ' / '.join(p for p in parts if p) or 'accuracy vs latency')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=150)
    return fig
