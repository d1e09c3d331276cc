"""The results database: every run, its metrics, and every latency measurement, in one store.

A package by job: ``schema`` (tables, migrations), ``store`` (``ResultsDB``, crash detection, heartbeat),
``env`` (config key, git commit, environment), ``stats`` (bootstrap, IQM), ``board`` (leaderboard,
aggregate), ``render`` (tables, Pareto plot), ``data`` (every run as one DataFrame row: ``data()``). This module keeps the flat API: ``from zoo.eval import results``.

LEMUR-style (ABrain-One/nn-dataset keeps per-model accuracy and latency in SQLite), with the points
LEMUR misses done differently:

- failed, pruned and crashed runs are kept with their status (LEMUR drops sub-threshold trials);
- latency is keyed by model, architecture fingerprint, input shape, batch, device, threads, dtype,
  layout, runtime (eager, compile, onnxruntime, openvino) and the CPU model with its ISA flags and library
  versions (LEMUR keys it by model name), and a comparison never mixes CPUs;
- Optuna studies live in the same database (its own tables beside ours), so sweeps resume;
- every run records its seed, and comparisons report an interval over seeds (Student-t from 3 seeds on;
  fewer get the values and no interval);
- every latency records how it was taken (source, warm-up, repeats, load average, threads), and the
  leaderboard uses the most trusted record (``pick_latency``);
- a schema version with a migration list, and an architecture fingerprint that recognises two
  names for the same network.

The store is any SQLAlchemy URL; the default is one SQLite file, ``$ZOO_DB`` or ``./zoo-results.db``
(``ZOO_DB=none`` disables recording). Our tables are prefixed ``zoo_`` and the schema version lives in
``zoo_schema`` (Optuna uses ``alembic_version`` and ``version_info`` in the same database, so we keep
out of both). Migrations are a short ordered list of functions that use Alembic's ``Operations``
(which handles SQLite's limited ``ALTER TABLE``).

>>> from zoo.eval import results
>>> results.runs(status='finished')                       # a pandas DataFrame
>>> results.data(task='classification', only_best=True)  # one row per run: metrics, stats, latency per runtime
>>> results.leaderboard('classification', 'digits', 'val/acc1')
>>> results.plot_pareto(results.leaderboard(...), 'pareto.png')
"""
from __future__ import annotations

from ..profile import fingerprint
from .schema import (SCHEMA_VERSION, DEFAULT_PATH, STATUSES, DISABLED, HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S,
                     STALE_BEATS, STALE_MIN, STALE_AFTER, ResultsDBError, metadata, schema_table, runs_table,
                     metrics_table, latency_table, latency_failures_table, architectures_table, MIGRATIONS,
                     LATENCY_RUNTIMES, UNKNOWN_CPU)
from .env import config_key, git_commit, environment
from .store import resolve_url, ResultsDB, Heartbeat, open_db, close_all, runs, metrics, latency, jsonable, utcnow
from .stats import AGGREGATE_STATISTICS, bootstrap_ci, iqm, stratified_bootstrap, t_interval
from .board import (AGGREGATE_COLUMNS, aggregate, HIGHER_IS_BETTER, LOWER_IS_BETTER, is_higher_better,
                    LEADERBOARD_COLUMNS, MIN_SEEDS_FOR_INTERVAL, SOURCE_RANK, board_tasks, latency_cpus, leaderboard,
                    leaderboards, pick_latency)
from .render import format_aggregate, format_board, pareto_front, plot_pareto
from .data import DATA_COLUMNS, data

__all__ = ['fingerprint', 'SCHEMA_VERSION', 'DEFAULT_PATH', 'STATUSES', 'DISABLED', 'HEARTBEAT_ENV',
           'DEFAULT_HEARTBEAT_S', 'STALE_BEATS', 'STALE_MIN', 'STALE_AFTER', 'ResultsDBError', 'metadata',
           'schema_table', 'runs_table', 'metrics_table', 'latency_table', 'latency_failures_table',
           'architectures_table', 'MIGRATIONS',
           'LATENCY_RUNTIMES', 'UNKNOWN_CPU', 'latency_cpus',
           'config_key', 'git_commit', 'environment', 'resolve_url', 'ResultsDB', 'Heartbeat', 'open_db', 'close_all',
           'runs', 'metrics', 'latency', 'jsonable', 'utcnow', 'bootstrap_ci', 'iqm', 'AGGREGATE_STATISTICS',
           'stratified_bootstrap', 't_interval', 'AGGREGATE_COLUMNS', 'aggregate', 'HIGHER_IS_BETTER',
           'LOWER_IS_BETTER', 'is_higher_better', 'LEADERBOARD_COLUMNS', 'MIN_SEEDS_FOR_INTERVAL', 'SOURCE_RANK',
           'board_tasks', 'leaderboard', 'leaderboards', 'pick_latency', 'format_aggregate', 'format_board',
           'pareto_front', 'plot_pareto', 'DATA_COLUMNS', 'data']
