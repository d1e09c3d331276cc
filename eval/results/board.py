"""Comparisons: the leaderboard (best configuration per model, interval over seeds) and the across-tasks
aggregate (IQM and mean with stratified bootstrap intervals)."""
from __future__ import annotations

import contextlib
import json
import re

from .schema import UNKNOWN_CPU, ResultsDBError, runs_table
from .stats import AGGREGATE_STATISTICS, iqm, stratified_bootstrap, t_interval
from .store import open_db

# Fewer seeds than this get no interval: with two values a "95 % interval" is only their range (a bootstrap
# of two values returns min and max), and a Student-t interval on one degree of freedom is 12.7 standard
# errors wide. From three seeds on, the Student-t interval of the mean is given.
MIN_SEEDS_FOR_INTERVAL = 3

AGGREGATE_COLUMNS = ['model', 'model_args', 'n_tasks', 'n_runs', 'runs_per_task', 'iqm', 'iqm_low', 'iqm_high', 'mean',
                     'mean_low', 'mean_high', 'note']


def aggregate(metric: str = 'val/acc1', *, db=None, model: str | None = None, task: str | None = None,
              dataset: str | None = None, by: tuple[str, ...] = ('task', 'dataset'), configs: str = 'best',
              common: bool = True, normalize: dict | None = None, higher_is_better: bool | None = None,
              n_boot: int = 2000, level: float = 0.95, seed: int = 0, runs=None):
    """Compare models over several tasks and seeds: interquartile mean and mean of the final ``metric``
    with stratified-bootstrap confidence intervals (Agarwal et al. 2021), one row per model and model
    arguments (as on the leaderboard: two token mixers of one MetaFormer are two rows).

    A task (stratum) is a distinct value of the ``by`` columns of the finished runs, by default each
    (task, dataset). For every model and task the runs of its best configuration (``configs='best'``, the
    one the leaderboard shows: highest mean over seeds) or all its runs (``configs='all'``) are the
    samples. IQM and mean pool the scores of all tasks (a task with more runs weighs more); the interval
    resamples runs within each task independently. ``common=True`` keeps only the tasks every compared
    model has, so the numbers are comparable. Scores of different tasks must share a scale: pass
    ``normalize={'digits': (0.1, 1.0), ...}`` (stratum label -> (low, high), e.g. chance and perfect
    accuracy) to map each task to [0, 1]. A model with fewer than three runs in some task gets no
    interval (NaN; resampling two runs only spans their range) and says so in ``note``. ``runs``: a frame of
    finished runs (``ResultsDB.runs`` rows, e.g. one benchmark's) to aggregate instead of querying the database
    with the filters. Returns a DataFrame sorted best first."""
    import numpy as np
    import pandas as pd

    by = (by,) if isinstance(by, str) else tuple(by)
    if configs not in ('best', 'all'):
        raise ResultsDBError(f"configs must be 'best' or 'all'; got {configs!r}")
    higher = is_higher_better(metric) if higher_is_better is None else higher_is_better
    if runs is None:
        store = open_db(db)
        store.check_filters(task=task, dataset=dataset, model=model)
        df = store.runs(model=model, task=task, dataset=dataset, status='finished')
    else:
        df = runs.copy()
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
    df['_args'] = [_model_args(h, b) for h, b in zip(df.hparams, df.block_choices)]
    ident = ['model', '_args']                       # what a row is
    if normalize:
        missing = sorted(set(df._task) - set(normalize))
        if missing:
            raise ResultsDBError(f'normalize has no (low, high) for task(s) {missing}; tasks: {sorted(set(df._task))}')
        lo = df._task.map(lambda t: float(normalize[t][0]))
        hi = df._task.map(lambda t: float(normalize[t][1]))
        df[metric] = (df[metric] - lo) / (hi - lo)
    if configs == 'best':     # per row and task, the runs of the configuration with the best mean
        means = df.groupby([*ident, '_task', 'config_key'], dropna=False)[metric].mean().reset_index()
        best = means.sort_values(metric, ascending=not higher, kind='stable').drop_duplicates([*ident, '_task'])
        df = df.merge(best[[*ident, '_task', 'config_key']], on=[*ident, '_task', 'config_key'])
    tasks = {k: set(g._task) for k, g in df.groupby(ident)}
    shared = set.intersection(*tasks.values()) if common else set().union(*tasks.values())
    if not shared:
        raise ResultsDBError('the models have no task in common: ' + '; '.join(
            f'{m}{f" ({a})" if a else ""}: {", ".join(sorted(t))}' for (m, a), t in sorted(tasks.items()))
            + ' (pass common=False to aggregate each model over its own tasks, or filter with model=/task=/dataset=)')
    rows = []
    for (name, args), g in df[df._task.isin(shared)].groupby(ident, sort=False):
        strata = [t[metric].to_numpy(dtype=float) for _, t in g.groupby('_task', sort=True)]
        pooled = np.concatenate(strata)
        counts = [len(x) for x in strata]
        row = dict(model=name, model_args=args, n_tasks=len(strata), n_runs=len(pooled),
                   runs_per_task=str(counts[0]) if min(counts) == max(counts) else f'{min(counts)}-{max(counts)}',
                   note='')
        for stat, fn in AGGREGATE_STATISTICS.items():
            row[stat] = float(fn(pooled))
            row[f'{stat}_low'], row[f'{stat}_high'] = (
                stratified_bootstrap(strata, fn, n_boot, level, seed) if min(counts) >= MIN_SEEDS_FOR_INTERVAL
                else (float('nan'), float('nan')))
        if min(counts) < 2:
            row['note'] = (f'no interval: {sum(c < 2 for c in counts)} of {len(counts)} task(s) have a single run '
                           '(run more seeds, e.g. zoo fit --seeds 0,1,2)')
        elif min(counts) < MIN_SEEDS_FOR_INTERVAL:     # resampling 2 runs only spans their range
            row['note'] = (f'no interval: {sum(c < MIN_SEEDS_FOR_INTERVAL for c in counts)} of {len(counts)} task(s) '
                           'have n=2 runs, too few for an interval (run more seeds, e.g. zoo fit --seeds 0,1,2)')
        elif len(pooled) < 4:
            row['note'] = 'IQM of fewer than 4 runs trims nothing (it equals the mean)'
        rows.append(row)
    out = pd.DataFrame(rows, columns=AGGREGATE_COLUMNS).sort_values('iqm', ascending=not higher, kind='stable')
    out = out.reset_index(drop=True)
    out.attrs.update(metric=metric, higher_is_better=higher, tasks=sorted(shared), level=level)
    return out


