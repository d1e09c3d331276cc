"""Schema of the results database: constants, the typed tables and the migrations between versions."""
from __future__ import annotations

import datetime as _dt

import sqlalchemy as sa

SCHEMA_VERSION = 8
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
    # v5
    sa.Column('runtime', sa.String(20)),                      # what ran the network: eager | compile | onnxruntime ...
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
    # v4: how and in what conditions the number was taken (rows written before v4 leave them NULL)
    sa.Column('source', sa.String(20)),                       # bench (zoo bench) | fit (after training) | api
    sa.Column('warmup', sa.Integer),                          # warm-up calls before the timed rounds
    sa.Column('load_1m', sa.Float),                           # 1-minute load average before the measurement
    sa.Column('load_1m_after', sa.Float),                     # ... and after it (includes the measuring process)
    sa.Column('cpus', sa.Integer),                            # os.cpu_count() of the host
    sa.Column('duration_s', sa.Float),                        # wall time of the timed rounds
    # v5: what ran the network and on which machine (rows before v5: runtime 'eager' ('compile' when
    # ``compiled``), dtype 'float32' when unset, cpu_model 'unknown')
    sa.Column('runtime', sa.String(20), index=True),          # eager | compile | onnxruntime | openvino | *-int8
    sa.Column('compile_mode', sa.String(40)),                 # torch.compile mode and options ('default+freezing')
    sa.Column('cpu_model', sa.String(200), index=True),       # /proc/cpuinfo 'model name' (profile.machine())
    sa.Column('isa', sa.JSON),                                # ISA flags of that CPU: ['avx2', 'avx512f', ...]
    sa.Column('versions', sa.JSON),                           # {'torch': ..., 'onnxruntime': ..., 'zoo': ...}
    # v7: how far this runtime's output is from eager float32's on the timed input (eager float32: 0.0; rows
    # before v7, and outputs that cannot be compared such as detections after NMS: NULL)
    sa.Column('max_abs_delta', sa.Float),
    # v8: a GPU's figures (``device`` 'cuda'): which GPU, driver and clocks (nvidia-smi; NULL where it is not
    # installed), and the peak memory one call allocates (torch.cuda.max_memory_allocated); NULL on the CPU
    sa.Column('gpu_name', sa.String(200), index=True),       # torch.cuda.get_device_name
    sa.Column('gpu_driver', sa.String(50)),
    sa.Column('gpu_clocks', sa.JSON),                         # {'sm_mhz', 'max_sm_mhz', 'mem_mhz'} when timed
    sa.Column('peak_mem_mb', sa.Float),
)

# The columns of zoo_latency that version 4 added, in order.
LATENCY_V4 = ('source', 'warmup', 'load_1m', 'load_1m_after', 'cpus', 'duration_s')
# ... and version 5.
LATENCY_V5 = ('runtime', 'compile_mode', 'cpu_model', 'isa', 'versions')
# ... and version 7.
LATENCY_V7 = ('max_abs_delta',)
# ... and version 8.
LATENCY_V8 = ('gpu_name', 'gpu_driver', 'gpu_clocks', 'peak_mem_mb')
# The runtimes a latency row may name (the same names as ``zoo.RUNTIMES``; the store must not import torch).
LATENCY_RUNTIMES = ('eager', 'compile', 'onnxruntime', 'openvino', 'onnxruntime-int8', 'openvino-int8', 'auto')
UNKNOWN_CPU = 'unknown'

