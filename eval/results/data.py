"""``data()``: the whole results database as one pandas DataFrame, one row per run (LEMUR's ``api.data``).

LEMUR (ABrain-One/nn-dataset) answers one request with every model's code, hyper-parameters, accuracy, duration
and architecture statistics. ``data()`` does the same for zoo's store and adds what LEMUR has not: the seed, the
block choices, the interval-ready per-seed rows, the error of a failed run, and the most trusted latency per
runtime and batch size with the CPU it was taken on.

>>> from zoo.eval import results
>>> df = results.data(task='classification', dataset='digits', only_best=True)
>>> df[['model', 'model_args', 'seed', 'final', 'latency_eager_ms']]
"""
from __future__ import annotations

import json
import math

from .schema import STATUSES, UNKNOWN_CPU, ResultsDBError
from .store import open_db

# The columns ``data()`` always returns, in order. After them come one column per final metric the runs
# recorded (named as logged, e.g. ``val/acc1``, ``train/peak_mem_mb``), then the latency columns of every further
# runtime the database holds: ``latency_<runtime>_ms`` (batch 1) and ``latency_<runtime>_b16_ms`` (batch 16), each
# followed by the same record's ``_iqr_ms``, ``_load`` and ``_delta`` (``LATENCY_SUFFIXES``).
DATA_COLUMNS = [
    'run_id',              # zoo_runs.id
    'task', 'dataset', 'model', 'family',
    'model_args',          # the zoo.create arguments (block choices and sizes) as sorted 'key=value' text
    'block_choices',       # {'token_mixer': 'pooling', ...} as recorded (dict)
    'seed', 'status', 'error', 'recipe', 'config_key', 'max_epochs',
    'hparams',             # the system's hyper-parameters as JSON text (network spec and statistics left out)
    'benchmark', 'group', 'entry',   # the ``zoo benchmark`` job this run was (None otherwise)
    'metric',              # the task's primary metric (zoo.tasks.get(task).metric)
    'final',               # its final value
    'best',                # its best per-epoch value (max, or min for a lower-is-better metric)
    'epochs',              # training epochs recorded
    'epoch_time_s',        # mean wall time of a training epoch (validation excluded; EpochStats)
    'train_time_s',        # sum of the training epochs' wall times
    'samples_per_s',       # mean training samples per second
    'wall_s',              # the run's wall time, start to end
    'train_cpu',           # the CPU the run trained on (its recorded environment; None if not recorded)
    'params', 'macs',
    'size_mb',             # parameters and buffers (MB)
    'weighted_layers',     # depth: convolutions, linear layers, embeddings
    'leaf_modules',
    'blocks',              # {kind: count} of registered zoo blocks
    'peak_activation_mb',  # at batch 1 and the input size the run trained at
    'input_shape',         # that input size, one sample
    'arch_fingerprint',
    'latency_eager_ms',         # median ms of the picked record (pick_latency) at batch 1, eager float32
    'latency_eager_iqr_ms',     # ... its IQR (ms)
    'latency_eager_load',       # ... the 1-minute load average per CPU before its timing
    'latency_eager_delta',      # ... its max |output - eager output| on the timed input (0.0 for eager itself)
    'latency_eager_b16_ms', 'latency_eager_b16_iqr_ms', 'latency_eager_b16_load', 'latency_eager_b16_delta',
    'latency_cpu',         # the CPU the latency was taken on ('unknown' before schema 5)
    'latency_threads',     # the thread count(s) of those records, e.g. '2' ('1, 2' when runtimes' records differ)
]
# Block kinds get one count column each: ``blocks_<kind>`` (``blocks_token_mixer``), after DATA_COLUMNS.
LATENCY_BATCHES = {1: '', 16: '_b16'}
# Beside each ``latency_<runtime><batch>_ms``, the same record's IQR (ms), 1-minute load per CPU and max_abs_delta
LATENCY_SUFFIXES = ('_iqr_ms', '_load', '_delta')


def _latency_columns(runtime: str, batch_suffix: str) -> list[str]:
    """``latency_onnxruntime_b16_ms`` and its ``_iqr_ms``, ``_load`` and ``_delta`` columns, in that order."""
    base = f'latency_{runtime}{batch_suffix}'
    return [f'{base}_ms', *(base + s for s in LATENCY_SUFFIXES)]


def _latency_cells(runtime: str, batch_suffix: str, pick: dict | None) -> dict:
    """The latency columns of one picked record (None everywhere when there is none)."""
    names = _latency_columns(runtime, batch_suffix)
    if pick is None:
        return dict.fromkeys(names)
    load, cpus = as_float(pick.get('load_1m')), as_float(pick.get('cpus'))
    return dict(zip(names, (float(pick['median_ms']), as_float(pick.get('iqr_ms')),
                            load / cpus if load is not None and cpus else None, as_float(pick.get('max_abs_delta')))))