# The direction of every metric the recipes log, by its last path component (``val/acc1`` -> ``acc1``; a
# trailing index, ``acc_depth3``, is dropped). A metric not listed needs ``higher_is_better=`` from the caller.
HIGHER_IS_BETTER = {'acc', 'acc1', 'acc5', 'token_acc', 'acc_generated', 'acc_depth', 'acc_tag', 'psnr', 'ssim',
                    'map', 'map50', 'map75', 'map50_95', 'miou', 'macc', 'aacc', 'f1', 'auc', 'throughput'}
LOWER_IS_BETTER = {'loss', 'nll', 'ppl', 'perplexity', 'bpb', 'mse', 'mae', 'err', 'error', 'err1', 'err5',
                   'latency_ms', 'ece', 'ce', 'mce'}  # ece: calibration error; ce, mce: corruption error (test_c/)


def is_higher_better(metric: str) -> bool:
    """Whether a larger ``metric`` is better: the registered task's word for its primary metric and board columns
    (``zoo.tasks``: a task's ``mode``), else the tables above; an unknown metric is an error."""
    from zoo import tasks

    mode = tasks.metric_mode(metric)
    if mode is not None:
        return mode == 'max'
    leaf = metric.rsplit('/', 1)[-1].lower()
    if metric.startswith('test_c/'):  # test_c/acc1/fog/3: the quantity is the name after the split
        leaf = metric.split('/')[1].lower()
    if leaf not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        leaf = re.sub(r'\d+$', '', leaf)  # acc_depth3 -> acc_depth
    if leaf in HIGHER_IS_BETTER:
        return True
    if leaf in LOWER_IS_BETTER:
        return False
    raise ResultsDBError(f'unknown direction of metric {metric!r}: pass higher_is_better=True/False (known: '
                         f'higher {", ".join(sorted(HIGHER_IS_BETTER))}; lower {", ".join(sorted(LOWER_IS_BETTER))})')


