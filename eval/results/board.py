"""Comparisons: the leaderboard (best configuration per model, interval over seeds) and the across-tasks
aggregate (IQM and mean with stratified bootstrap intervals)."""
from __future__ import annotations

import contextlib
import json
import re

from .schema import ResultsDBError, runs_table
from .stats import AGGREGATE_STATISTICS, bootstrap_ci, iqm, stratified_bootstrap
from .store import open_db

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
    higher = is_higher_better(metric) if higher_is_better is None else higher_is_better
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


# The direction of every metric the recipes log, by its last path component (``val/acc1`` -> ``acc1``; a
# trailing index, ``acc_depth3``, is dropped). A metric not listed needs ``higher_is_better=`` from the caller.
HIGHER_IS_BETTER = {'acc', 'acc1', 'acc5', 'token_acc', 'acc_generated', 'acc_depth', 'acc_tag', 'psnr', 'ssim',
                    'map', 'map50', 'map75', 'map50_95', 'miou', 'f1', 'auc', 'throughput'}
LOWER_IS_BETTER = {'loss', 'nll', 'ppl', 'perplexity', 'bpb', 'mse', 'mae', 'err', 'error', 'err1', 'err5',
                   'latency_ms'}


def is_higher_better(metric: str) -> bool:
    """Whether a larger ``metric`` is better, from the tables above; an unknown metric is an error."""
    leaf = metric.rsplit('/', 1)[-1].lower()
    if leaf not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
        leaf = re.sub(r'\d+$', '', leaf)  # acc_depth3 -> acc_depth
    if leaf in HIGHER_IS_BETTER:
        return True
    if leaf in LOWER_IS_BETTER:
        return False
    raise ResultsDBError(f'unknown direction of metric {metric!r}: pass higher_is_better=True/False (known: '
                         f'higher {", ".join(sorted(HIGHER_IS_BETTER))}; lower {", ".join(sorted(LOWER_IS_BETTER))})')


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
    higher = is_higher_better(metric) if higher_is_better is None else higher_is_better
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