def data(db=None, task: str | None = None, dataset: str | None = None, model: str | None = None,
         status: str | None = 'finished', only_best: bool = False, cpu: str | None = None):
    """One row per run of the results database ``db`` (a path, URL, ``ResultsDB``; default ``$ZOO_DB``), with
    the documented ``DATA_COLUMNS``, ``blocks_<kind>`` counts, every final metric and every runtime's latency.

    Filters: ``task``, ``dataset``, ``model`` (a glob), ``status`` (``None``: every status), ``cpu`` (a part of
    the CPU model's name, case-insensitive, as ``leaderboard(cpu=)``: only latency measured on that CPU; rows
    keep their training columns); a ``task``, ``dataset`` or ``model`` that matches no run is an error naming the
    closest recorded values. ``only_best``: per (task, dataset, model, model_args), only the run with the best
    final primary metric (LEMUR's ``only_best_accuracy``). Latency: per run, runtime and batch size (1 and 16), the most
    trusted inference record (``board.pick_latency``, which never picks one ``zoo.eval.bench.untrusted`` rejects)
    of the run itself or of its architecture fingerprint, as four columns of that one record, e.g. at batch 16 in
    ONNX Runtime:

    - ``latency_onnxruntime_b16_ms``: its median (ms);
    - ``latency_onnxruntime_b16_iqr_ms``: its interquartile range (ms);
    - ``latency_onnxruntime_b16_load``: the 1-minute load average per CPU before it was timed;
    - ``latency_onnxruntime_b16_delta``: its ``max_abs_delta``, the largest |output - eager float32 output| on the
      timed input (0.0 for eager; None for records older than schema 7 or outputs that cannot be compared).

    Batch 1 drops the ``_b16`` (``latency_eager_ms``, ``latency_eager_iqr_ms``, ...); all four are None where no
    trusted record exists."""
    import pandas as pd

    from .board import _model_args, is_higher_better, pick_latency

    if status is not None and status not in STATUSES:
        raise ResultsDBError(f'unknown status {status!r}; expected one of {", ".join(STATUSES)} or None')
    store = open_db(db, create=False)
    store.check_filters(task=task, dataset=dataset, model=model)
    runs = store.runs(model=model, task=task, dataset=dataset, status=status)
    epochs = store.metrics(final=False)
    hosts = store.runs(columns=['host', 'env'])
    host_cpu = {h: e.get('cpu') for h, e in zip(hosts.host, hosts.env) if isinstance(e, dict) and e.get('cpu')}
    lat = _latency_records(store.latency(), cpu, host_cpu)
    metric_cols = sorted({c for c in runs.columns if '/' in str(c)})
    runtimes = sorted(set(lat.runtime) | {'eager'}, key=lambda r: (r != 'eager', r)) if not lat.empty else ['eager']
    kinds = _block_kinds()
    rows = []
    for rd in runs.to_dict('records'):
        hp = rd['hparams'] if isinstance(rd['hparams'], dict) else {}
        stats = hp.get('network_stats') if isinstance(hp.get('network_stats'), dict) else {}
        job = hp.get('benchmark') if isinstance(hp.get('benchmark'), dict) else {}
        metric = _primary(rd['task'])
        mine = epochs[epochs.run_id == rd['id']]
        best = None
        if metric is not None:
            vals = mine[mine.name == metric].value.dropna()
            if len(vals):
                best = float(vals.max() if is_higher_better(metric) else vals.min())
        times = mine[mine.name == 'train/epoch_time_s'].value.dropna()
        speed = mine[mine.name == 'train/samples_per_s'].value.dropna()
        row = {
            'run_id': int(rd['id']), 'task': rd['task'], 'dataset': rd['dataset'], 'model': rd['model'],
            'family': rd['family'], 'model_args': _model_args(hp, rd['block_choices']),
            'block_choices': rd['block_choices'] if isinstance(rd['block_choices'], dict) else {},
            'seed': _int(rd['seed']), 'status': rd['status'], 'error': rd['error'], 'recipe': rd['recipe'],
            'config_key': rd['config_key'], 'max_epochs': _int(rd['max_epochs']),
            'hparams': json.dumps({k: v for k, v in hp.items() if k not in ('network', 'network_stats', 'benchmark')},
                                  sort_keys=True, default=str),
            'benchmark': job.get('name'), 'group': job.get('group'), 'entry': job.get('entry'),
            'metric': metric, 'final': as_float(rd.get(metric)) if metric else None, 'best': best,
            'epochs': int(len(times)), 'epoch_time_s': float(times.mean()) if len(times) else None,
            'train_time_s': float(times.sum()) if len(times) else None,
            'samples_per_s': float(speed.mean()) if len(speed) else None, 'wall_s': as_float(rd['wall_s']),
            'train_cpu': rd['env'].get('cpu') if isinstance(rd.get('env'), dict) else None,
            'params': _int(rd['params']), 'macs': _int(rd['macs']),
            'size_mb': stats.get('size_mb'), 'weighted_layers': stats.get('weighted_layers'),
            'leaf_modules': stats.get('leaf_modules'), 'blocks': stats.get('blocks') or {},
            'peak_activation_mb': stats.get('peak_activation_mb'),
            'input_shape': 'x'.join(map(str, stats['input_shape'])) if stats.get('input_shape') else None,
            'arch_fingerprint': rd['arch_fingerprint'] if isinstance(rd['arch_fingerprint'], str) else None,
        }
        for k in kinds:
            row[f'blocks_{k}'] = int((stats.get('blocks') or {}).get(k, 0)) if stats else None
        for m in metric_cols:
            row[m] = as_float(rd.get(m))
        cands = _candidates(lat, row['run_id'], row['arch_fingerprint'], rd['model'])
        cpus, threads = [], []
        for rt in runtimes:
            for bs, suffix in LATENCY_BATCHES.items():
                sel = cands[(cands.runtime == rt) & (cands.batch_size == bs)] if not cands.empty else cands
                pick = pick_latency(sel)
                row.update(_latency_cells(rt, suffix, pick))
                if pick is not None:
                    cpus.append(pick.get('cpu_name') or 'unknown')
                    if pick.get('threads') is not None:
                        threads.append(int(pick['threads']))
        row['latency_cpu'] = ', '.join(sorted(set(cpus))) if cpus else None
        row['latency_threads'] = ', '.join(map(str, sorted(set(threads)))) if threads else None
        rows.append(row)
    lat_cols = [c for rt in runtimes for s in LATENCY_BATCHES.values() for c in _latency_columns(rt, s)]
    extra = [f'blocks_{k}' for k in kinds] + metric_cols + [c for c in lat_cols if c not in DATA_COLUMNS]
    df = pd.DataFrame(rows, columns=[*DATA_COLUMNS, *extra])
    if only_best and not df.empty:
        df = _only_best(df)
    return df.reset_index(drop=True)