# then the task's board columns (``attrs['board_columns']``), e.g. val/map50 and val/map75 beside detection's val/map
LEADERBOARD_COLUMNS = ['model', 'family', 'model_args', 'dataset', 'block_choices', 'budget', 'max_epochs', 'steps',
                       'n_seeds', 'mean', 'ci_low', 'ci_high', 'interval_note', 'values', 'iqm', 'std', 'best', 'params',
                       'macs',
                       'latency_ms', 'latency_iqr_ms', 'latency_batch', 'latency_threads', 'latency_shape',
                       'latency_source', 'latency_load', 'latency_repeats', 'latency_id', 'latency_runtime',
                       'latency_cpu', 'arch_fingerprint',
                       'aliases', 'config_key', 'run_ids']

INTERVAL = 'Student-t 95 % interval of the mean over seeds (n >= 3)'


def board_tasks(*, db=None, model: str | None = None, task: str | None = None, dataset: str | None = None) -> list[str]:
    """The tasks of the finished runs (filtered like ``leaderboard``), in the registry's order."""
    from zoo import tasks

    store = open_db(db)
    store.check_filters(task=task, dataset=dataset, model=model)
    df = store.runs(model=model, task=task, dataset=dataset, status='finished')
    found = set(df.task.dropna()) if not df.empty else set()
    return [t for t in tasks.names() if t in found] + sorted(found - set(tasks.names()))


def leaderboards(task: str | None = None, dataset: str | None = None, metric: str | None = None, **kwargs) -> dict:
    """``{task: leaderboard}``, one per task among the finished runs (or just ``task``), each ranked by
    ``metric`` or, by default, by its task's primary metric (``zoo.tasks.get(task).metric``)."""
    tasks = [task] if task else board_tasks(db=kwargs.get('db'), model=kwargs.get('model'), dataset=dataset)
    return {t: leaderboard(t, dataset, metric, **kwargs) for t in tasks}