latency_failures_table = sa.Table(                           # v6: a latency measurement that could not be taken
    'zoo_latency_failures', metadata,
    sa.Column('id', sa.Integer, primary_key=True),
    sa.Column('model', sa.String(200), nullable=False, index=True),
    sa.Column('arch_fingerprint', sa.String(16), index=True),
    sa.Column('input_shape', sa.String(50), nullable=False),  # one sample, as zoo_latency's
    sa.Column('batch_size', sa.Integer, nullable=False),
    sa.Column('runtime', sa.String(20), nullable=False),      # the runtime that failed (LATENCY_RUNTIMES)
    sa.Column('dtype', sa.String(20)),
    sa.Column('error', sa.Text, nullable=False),              # 'ExceptionType: first line of its message'
    sa.Column('cpu_model', sa.String(200)),
    sa.Column('versions', sa.JSON),
    sa.Column('host', sa.String(200)),
    sa.Column('failed_at', sa.DateTime, nullable=False),
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
    later = {'zoo_runs': {'arch_fingerprint', 'params', 'macs', 'study_name', 'trial_number', 'heartbeat_s', 'runtime'},
             'zoo_latency': {'arch_fingerprint', *LATENCY_V4, *LATENCY_V5, *LATENCY_V7, *LATENCY_V8}, 'zoo_metrics': set()}
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


def _v4(op) -> None:
    """Version 4: the conditions of a latency measurement (source, warm-up, load average, CPUs, duration), so
    the leaderboard can prefer the most trustworthy record (see ``board.pick_latency``)."""
    for name in LATENCY_V4:
        op.add_column('zoo_latency', _col(latency_table, name))


def _v5(op) -> None:
    """Version 5: latency keyed by runtime and machine (runtime, compile mode, CPU model, ISA flags, library
    versions), and the runtime of a run (a test in ONNX Runtime beside the eager one). Older rows were all
    measured in eager PyTorch (or ``torch.compile`` where ``compiled`` says so),
    in float32 unless they said otherwise, on a CPU nobody recorded."""
    for name in LATENCY_V5:
        op.add_column('zoo_latency', _col(latency_table, name))
    op.add_column('zoo_runs', _col(runs_table, 'runtime'))
    op.execute(sa.table('zoo_runs', sa.column('runtime')).update().values(runtime='eager'))
    for col in ('runtime', 'cpu_model'):
        op.create_index(f'ix_zoo_latency_{col}', 'zoo_latency', [col])
    t = sa.table('zoo_latency', sa.column('runtime'), sa.column('compiled'), sa.column('dtype'), sa.column('cpu_model'))
    op.execute(t.update().values(runtime=sa.case((t.c.compiled == sa.true(), 'compile'), else_='eager'))
               .where(t.c.runtime.is_(None)))
    op.execute(t.update().values(dtype='float32').where(t.c.dtype.is_(None)))
    op.execute(t.update().values(cpu_model=UNKNOWN_CPU).where(t.c.cpu_model.is_(None)))


def _v6(op) -> None:
    """Version 6: latency measurements that failed (a runtime that cannot compile or export a network, with its
    error), so a benchmark reports them and does not try them again at every invocation."""
    t = latency_failures_table
    op.create_table(t.name, *[_col(t, c.name) for c in t.columns])
    for col in ('model', 'arch_fingerprint'):
        op.create_index(f'ix_{t.name}_{col}', t.name, [col])


def _v7(op) -> None:
    """Version 7: each latency row's largest output difference from eager float32 on the timed input
    (``max_abs_delta``), so a fast runtime that computes something else is visible beside its time (issue 43).
    Older rows leave it NULL: nobody compared them."""
    for name in LATENCY_V7:
        op.add_column('zoo_latency', _col(latency_table, name))


def _v8(op) -> None:
    """Version 8: latency on a GPU (``device`` 'cuda'): the GPU's name, driver and clocks, and the peak memory of
    one call, so a GPU figure says what it was taken on as a CPU figure does (``cpu_model``), and the leaderboard
    keeps GPUs apart. CPU rows, old and new, leave them NULL."""
    for name in LATENCY_V8:
        op.add_column('zoo_latency', _col(latency_table, name))
    op.create_index('ix_zoo_latency_gpu_name', 'zoo_latency', ['gpu_name'])


MIGRATIONS = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8]      # MIGRATIONS[i] takes the schema from version i to version i + 1
assert len(MIGRATIONS) == SCHEMA_VERSION
