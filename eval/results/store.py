"""The store: ``ResultsDB`` (runs, metrics, latency), crash detection with its heartbeat thread, and the
module-level ``open_db``/``runs``/``metrics``/``latency``."""
from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import fnmatch
import json
import os
import socket
import threading
from pathlib import Path
from typing import Iterable

import sqlalchemy as sa
from sqlalchemy import event, exc as sa_exc

from .env import config_key
from .schema import (DEFAULT_HEARTBEAT_S, DEFAULT_PATH, DISABLED, HEARTBEAT_ENV, LATENCY_RUNTIMES, MIGRATIONS,
                     SCHEMA_VERSION, STALE_AFTER, STALE_BEATS, STALE_MIN, STATUSES, ResultsDBError, _PG_MIGRATION_LOCK,
                     architectures_table, latency_failures_table, latency_table, metrics_table, runs_table,
                     schema_table)

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


def utcnow() -> _dt.datetime:
    """The time the store writes (``started_at``, ``heartbeat_at``, ``measured_at``, ...): now in UTC, naive."""
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux): state first, start time at 19."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux), to tell a live run from a recycled pid."""
    stat = _proc_stat(pid)
    return stat[19] if stat and len(stat) > 19 else None


def _pid_alive(pid: int, proc_start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                                    # exists, owned by someone else
    stat = _proc_stat(pid)
    if stat and stat[0] in ('Z', 'X'):         # killed, not yet reaped (an orphan waits for an init that may never reap it)
        return False
    return proc_start is None or stat is None or stat[19] == proc_start


class ResultsDB:
    """One results store. Writes are transactions; opening it marks runs whose process died ``crashed``."""

    def __init__(self, url: str | None = None, *, check_crashed: bool = True, create: bool = True):
        """``create=False`` (readers such as ``zoo results``): a SQLite file that does not exist is an error and
        nothing is created; writers (``zoo fit``, ``zoo bench --db``) create it."""
        url = resolve_url(url)
        if url is None:
            raise ResultsDBError('the results database is disabled (ZOO_DB=none); pass a path or URL')
        self.url = url
        self._sqlite = url.startswith('sqlite')
        self._path = None
        if self._sqlite:
            path = sa.engine.make_url(url).database
            if path and path != ':memory:':
                self._path = path
                if Path(path).is_dir():
                    raise ResultsDBError(f'results database path {path} is a directory; expected a SQLite file')
                if not create and not Path(path).exists():
                    raise ResultsDBError(f'no results database at {path} (nothing was created); record runs there '
                                         'with zoo fit/zoo bench --db, or point --db/ZOO_DB at an existing file')
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        kw = {'connect_args': {'timeout': 120}} if self._sqlite else {'pool_pre_ping': True}
        try:
            self.engine = sa.create_engine(url, **kw)
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as e:
            raise ResultsDBError(f'cannot use results database URL {url!r}: {e}') from e
        if self._sqlite:
            self._sqlite_events(wal=create)
        try:
            self._migrate()
            if check_crashed:
                self.mark_crashed()
        except ResultsDBError:
            self.engine.dispose()
            raise
        except sa_exc.DatabaseError as e:
            self.engine.dispose()
            raise ResultsDBError(f'cannot open results database {self.safe_url()}: {getattr(e, "orig", e)}') from e

    def _damaged(self, e: sa_exc.DatabaseError) -> ResultsDBError | None:
        """The one-line error for a SQLite file that is not a database or has damaged pages (which may show
        only when a query reaches them), or None for any other database error."""
        orig = str(getattr(e, 'orig', e))
        if not self._sqlite or not any(m in orig for m in ('not a database', 'malformed', 'disk image')):
            return None
        return ResultsDBError(f'{self._path} is not a SQLite database (or it is corrupt); it was left untouched '
                              f'(SQLite: {orig}). Point ZOO_DB/--db at another file; `sqlite3 FILE .recover` may '
                              'save its rows.')

    def safe_url(self) -> str:
        """The URL with its password hidden, for messages and logs."""
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

    def _sqlite_events(self, wal: bool = True) -> None:
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
            # Readers (create=False) leave the journal mode as it is: switching rewrites the file header, and
            # a reader must not change a file it may be about to find damaged.
            if wal and cur.execute('PRAGMA journal_mode').fetchone()[0].lower() != 'wal':
                cur.execute('PRAGMA journal_mode=WAL')
            cur.execute('PRAGMA synchronous=NORMAL')
            cur.close()

        @event.listens_for(self.engine, 'begin')
        def _begin(conn):
            conn.exec_driver_sql('BEGIN IMMEDIATE' if conn.get_execution_options().get('write') else 'BEGIN')

    @contextlib.contextmanager
    def _damage_as_one_line(self):
        """A damaged file's DatabaseError becomes the store's one-line error; others pass unchanged."""
        try:
            yield
        except sa_exc.DatabaseError as e:
            err = self._damaged(e)
            if err is None:
                raise
            raise err from e

    @contextlib.contextmanager
    def write(self):
        """A write transaction (committed on exit, rolled back on error)."""
        with self._damage_as_one_line(), self.engine.connect().execution_options(write=True) as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def read(self):
        with self._damage_as_one_line(), self.engine.connect() as conn:
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
                    f'results database {self.safe_url()} has schema version {version}, newer than this zoo '
                    f'(version {SCHEMA_VERSION}); upgrade zoo to use it. Nothing was changed.')
            if version == SCHEMA_VERSION:
                return
            if not has:
                schema_table.create(conn)
            op = Operations(MigrationContext.configure(conn))
            for migration in MIGRATIONS[version:]:
                migration(op)
            if has:
                conn.execute(schema_table.update().values(version=SCHEMA_VERSION, updated_at=utcnow()))
            else:
                conn.execute(schema_table.insert().values(id=1, version=SCHEMA_VERSION, updated_at=utcnow()))

    @contextlib.contextmanager
    def lock(self, name: str, key: int | None = None):
        """An exclusive lock shared by every process on this database (sweep workers, benchmark workers): a file
        lock (``filelock``) beside a SQLite file, a session advisory lock on PostgreSQL (``key``, default a
        hash of ``name``). An in-memory SQLite database or another server gets no lock (one process only)."""
        if self._sqlite:
            if not self._path:
                yield
                return
            from filelock import FileLock

            with FileLock(f'{self._path}.{name}'):
                yield
            return
        if self.engine.dialect.name != 'postgresql':
            yield
            return
        import zlib

        key = zlib.crc32(name.encode()) if key is None else int(key)
        with self.engine.connect() as conn:
            conn.execute(sa.text('SELECT pg_advisory_lock(:k)'), {'k': key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(sa.text('SELECT pg_advisory_unlock(:k)'), {'k': key})
                conn.commit()

    # --- runs
    def start_run(self, model: str, **fields) -> int:
        """Insert a ``running`` run (host and pid recorded for crash detection); returns its id."""
        unknown = set(fields) - set(runs_table.c.keys())
        if unknown:
            raise ResultsDBError(f'unknown run field(s) {sorted(unknown)}; known: {sorted(runs_table.c.keys())}')
        now = utcnow()
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

    def claim_run(self, run_id: int, **fields) -> None:
        """Take over a ``running`` row another process wrote for this one (``zoo benchmark run`` writes the row
        of a job before it starts the ``zoo fit`` that trains it): ``fields`` plus this process's host and pid,
        so crash detection follows the process that trains."""
        self.update_run(run_id, **fields, host=socket.gethostname(), pid=os.getpid(),
                        proc_start=_proc_start(os.getpid()), heartbeat_at=utcnow(), status='running', error=None)

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
            conn.execute(runs_table.update().where(runs_table.c.id == run_id).values(heartbeat_at=utcnow()))

    def finish_run(self, run_id: int, status: str = 'finished', error: str | None = None) -> None:
        if status not in STATUSES:
            raise ResultsDBError(f'unknown status {status!r}; expected one of {STATUSES}')
        now = utcnow()
        with self.write() as conn:
            started = conn.execute(sa.select(runs_table.c.started_at).where(runs_table.c.id == run_id)).scalar()
            if started is None:
                raise ResultsDBError(f'no run with id {run_id} in {self.safe_url()}')
            conn.execute(runs_table.update().where(runs_table.c.id == run_id).values(
                status=status, error=error, ended_at=now, heartbeat_at=now,
                wall_s=(now - started).total_seconds()))

    def delete_run(self, run_id: int) -> None:
        """Remove a run and its metrics: only for a command rejected as bad input before it trained (``zoo fit``
        promises such a command leaves nothing behind); every run that trained keeps its row, failed or not."""
        with self.write() as conn:
            conn.execute(metrics_table.delete().where(metrics_table.c.run_id == run_id))
            conn.execute(latency_table.update().where(latency_table.c.run_id == run_id).values(run_id=None))
            conn.execute(runs_table.delete().where(runs_table.c.id == run_id))

    def heartbeat(self, run_id: int) -> bool:
        """Refresh a running run's ``heartbeat_at``; False once the run is no longer ``running``."""
        with self.write() as conn:
            return conn.execute(runs_table.update().where(runs_table.c.id == run_id, runs_table.c.status == 'running')
                                .values(heartbeat_at=utcnow())).rowcount > 0

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
        self.update_run(run_id, heartbeat_s=float(interval_s), heartbeat_at=utcnow())
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
        host, now = socket.gethostname(), utcnow()
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
        throughput, repeats, params, macs, arch_fingerprint, run_id, runtime, compile_mode, cpu_model, isa,
        versions, max_abs_delta. Unset, the runtime is 'eager' ('compile' when ``compiled``), the dtype float32,
        the CPU, its ISA flags and the library versions are this machine's (``profile.machine()``,
        ``versions()``), and ``max_abs_delta`` is 0.0 for eager float32 (the output every runtime is compared
        with) and NULL otherwise (not compared)."""
        unknown = set(fields) - set(latency_table.c.keys())
        if unknown:
            raise ResultsDBError(f'unknown latency field(s) {sorted(unknown)}; known: {sorted(latency_table.c.keys())}')
        input_shape = _shape_text(input_shape)
        runtime = _checked_runtime(fields.get('runtime') or ('compile' if fields.get('compiled') else 'eager'))
        import torch

        from ..profile import machine, versions
        row = dict(model=model, median_ms=float(median_ms), input_shape=input_shape, batch_size=int(batch_size),
                   device=device, torch_version=torch.__version__, host=socket.gethostname(), measured_at=utcnow(),
                   dtype='float32', **machine(), versions=versions())
        row.update({k: v for k, v in fields.items() if v is not None})
        row.update(runtime=runtime, compiled=runtime == 'compile')
        if runtime == 'eager' and row['dtype'] == 'float32':
            row.setdefault('max_abs_delta', 0.0)
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

    def add_latency_failure(self, model: str, error: str, *, input_shape, batch_size: int, runtime: str,
                            arch_fingerprint: str | None = None, dtype: str = 'float32') -> int:
        """A latency that could not be taken: ``runtime`` failed on the network at ``batch_size`` with ``error``
        (this machine's CPU and library versions are recorded beside it)."""
        from ..profile import machine, versions
        row = dict(model=model, error=str(error), input_shape=_shape_text(input_shape), batch_size=int(batch_size),
                   runtime=_checked_runtime(runtime), arch_fingerprint=arch_fingerprint, dtype=dtype,
                   cpu_model=machine()['cpu_model'], versions=versions(), host=socket.gethostname(),
                   failed_at=utcnow())
        with self.write() as conn:
            return conn.execute(latency_failures_table.insert().values(**row)).inserted_primary_key[0]

    def latency_failures(self, *, model: str | None = None, **filters):
        """The failed latency measurements as a DataFrame (``model`` is a glob pattern; other keywords filter by
        equality), oldest first."""
        import pandas as pd

        t = latency_failures_table
        with self.read() as conn:
            q = _filter(sa.select(t), t, _expand_glob(conn, t, model), filters)
            return pd.read_sql(q.order_by(t.c.id), conn)

    def _add_architecture(self, conn, fingerprint: str, model: str, params: int | None) -> None:
        seen = conn.execute(sa.select(architectures_table.c.model).where(
            architectures_table.c.fingerprint == fingerprint, architectures_table.c.model == model)).first()
        if seen is None:
            conn.execute(architectures_table.insert().values(fingerprint=fingerprint, model=model, params=params,
                                                             first_seen=utcnow()))

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

    def check_filters(self, *, task: str | None = None, dataset: str | None = None, model: str | None = None) -> None:
        """A filter value that matches no run (of any status), ``task='segmentaton'``, ``dataset='shapes_sge'``, a
        ``model`` glob no name fits, is an error naming the closest recorded values: a typo must not read as
        "no results". Each value is checked among the runs the filters before it keep (task, then dataset, then
        model), so ``task='detection', dataset='digits'`` names detection's datasets."""
        given = {k: v for k, v in (('task', task), ('dataset', dataset), ('model', model)) if v is not None}
        if not given or self._values('id', given, limit=1):
            return
        kept: dict = {}
        for key, value in given.items():
            recorded = sorted(map(str, self._values(key, kept)))
            within = f" among the runs of {', '.join(f'{k} {v!r}' for k, v in kept.items())}" if kept else ''
            kept[key] = value
            if not self._values('id', kept, limit=1):
                plain = str(value).strip('*?') if key == 'model' else str(value)
                close = difflib.get_close_matches(plain, recorded, n=3, cutoff=0.6)
                shown = ', '.join(recorded[:12]) + (f' (+{len(recorded) - 12} more)' if len(recorded) > 12 else '')
                raise ResultsDBError(f'no run has {key} {value!r}{within}'
                                     + (f"; did you mean {' or '.join(close)}?" if close else '')
                                     + f' (recorded: {shown or "none"})')

    def _values(self, column: str, filters: dict, limit: int | None = None) -> list:
        """The distinct non-null values of a runs column among the runs ``filters`` keep (``model``: a glob)."""
        filters = dict(filters)
        with self.read() as conn:
            model = _expand_glob(conn, runs_table, filters.pop('model', None))
            q = _filter(sa.select(runs_table.c[column]).distinct(), runs_table, model, filters)
            q = q.where(runs_table.c[column].is_not(None)).limit(limit)
            return list(conn.execute(q).scalars())

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

    def close(self) -> None:
        self.engine.dispose()


def _jsonable_row(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        col = runs_table.c.get(k)
        out[k] = jsonable(v) if col is not None and isinstance(col.type, sa.JSON) else v
    return out


def jsonable(v):
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


def _shape_text(input_shape) -> str:
    """One sample's shape as stored: '3x224x224'."""
    return input_shape if isinstance(input_shape, str) else 'x'.join(str(int(s)) for s in input_shape)


def _checked_runtime(runtime: str) -> str:
    if runtime not in LATENCY_RUNTIMES:
        raise ResultsDBError(f'unknown runtime {runtime!r}; expected one of {", ".join(LATENCY_RUNTIMES)}')
    return runtime


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


def open_db(db: str | os.PathLike | ResultsDB | None = None, *, create: bool = True) -> ResultsDB:
    """The store for ``db`` (a path, a URL, None for ``$ZOO_DB``), opened once per process and URL.
    ``create=False``: a SQLite file that does not exist is an error (readers must not leave empty files)."""
    if isinstance(db, ResultsDB):
        return db
    url = resolve_url(db)
    if url is None:
        raise ResultsDBError('the results database is disabled (ZOO_DB=none); pass --db PATH or set ZOO_DB')
    with _LOCK:
        if url not in _DBS:
            _DBS[url] = ResultsDB(url, create=create)
        return _DBS[url]


def close_all() -> None:
    """Close every store ``open_db`` has opened in this process and forget them (the next ``open_db`` opens
    afresh): after a database file was replaced or deleted, or between tests."""
    with _LOCK:
        for store in _DBS.values():
            store.close()
        _DBS.clear()


def runs(*, db=None, **kw):
    """Runs as a pandas DataFrame (see ``ResultsDB.runs``)."""
    return open_db(db).runs(**kw)


def metrics(run_id: int | None = None, *, db=None, **kw):
    return open_db(db).metrics(run_id, **kw)


def latency(*, db=None, **kw):
    """Latency rows as a pandas DataFrame (see ``ResultsDB.latency``)."""
    return open_db(db).latency(**kw)