def leaderboard(task: str | None = None, dataset: str | None = None, metric: str | None = None, *, db=None,
                model: str | None = None, higher_is_better: bool | None = None, threads: int | None = None,
                device: str = 'cpu', runtime: str = 'eager', cpu: str | None = None):
    """One row per model, *model arguments* and dataset, by the final ``metric`` of finished runs (runs on two
    datasets are never folded into one row; ``dataset=`` keeps one).

    ``metric`` defaults to the task's primary metric (``val/acc1`` for classification, ``val/map`` for
    detection, ...); without ``task`` the finished runs must all be of one task (else: ``leaderboards``).

    Rows: runs with different ``model_args`` (``metaformer_tiny`` with ``token_mixer=pooling`` and with
    ``token_mixer=attention``) are different rows; among the configurations of one row (other learning
    rates, budgets, ...) the one with the best mean over seeds is shown, with its training budget
    (``budget``: max epochs and/or max steps; ``steps``: optimizer steps the runs actually took).

    Interval: runs of one configuration (different seeds) are pooled: ``mean``, ``iqm``, ``std`` and, from
    three seeds on, the Student-t 95 % interval of the mean (``ci_low``/``ci_high``). With one or two seeds
    there is no interval (None): ``interval_note`` says ``n=2, too few for an interval`` and ``values``
    lists the per-seed values.

    Latency (batch 1, inference, float32, ``device``): the most trustworthy record among those measured
    for the row's runs or for the same architecture fingerprint (or, for runs without a fingerprint, the
    model name), chosen by ``pick_latency``, the rule ``data()`` and the benchmark report use too.
    ``threads``: records at that many threads first; by default every thread count, and ``attrs['threads']``
    is the rows' common count (None when the rows' records differ). ``latency_iqr_ms`` is that record's spread.

    Columns: ``LEADERBOARD_COLUMNS``, then the task's board columns its runs recorded (``zoo.tasks``: e.g.
    ``val/map50`` and ``val/map75`` beside detection's ``val/map``), each the mean over the row's runs and named in
    ``attrs['board_columns']``.

    Runtime and machine: only records of ``runtime`` (eager, compile, onnxruntime, openvino) count, and all
    latencies of one board come from one CPU model, never a mix: the CPU whose name contains ``cpu``
    (case-insensitive), by default the one most of the board's records were measured on (``attrs['cpu']``)."""
    import numpy as np
    import pandas as pd

    store = open_db(db)
    store.check_filters(task=task, dataset=dataset, model=model)
    if metric is None:
        metric = _default_metric(task, store, model=model, dataset=dataset)
    higher = is_higher_better(metric) if higher_is_better is None else higher_is_better
    df = store.runs(model=model, task=task, dataset=dataset, status='finished')
    if df.empty or metric not in df.columns:
        known = sorted(c for c in df.columns if '/' in str(c))
        if not df.empty and known:
            raise ResultsDBError(f'no final metric {metric!r} among the finished runs; recorded: {", ".join(known)}')
        return pd.DataFrame(columns=LEADERBOARD_COLUMNS)
    df = df[df[metric].notna()].copy()
    shown = _board_columns(task, df, metric)
    df['_args'] = [_model_args(h, b) for h, b in zip(df.hparams, df.block_choices)]
    steps = _trained_steps(store, df.id.tolist())
    all_lat = store.latency()
    lat = _latency_candidates(all_lat, device, runtime)
    cpu_pick = _cpu_filter(_on_device(all_lat, device), cpu)
    rows, candidates = [], []
    for (name, _, key), g in df.groupby(['model', 'dataset', 'config_key'], dropna=False, sort=False):
        vals = g[metric].to_numpy(dtype=float)
        fp = g.arch_fingerprint.dropna().iloc[0] if g.arch_fingerprint.notna().any() else None
        n = len(vals)
        if n >= MIN_SEEDS_FOR_INTERVAL:
            mean, half = t_interval(vals)
            lo, hi, note = mean - half, mean + half, ''
        else:
            lo = hi = None
            note = f'n={n}, too few for an interval' if n > 1 else 'n=1, no interval'
        candidates.append(_matching(lat, g.id.tolist(), fp, name))
        max_epochs = _first(g.max_epochs)
        run_steps = [steps[i] for i in g.id if i in steps]
        rows.append(dict(
            model=name, family=g.family.iloc[0], model_args=g._args.iloc[0], dataset=g.dataset.iloc[0],
            block_choices=_fmt_choices(g.block_choices.iloc[0]),
            budget=_budget(max_epochs, g.config.iloc[0]), max_epochs=max_epochs,
            steps=max(run_steps) if run_steps else None,
            n_seeds=int(g.seed.nunique(dropna=False)), mean=float(vals.mean()), ci_low=lo, ci_high=hi,
            interval_note=note, values=', '.join(f'{v:.4g}' for v in sorted(vals)),
            iqm=iqm(vals), std=float(vals.std(ddof=1)) if n > 1 else float('nan'),
            best=float(vals.max() if higher else vals.min()),
            params=_first(g.params), macs=_first(g.macs),
            _i=len(rows),
            arch_fingerprint=fp, aliases=', '.join(a for a in store.aliases(fp) if a != name) if fp else '',
            config_key=key, run_ids=','.join(map(str, g.id.tolist())),
            **{c: float(g[c].mean()) if g[c].notna().any() else None for c in shown}))
    board = pd.DataFrame(rows)
    board = board.sort_values('mean', ascending=not higher, kind='stable')
    # one row per (model, model arguments, dataset): its best configuration; datasets in name order, each best first
    board = board.drop_duplicates(['model', 'model_args', 'dataset'], keep='first')
    board = board.sort_values('dataset', kind='stable').reset_index(drop=True)
    mine = [candidates[i] for i in board._i]
    if cpu_pick is None:         # the CPU most of this board's records were measured on (ties: by name)
        counts = pd.Series([c for m in mine if not m.empty for c in m.cpu_model], dtype=object).value_counts()
        cpu_pick = sorted(counts.index[counts == counts.max()])[0] if len(counts) else None
    mine = [m if m.empty or cpu_pick is None else m[m.cpu_model == cpu_pick] for m in mine]
    picked = [pick_latency(m, threads) for m in mine]
    asked = threads
    if threads is None:          # the rows' common thread count, if their records share one
        counts = {int(p['threads']) for p in picked if p is not None and p['threads'] is not None}
        threads = counts.pop() if len(counts) == 1 else None
    for col, key in (('latency_ms', 'median_ms'), ('latency_iqr_ms', 'iqr_ms'), ('latency_threads', 'threads'),
                     ('latency_shape', 'input_shape'), ('latency_source', 'source'), ('latency_load', 'load_1m'),
                     ('latency_repeats', 'repeats'), ('latency_id', 'id'), ('latency_runtime', 'runtime'),
                     ('latency_cpu', 'cpu_model')):
        board[col] = [None if p is None else p[key] for p in picked]
    board['latency_batch'] = [None if p is None else 1 for p in picked]
    board = board[LEADERBOARD_COLUMNS + shown]
    board.attrs.update(metric=metric, higher_is_better=higher, task=task, dataset=dataset, threads=threads,
                       board_columns=shown,
                       threads_asked=asked,
                       interval=INTERVAL, runtime=runtime, cpu=cpu_pick)
    board[['params', 'macs']] = board[['params', 'macs']].astype('Float64')
    return board.replace({np.nan: None}).astype({'mean': float})