def _primary(task) -> str | None:
    from zoo import tasks
    return tasks.get(task).metric if isinstance(task, str) and task in tasks.names() else None


def _block_kinds() -> list[str]:
    import zoo
    return sorted({rec.kind for rec in zoo.layers.records()})


def _latency_records(lat, cpu: str | None, host_cpu: dict | None = None):
    """Inference records at float32, with a ``runtime`` (schema 5's column; before it, ``compile`` for a compiled
    record and ``eager`` otherwise) and a ``cpu_name`` (schema 5's ``cpu_model``; before it, the CPU that runs
    recorded in their environment on the record's host, else unknown). CPU records only: a GPU's figure (schema 8,
    ``device`` 'cuda') is another machine's, and the columns name CPUs (``leaderboard(device='cuda')`` shows them)."""
    if lat.empty:
        return lat.assign(runtime=[], cpu_name=[])
    lat = lat.copy()
    if 'runtime' not in lat.columns:
        lat['runtime'] = ['compile' if c is True or c == 1 else 'eager' for c in lat.compiled]
    lat['runtime'] = lat.runtime.fillna('eager')
    by_host = lat.host.map(host_cpu or {})
    if 'cpu_model' in lat.columns:       # schema 5 (rows older than it say UNKNOWN_CPU)
        lat['cpu_name'] = lat.cpu_model.where(lat.cpu_model != UNKNOWN_CPU).fillna(by_host)
    else:
        lat['cpu_name'] = by_host
    ok = lat['mode'].isna() | (lat['mode'] == 'inference')
    ok &= lat['dtype'].isna() | (lat['dtype'] == 'float32')
    ok &= lat['device'].astype(str).str.split(':').str[0] == 'cpu'
    if cpu is not None:
        ok &= lat.cpu_name.fillna(UNKNOWN_CPU).str.lower().str.contains(cpu.lower(), regex=False)
    return lat[ok]


def _candidates(lat, run_id: int, fp: str | None, model: str):
    """The latency records of one run: its own, or of the same architecture (by name where none is known)."""
    if lat.empty:
        return lat
    sel = lat.run_id == run_id
    sel |= (lat.arch_fingerprint == fp) if fp else (lat.model == model)
    return lat[sel]


def _only_best(df):
    higher = {m: _higher(m) for m in df.metric.dropna().unique()}
    key = df.final.astype(float) * df.metric.map(lambda m: 1.0 if higher.get(m, True) else -1.0)
    df = df.assign(_key=key.fillna(-math.inf))
    df = df.sort_values(['_key', 'run_id'], ascending=[False, True], kind='stable')
    df = df.drop_duplicates(['task', 'dataset', 'model', 'model_args'], keep='first')
    return df.drop(columns='_key').sort_values('run_id', kind='stable')


def _higher(metric: str) -> bool:
    from .board import is_higher_better
    try:
        return is_higher_better(metric)
    except ResultsDBError:
        return True


def as_float(v) -> float | None:
    """A stored field as a float; None when missing, NaN (a DataFrame row's NULL) or not a number."""
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if v != v else v


def _int(v) -> int | None:
    f = as_float(v)
    return None if f is None else int(f)
