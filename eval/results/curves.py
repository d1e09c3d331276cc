"""Accuracy against training time: each entry's validation curve over the training wall time, the time it needs to
reach a group's target, and its value at an equal training time (what a researcher with a CPU budget chooses on).

Read from the results database (``zoo_metrics``), nothing re-run. The time of a validation check is the training
wall time up to it, validation excluded:

- ``train/elapsed_s`` where the run logged it (``recipes.recording.EpochStats`` logs it at every validation of a fit:
  measured at the check, so a check inside an epoch, ``val_check_interval``, has its own time);
- else the sum of the ``train/epoch_time_s`` of the epochs before the check's epoch plus the share of its own
  epoch's time that its steps make up (exact for a check at an epoch's end; for a check inside an epoch it assumes
  the epoch's steps took equal time: runs recorded before ``train/elapsed_s`` existed). The ``time_from`` column
  says which.

An entry's curve over seeds (``entry_band``): each run interpolated linearly between its checks on a common time
grid, only inside its own span (first to last check; never extrapolated), the mean over seeds and, as the band, the
seeds' minimum and maximum (with 3 seeds an SD is itself a guess; the range shows every seed), both only where
every seed of the entry has been measured (so the mean never switches between subsets of seeds).

The group's target (``default_target``): 95 % of the best entry's mean final value for a higher-is-better metric,
its mirror (the best plus 5 % of its magnitude) for a lower-is-better one. The time to the target
(``time_to_target``) is the first time a run's curve reaches it, interpolated linearly between the two checks that
bracket it; per entry the median over seeds, a seed that never reaches it counting as later than every seed that
did (so the median is nan when fewer than half reach it), and how many reached it. The equal time (``equal_time``)
defaults to the training time of the group's shortest run, so every run of every entry is compared inside its
measured span (a run whose first check comes later has no value there: nan, never a guess).

The time-to-accuracy view is the one of DAWNBench (Coleman et al., "DAWNBench: An End-to-End Deep Learning Benchmark
and Competition", NIPS ML Systems Workshop 2017) and MLPerf Training (Mattson et al., MLSys 2020), which rank by the
time to a fixed quality target; the equal-budget view is the one of Dehghani et al., "The Efficiency Misnomer"
(ICLR 2022), who ask to compare models at equal cost.

>>> from zoo.eval import results
>>> from zoo.eval.results import curves
>>> store = results.open_db('benchmarks/paper_blocks.db', create=False)
>>> g = curves.group_curves(store, {'pooling': [1, 2, 3], 'attention': [4, 5, 6]}, 'val/acc1')
>>> curves.plot_curves(g.bands, 'acc_vs_time.svg', 'blocks_digits', 'val/acc1', target=g.target,
...                    equal_time=g.equal_time)
>>> g.table                                   # rows for a markdown table
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from .board import is_higher_better
from .schema import ResultsDBError

__all__ = ['ELAPSED', 'EPOCH_TIME', 'TARGET_FRACTION', 'CURVE_COLUMNS', 'GroupCurves', 'curves', 'time_grid',
           'entry_band', 'time_to_target', 'value_at_time', 'default_target', 'equal_time', 'entry_summary',
           'curve_table', 'group_curves', 'plot_curves']

ELAPSED = 'train/elapsed_s'          # training wall time so far, logged at each validation (EpochStats)
EPOCH_TIME = 'train/epoch_time_s'    # one training epoch's wall time, validation excluded (EpochStats)
TARGET_FRACTION = 0.95               # the default target: 95 % of the best entry's mean final value
CURVE_COLUMNS = ['run_id', 'check', 'epoch', 'step', 'train_s', 'value', 'time_from']


# ------------------------------------------------------------------------------------------------- the curves
def curves(store, run_ids: Iterable[int], metric: str) -> pd.DataFrame:
    """One row per validation check of each run: ``run_id``, ``check`` (0, 1, ... in the run's order), ``epoch``,
    ``step``, ``train_s`` (training wall time up to the check, validation excluded), ``value`` of ``metric`` and
    ``time_from`` ('elapsed': measured at the check; 'epochs': the sum of epoch times, the check at an epoch's
    end; 'steps': that sum plus the steps' share of the check's epoch). A check whose time cannot be recovered
    (its epoch never ended and no ``train/elapsed_s``) is left out. ``store``: a ``ResultsDB``."""
    frames = []
    for run_id in dict.fromkeys(int(r) for r in run_ids):        # once each, in the order given
        rows = store.metrics(run_id, final=False)
        frames.append(_run_curve(run_id, rows, metric))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CURVE_COLUMNS)
    return out.astype({'run_id': int, 'check': int, 'train_s': float, 'value': float})


def _run_curve(run_id: int, rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The checks of one run (its per-epoch metric rows ``rows``) with their training times."""
    checks = rows[rows.name == metric].sort_values(['epoch', 'step', 'id'], na_position='last')
    elapsed = {(e, s): v for e, s, v in _keyed(rows[rows.name == ELAPSED])}
    epochs = {int(e): (float(v), s) for e, s, v in _keyed(rows[rows.name == EPOCH_TIME]) if e is not None}
    out = []
    for e, s, v in _keyed(checks):
        if (e, s) in elapsed:
            t, source = elapsed[(e, s)], 'elapsed'
        else:
            t, source = _time_from_epochs(e, s, epochs)
        if t is not None and math.isfinite(v):
            out.append({'run_id': run_id, 'epoch': e, 'step': s, 'train_s': t, 'value': v, 'time_from': source})
    df = pd.DataFrame(out, columns=[c for c in CURVE_COLUMNS if c != 'check'])
    df = df.sort_values('train_s', kind='stable').reset_index(drop=True)
    df.insert(1, 'check', range(len(df)))
    return df


def _keyed(rows: pd.DataFrame) -> list[tuple]:
    """(epoch, step, value) of metric rows, epoch and step as ints or None."""
    def num(x):
        return None if x is None or x != x else int(x)
    return [(num(e), num(s), float(v)) for e, s, v in zip(rows.epoch, rows.step, rows.value)]


def _time_from_epochs(epoch: int | None, step: int | None, epochs: dict) -> tuple[float | None, str | None]:
    """The training time at a check of ``epoch``/``step`` from the epochs' times ``{epoch: (seconds, last step)}``:
    the epochs before it in full, plus the share of its own epoch that its steps make up (1 at the epoch's end)."""
    if epoch is None or epoch not in epochs or any(e not in epochs for e in range(epoch)):
        return None, None
    before = sum(epochs[e][0] for e in range(epoch))
    seconds, last = epochs[epoch]
    first = epochs[epoch - 1][1] if epoch > 0 else -1      # the last step of the epoch before (steps count from 0)
    if step is None or last is None or first is None or step >= last:
        return before + seconds, 'epochs'
    share = (step - first) / (last - first)
    return before + share * seconds, 'steps'


def _arrays(curve: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """One run's (times, values) in order of time; a repeated time keeps its last value."""
    c = curve.sort_values('train_s', kind='stable').drop_duplicates('train_s', keep='last')
    return c.train_s.to_numpy(float), c.value.to_numpy(float)


# ---------------------------------------------------------------------------------------- one run, one entry
def value_at_time(curve: pd.DataFrame, t: float) -> float:
    """The run's value at training time ``t``: linear between the two checks around it; nan before its first check
    or after its last (never extrapolated). ``curve``: one run's rows of ``curves()`` (``train_s``, ``value``)."""
    times, values = _arrays(curve)
    if not len(times) or not (times[0] <= t <= times[-1]):
        return math.nan
    return float(np.interp(t, times, values))


def time_to_target(curve: pd.DataFrame, target: float, higher_is_better: bool = True) -> float:
    """The first training time at which the run's curve reaches ``target`` (>= it, or <= for a lower-is-better
    metric), linear between the last check short of it and the first check at or past it; nan when no check reaches
    it. A first check already past the target gives that check's time (nothing is known before it)."""
    times, values = _arrays(curve)
    reached = values >= target if higher_is_better else values <= target
    if not reached.any():
        return math.nan
    i = int(np.argmax(reached))
    if i == 0:
        return float(times[0])
    t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
    return float(t0 + (target - v0) / (v1 - v0) * (t1 - t0))


def time_grid(curves_df: pd.DataFrame, n: int = 200) -> np.ndarray:
    """A common time grid for a group's curves: ``n`` even points from 0 to the latest check, plus every check's own
    time (so a mean over seeds is exact at each seed's checks)."""
    times = curves_df.train_s.to_numpy(float)
    if not len(times):
        return np.zeros(0)
    return np.unique(np.concatenate([np.linspace(0.0, times.max(), n), times]))


def entry_band(curves_of_entry_runs: pd.DataFrame, grid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, low, high) of one entry's runs on ``grid``: each run interpolated linearly inside its own span
    (first to last check), the mean over seeds and the band from the seeds' minimum to their maximum, at the grid
    points every run covers (nan elsewhere: never extrapolated, never a mean over a subset of seeds)."""
    grid = np.asarray(grid, float)
    per_run = []
    for _, curve in curves_of_entry_runs.groupby('run_id', sort=True):
        times, values = _arrays(curve)
        inside = (grid >= times[0]) & (grid <= times[-1])
        per_run.append(np.where(inside, np.interp(grid, times, values), np.nan))
    if not per_run:
        nan = np.full(grid.shape, np.nan)
        return grid, nan, nan.copy(), nan.copy()
    v = np.vstack(per_run)
    every = ~np.isnan(v).any(axis=0)
    mean, low, high = (np.full(grid.shape, np.nan) for _ in range(3))
    mean[every], low[every], high[every] = v[:, every].mean(0), v[:, every].min(0), v[:, every].max(0)
    return grid, mean, low, high


# --------------------------------------------------------------------------------------------------- a group
def default_target(finals: Mapping[str, Iterable[float]], higher_is_better: bool = True,
                   fraction: float = TARGET_FRACTION) -> float:
    """The group's target from each entry's final values over seeds: ``fraction`` (95 %) of the best entry's mean
    final value, or for a lower-is-better metric the best plus ``1 - fraction`` of its magnitude."""
    means = [float(np.mean(v)) for v in map(list, finals.values()) if v]
    if not means:
        return math.nan
    best = max(means) if higher_is_better else min(means)
    return best - (1 - fraction) * abs(best) if higher_is_better else best + (1 - fraction) * abs(best)


def equal_time(curves_df: pd.DataFrame) -> float:
    """The default equal training time of a group: the training time of its shortest run (its last check), so every
    run of every entry is compared inside its measured span."""
    if curves_df.empty:
        return math.nan
    return float(curves_df.groupby('run_id').train_s.max().min())


def _median_time(times: list[float]) -> float:
    """Median over seeds, a seed that never reached the target (nan) counting as later than every one that did."""
    if not times:
        return math.nan
    m = float(np.median([math.inf if t != t else t for t in times]))
    return m if math.isfinite(m) else math.nan


def entry_summary(curves_df: pd.DataFrame, entries: Mapping[str, Iterable[int]], target: float, at_time: float,
                  higher_is_better: bool = True) -> pd.DataFrame:
    """Per entry (``entries``: name -> its run ids): ``seeds`` (runs with a curve), ``final`` (mean of each run's
    last check), ``train_s`` (mean of each run's training time at its last check), ``time_to_target`` (median over
    seeds; see ``_median_time``), ``reached`` (seeds that reached ``target``), ``value_at_time`` (mean over seeds of
    their value at ``at_time``; nan if any seed has none there) and ``seeds_at_time`` (seeds measured there)."""
    out = []
    for entry, ids in entries.items():
        ids = [int(i) for i in ids]
        runs = [curves_df[curves_df.run_id == i] for i in ids]
        runs = [c for c in runs if len(c)]
        finals = [float(c.sort_values('train_s').value.iloc[-1]) for c in runs]
        ends = [float(c.train_s.max()) for c in runs]
        ttt = [time_to_target(c, target, higher_is_better) for c in runs]
        at = [value_at_time(c, at_time) for c in runs]
        measured = [v for v in at if v == v]
        out.append({'entry': entry, 'seeds': len(runs),
                    'final': float(np.mean(finals)) if finals else math.nan,
                    'train_s': float(np.mean(ends)) if ends else math.nan,
                    'time_to_target': _median_time(ttt), 'reached': sum(t == t for t in ttt),
                    'value_at_time': float(np.mean(at)) if runs and len(measured) == len(runs) else math.nan,
                    'seeds_at_time': len(measured)})
    return pd.DataFrame(out, columns=['entry', 'seeds', 'final', 'train_s', 'time_to_target', 'reached',
                                      'value_at_time', 'seeds_at_time'])


def _num(v: float, fmt: str = '{:.4f}') -> str:
    return '' if v is None or v != v else fmt.format(v)


def curve_table(summary: pd.DataFrame, metric: str, target: float, at_time: float) -> list[dict]:
    """Rows of a markdown table from ``entry_summary``: entry, seeds, final value (mean), training s (mean, to the
    last check), time to the target (s, median over seeds; '—' when fewer than half the seeds reach it) with how
    many seeds reached it, value at the equal time (mean over seeds; 'no check yet' when no seed had been
    validated by then, 'k/n seeds measured' when only some had)."""
    rows = []
    for r in summary.itertuples():
        if r.seeds_at_time == r.seeds:
            at = _num(r.value_at_time)
        else:
            at = 'no check yet' if r.seeds_at_time == 0 else f'{r.seeds_at_time}/{r.seeds} seeds measured'
        rows.append({'entry': r.entry, 'seeds': str(r.seeds), f'final {metric}': _num(r.final),
                     'training s': _num(r.train_s, '{:.1f}'),
                     f's to {_num(target, "{:.4g}")}': _num(r.time_to_target, '{:.1f}') or '—',
                     'reached': f'{r.reached}/{r.seeds}', f'{metric} at {_num(at_time, "{:.1f}")} s': at})
    return rows


@dataclass
class GroupCurves:
    """Everything ``group_curves`` computes for one group (the report draws ``bands`` and prints ``table``)."""
    metric: str
    higher_is_better: bool
    curves: pd.DataFrame                 # curves(): one row per validation check
    target: float
    equal_time: float
    bands: dict = field(default_factory=dict)    # entry -> (grid, mean, low, high)
    summary: pd.DataFrame | None = None  # entry_summary()
    table: list = field(default_factory=list)    # curve_table()


def group_curves(store, entries: Mapping[str, Iterable[int]], metric: str, *, higher_is_better: bool | None = None,
                 target: float | None = None, at_time: float | None = None, grid_points: int = 200) -> GroupCurves:
    """The curves, bands, target, equal time, summary and table of one benchmark group. ``entries``: entry name ->
    its run ids (seeds); ``higher_is_better`` defaults to the metric's known direction; ``target`` to
    ``default_target`` of the entries' final values; ``at_time`` to ``equal_time``."""
    entries = {str(k): [int(i) for i in v] for k, v in entries.items()}
    higher = is_higher_better(metric) if higher_is_better is None else bool(higher_is_better)
    df = curves(store, [i for ids in entries.values() for i in ids], metric)
    if df.empty:
        raise ResultsDBError(f'no validation check of {metric!r} in runs '
                             f'{sorted(i for ids in entries.values() for i in ids)}')
    last = df.sort_values('train_s').groupby('run_id').value.last()
    finals = {e: [float(last[i]) for i in ids if i in last.index] for e, ids in entries.items()}
    target = default_target(finals, higher) if target is None else float(target)
    at_time = equal_time(df) if at_time is None else float(at_time)
    grid = time_grid(df, grid_points)
    bands = {e: entry_band(df[df.run_id.isin(ids)], grid) for e, ids in entries.items()}
    summary = entry_summary(df, entries, target, at_time, higher)
    return GroupCurves(metric, higher, df, target, at_time, bands, summary, curve_table(summary, metric, target,
                                                                                        at_time))


# ------------------------------------------------------------------------------------------------------ plot
def plot_curves(bands: Mapping[str, tuple], path: str | os.PathLike | None, title: str, metric: str,
                target: float | None = None, *, equal_time: float | None = None):
    """One figure: per entry its mean curve over seeds and the seeds' min..max band against training wall time;
    ``target`` as a dashed horizontal line, ``equal_time`` as a dotted vertical one. Saved to ``path`` when given
    (``render.save_figure``: an ``.svg`` is byte-identical for the same bands); returns the matplotlib Figure."""
    import matplotlib
    if path is not None:
        matplotlib.use('Agg', force=False)
    from matplotlib.figure import Figure

    from .render import save_figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    colours = matplotlib.colormaps['tab10' if len(bands) <= 10 else 'tab20']
    drawn = False
    for k, (entry, (grid, mean, low, high)) in enumerate(bands.items()):
        grid, mean = np.asarray(grid, float), np.asarray(mean, float)
        colour = colours(k % colours.N)
        if np.isfinite(mean).any():
            ax.plot(grid, mean, color=colour, lw=1.5, label=entry)
            ax.fill_between(grid, np.asarray(low, float), np.asarray(high, float), color=colour, alpha=0.18, lw=0)
            drawn = True
    if target is not None and target == target:
        ax.axhline(target, color='0.25', ls='--', lw=1, label=f'target {target:.4g}')
    if equal_time is not None and equal_time == equal_time:
        ax.axvline(equal_time, color='0.45', ls=':', lw=1, label=f'equal time {equal_time:.1f} s')
    if not drawn:
        ax.text(0.5, 0.5, 'no entry has a validation curve', ha='center', va='center', transform=ax.transAxes)
    ax.set_xlabel('training wall time (s, validation excluded)')
    ax.set_ylabel(f'{metric} (mean over seeds; band: min..max)')
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc='best', fontsize=7)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    return fig