def _board_columns(task: str | None, df, metric: str) -> list[str]:
    """The task's board columns (``zoo.tasks``: metrics shown beside the ranked one, mean over the row's runs)
    that its runs recorded; for a board of one task only (``task``, or the one task of the runs)."""
    from zoo import tasks

    found = set(df.task.dropna()) if task is None else {task}
    if len(found) != 1 or next(iter(found)) not in tasks.names():
        return []
    return [c for c in tasks.get(next(iter(found))).board_columns if c != metric and c in df.columns]


def _default_metric(task: str | None, store, **filters) -> str:
    from zoo import tasks

    if task is None:
        found = board_tasks(db=store, **filters)
        if len(found) > 1:
            raise ResultsDBError(f'the finished runs are of {len(found)} tasks ({", ".join(found)}); choose one with '
                                 f'task= (`zoo results --task T`), or call leaderboards() for one board per task')
        task = found[0] if found else 'classification'
    try:
        return tasks.get(task).metric
    except KeyError as e:
        raise ResultsDBError(f'{e.args[0]}; pass metric=') from None


def _model_args(hparams, block_choices) -> str:
    """The row identity beside the model name: the run's ``model_args`` (the arguments its system passed to
    ``zoo.create``), else its block choices, as sorted ``key=value`` pairs ('' for the defaults)."""
    args = hparams.get('model_args') if isinstance(hparams, dict) else None
    if not args and isinstance(block_choices, dict):
        args = {k: v for k, v in block_choices.items() if v not in ('', None)}
    return _fmt_choices(args or block_choices, sort=True)


def _budget(max_epochs, config) -> str:
    """'15 ep', '2000 steps' or '15 ep / 2000 steps' from the run's epoch budget and its trainer config."""
    parts = [f'{max_epochs} ep'] if max_epochs is not None and max_epochs > 0 else []
    trainer = config.get('trainer') if isinstance(config, dict) else None
    max_steps = trainer.get('max_steps') if isinstance(trainer, dict) else None
    if isinstance(max_steps, int) and max_steps > 0:
        parts.append(f'{max_steps} steps')
    return ' / '.join(parts)


def _trained_steps(store, run_ids: list[int]) -> dict[int, int]:
    """The optimizer steps each run took (the step of its last recorded metric row)."""
    m = store.metrics(final=None)
    m = m[m.run_id.isin(run_ids) & m.step.notna()]
    return {int(k): int(v) for k, v in m.groupby('run_id').step.max().items()}


# ------------------------------------------------------------------------------------------ latency records
# How much a latency record is trusted, by source: ``zoo bench`` (a process that only measures, with the
# controlled protocol) before the after-training record (the trainer's process, right after an epoch), before
# rows without a source (written before schema 4 or through the API, with no load recorded).
SOURCE_RANK = {'bench': 0, 'fit': 1}


def _latency_candidates(lat, device: str, runtime: str = 'eager'):
    """The rows a leaderboard may use: batch 1, inference, float32, ``runtime``, contiguous, on ``device``."""
    from .schema import LATENCY_RUNTIMES

    if runtime not in LATENCY_RUNTIMES:
        raise ResultsDBError(f'unknown runtime {runtime!r}; expected one of {", ".join(LATENCY_RUNTIMES)}')
    if lat.empty:
        return lat
    lat = _on_device(lat, device)
    ok = (lat.batch_size == 1) & (lat.runtime.fillna('eager') == runtime)
    for col, want in (('mode', 'inference'), ('dtype', 'float32')):
        ok &= lat[col].isna() | (lat[col] == want)
    ok &= lat.channels_last.isna() | ~lat.channels_last.astype('boolean').fillna(False)
    return lat[ok]


def _on_device(lat, device: str):
    """The records taken on ``device`` (``cpu``, ``cuda``; a record of ``cuda:1`` is a ``cuda`` record), with
    ``cpu_model`` set to the machine that ran the network: the CPU's model name, or on a GPU the GPU's name (its
    host CPU barely matters there), so one board never mixes GPUs, as it never mixes CPUs."""
    if lat.empty:
        return lat
    kind = device.split(':')[0]
    lat = lat[lat.device.astype(str).str.split(':').str[0] == kind]
    machine = lat.cpu_model.fillna(UNKNOWN_CPU) if kind == 'cpu' else \
        (lat.gpu_name if 'gpu_name' in lat else lat.cpu_model).fillna(UNKNOWN_CPU)
    return lat.assign(cpu_model=machine)


def latency_cpus(lat) -> list[str]:
    """The CPU models of latency rows, most rows first."""
    if lat.empty:
        return []
    return lat.cpu_model.fillna(UNKNOWN_CPU).value_counts().index.tolist()


def _cpu_filter(lat, cpu: str | None) -> str | None:
    """The one recorded CPU model whose name contains ``cpu`` (case-insensitive); an error names the choices."""
    if cpu is None:
        return None
    cpus = latency_cpus(lat)
    hits = [c for c in cpus if cpu.lower() in c.lower()]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ResultsDBError(f'no latency was recorded on a CPU matching {cpu!r}; recorded CPUs: '
                             + ('; '.join(cpus) if cpus else 'none'))
    raise ResultsDBError(f'{cpu!r} matches {len(hits)} recorded CPUs ({"; ".join(hits)}); give more of the name')


def _matching(lat, run_ids: list[int], fp: str | None, model: str):
    """The candidate records of one leaderboard row: measured for its runs or for the same architecture;
    by name only where the fingerprint is unknown on either side. When the row's own runs recorded a shape
    (the input they trained at), records of other shapes are left out."""
    if lat.empty:
        return lat
    sel = lat.run_id.isin(run_ids)
    if fp:
        sel |= lat.arch_fingerprint == fp
        sel |= (lat.model == model) & lat.arch_fingerprint.isna()
    else:
        sel |= lat.model == model
    m = lat[sel]
    own = m[m.run_id.isin(run_ids)]
    if not own.empty:
        m = m[m.input_shape.isin(set(own.input_shape))]
    return m


def pick_latency(records, threads: int | None = None) -> dict | None:
    """The most trustworthy latency record among ``records`` (rows of ``zoo_latency``), or None: the one rule
    the leaderboard and its plot, ``data()`` and the benchmark report all use.

    Rule: (0) only records ``zoo.eval.bench.untrusted`` accepts (a busy or noisy one is never published); (1) when
    ``threads`` is asked for, records at that many threads if there are any (by default every thread count
    counts); (2) by source, ``zoo bench`` records first, then after-training (``fit``) records,
    then records without a source (older than schema 4, or written through the API); (3) then the lowest
    load: the 1-minute load average per CPU before the measurement (unknown load last); (4) then the most
    repeats, then the newest."""
    import numpy as np

    from ..bench import trusted

    if records is None or records.empty:
        return None
    r = trusted(records)
    if r.empty:
        return None
    if threads is not None and (r.threads == threads).any():
        r = r[r.threads == threads]
    load = r.load_1m.astype(float) / r.cpus.astype(float).where(r.cpus.astype(float) > 0, 1.0)
    r = r.assign(_src=r.source.map(SOURCE_RANK).fillna(len(SOURCE_RANK)), _load=load.fillna(np.inf),
                 _rep=-r.repeats.astype(float).fillna(0), _new=-r.id)
    best = r.sort_values(['_src', '_load', '_rep', '_new'], kind='stable').iloc[0]
    out = {k: (None if v is None or (isinstance(v, float) and v != v) else v) for k, v in best.items()}
    out['source'] = out.get('source') or 'unrecorded'
    return out


def _first(s):
    s = s.dropna()
    return int(s.iloc[0]) if len(s) else None


def _fmt_choices(c, sort: bool = False) -> str:
    if isinstance(c, str):
        with contextlib.suppress(ValueError):
            c = json.loads(c)
    if not c:
        return ''
    if not isinstance(c, dict):
        return str(c)
    items = sorted(c.items()) if sort else c.items()
    return ', '.join(f'{k}={v}' for k, v in items)
