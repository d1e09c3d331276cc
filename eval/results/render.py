"""Rendering: leaderboard and aggregate tables (rich, csv, json, markdown) and the Pareto plot."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

from .schema import ResultsDBError

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
    rows = [{'model': r.model, 'model args': r.model_args, 'tasks': r.n_tasks, 'runs': r.n_runs, 'runs/task': r.runs_per_task,
             'IQM': f'{r.iqm:.4f}', f'IQM {pct} CI': ci(r.iqm_low, r.iqm_high), 'mean': f'{r.mean:.4f}',
             f'mean {pct} CI': ci(r.mean_low, r.mean_high), 'note': r.note} for r in agg.itertuples()]
    import pandas as pd
    if fmt == 'markdown':
        return pd.DataFrame(rows).to_markdown(index=False)
    tasks = agg.attrs.get('tasks') or []
    return _rich_table(f"{agg.attrs.get('metric')} over {len(tasks)} task(s): {', '.join(tasks)} "
                       f'(stratified bootstrap, Agarwal et al. 2021)', rows, left=('model', 'model args', 'note'))


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
    title += ('; 95% CI: Student-t over seeds, none below 3 seeds; latency: median and IQR of the most trusted '
              'record (results.pick_latency: zoo bench before after-training records, then the lowest load, the '
              'most repeats, the newest' + (f"; at {board.attrs['threads_asked']} thread(s) where recorded"
                                            if board.attrs.get('threads_asked') else '') + ')')
    if board.attrs.get('cpu'):
        title += f"; latency {board.attrs.get('runtime', 'eager')} on {board.attrs['cpu']}"
    return _rich_table(title, rows, left=('model', 'model args', 'dataset', 'budget', '95% CI (t)', 'latency from',
                                          'aliases'))


def _rich_table(title: str, rows: list[dict], left: tuple[str, ...]) -> str:
    """Rows (dicts with the same keys) as a rich table rendered to text; ``left`` columns left-aligned."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    cols = list(rows[0]) if rows else ['model']
    for c in cols:   # a row's identity is never broken over lines
        table.add_column(c, justify='left' if c in left else 'right', no_wrap=c in ('model', 'dataset'))
    for r in rows:
        table.add_row(*[str(r[c]) for c in cols])
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=False).print(table)
    return buf.getvalue()


def _display_rows(board) -> list[dict]:
    def num(v, f):
        return '' if v is None or v != v else f.format(v)
    metric = board.attrs.get('metric', 'metric')
    extra = list(board.attrs.get('board_columns') or [])   # the task's other metrics, shown after the CI
    rows = []
    for r, rec in zip(board.itertuples(), board.to_dict('records')):
        if r.ci_low is not None and r.ci_low == r.ci_low:
            ci = f'[{num(r.ci_low, "{:.4f}")}, {num(r.ci_high, "{:.4f}")}]'
        else:                          # too few seeds: the values themselves, and why there is no interval
            ci = f'{r.interval_note}: {r.values}' if r.n_seeds > 1 else f'{r.interval_note}'
        lat_from = ''
        if r.latency_ms is not None:
            load = '' if r.latency_load is None else f', load {r.latency_load:.2f}'
            lat_from = f'{r.latency_source}, {r.latency_threads} thr{load}'
        rows.append({'model': r.model, 'model args': r.model_args, 'dataset': r.dataset, 'budget': r.budget,
                     'steps': '' if r.steps is None else str(r.steps), 'seeds': r.n_seeds,
                     metric: num(r.mean, '{:.4f}'), '95% CI (t)': ci, **{c: num(rec.get(c), '{:.4f}') for c in extra},
                     'params (M)': num(None if r.params is None else r.params / 1e6, '{:.3f}'),
                     'MACs (M)': num(None if r.macs is None else r.macs / 1e6, '{:.1f}'),
                     'latency ms (bs 1)': num(r.latency_ms, '{:.2f}'), 'IQR ms': num(r.latency_iqr_ms, '{:.2f}'),
                     'latency from': lat_from, 'aliases': r.aliases})
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
    """Accuracy (or any metric) against batch-1 latency, one point per leaderboard row: vertical bar the 95 %
    Student-t interval over seeds (none below 3 seeds; the label then says n), horizontal bar the latency
    record's IQR. The Pareto front is drawn as a step line. Saves to ``path`` when given (an ``.svg`` is byte-identical
for the same board: fixed element ids, no date); returns the matplotlib Figure."""
    import matplotlib
    if path is not None:
        matplotlib.use('Agg', force=False)
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    metric = board.attrs.get('metric', 'metric')
    higher = board.attrs.get('higher_is_better', True)
    datasets = sorted(map(str, board.dataset.dropna().unique())) if 'dataset' in board else []
    if len(datasets) > 1:      # a Pareto front across datasets compares scores that do not compare
        raise ResultsDBError(f'the board holds {len(datasets)} datasets ({", ".join(datasets)}); plot one at a time: '
                             f'board[board.dataset == {datasets[0]!r}] (zoo results --plot draws one file per dataset)')
    b = board[board.latency_ms.notna()].reset_index(drop=True)
    fig = Figure(figsize=(7, 4.5)) if path is not None else plt.figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    if b.empty:
        ax.text(0.5, 0.5, 'no model has both a result and a latency', ha='center', va='center', transform=ax.transAxes)
    else:
        lat, mean = b.latency_ms.astype(float).to_numpy(), b['mean'].astype(float).to_numpy()
        lo = b.ci_low.astype(float).to_numpy()
        hi = b.ci_high.astype(float).to_numpy()
        iqr = b.latency_iqr_ms.astype(float).fillna(0).to_numpy()
        import numpy as np
        yerr = np.vstack([np.where(np.isnan(lo), 0, mean - lo), np.where(np.isnan(hi), 0, hi - mean)])
        xerr = np.vstack([iqr / 2, iqr / 2])          # the IQR's width, centred on the median
        front = pareto_front(lat, mean, higher)
        on = np.zeros(len(b), bool)
        on[front] = True
        ax.errorbar(lat[~on], mean[~on], xerr=xerr[:, ~on], yerr=yerr[:, ~on], fmt='o', color='0.55', capsize=3,
                    label='dominated')
        ax.errorbar(lat[on], mean[on], xerr=xerr[:, on], yerr=yerr[:, on], fmt='o', color='C3', capsize=3,
                    label='Pareto front')
        ax.step(lat[front], mean[front], where='post', color='C3', alpha=0.6)
        few = [(x, float(v)) for x, vals, n in zip(lat, b['values'], b.n_seeds) if 1 < n < 3
               for v in str(vals).split(', ')]
        if few:                 # no interval below 3 seeds: the seeds' own values instead
            ax.plot(*zip(*few), linestyle='none', marker='_', markersize=10, color='0.3', label='seed values (n < 3)')
        labels = [f'{m} ({a})' if a else m for m, a in zip(b.model, b.model_args)]
        for x, y, name, n in zip(lat, mean, labels, b.n_seeds):
            text = name if n >= 3 else f'{name}, n={n}'
            ax.annotate('\n'.join(textwrap.wrap(text, 34)), (x, y), textcoords='offset points', xytext=(4, 4),
                        fontsize=7)   # long model arguments wrap instead of running off the axes
        ax.margins(x=0.25, y=0.12)      # room for the labels
        for values, lims in ((lat, ax.set_xlim), (np.concatenate([mean, lo, hi]), ax.set_ylim)):
            values = values[np.isfinite(values)]
            if values.max() - values.min() < 1e-9 * max(1.0, abs(values.max())):  # one point: a readable range
                centre = float(values.max())
                half = 0.2 * abs(centre) if centre else 1.0
                lims(centre - half, centre + half)
        ax.legend(loc='best', fontsize=8)
    counts = sorted(set(board.latency_threads.dropna().astype(int))) if 'latency_threads' in board else []
    threads = counts[0] if len(counts) == 1 else None if counts else board.attrs.get('threads')
    where = f", {board.attrs.get('runtime', 'eager')}" + (f" on {board.attrs['cpu']}" if board.attrs.get('cpu') else '')
    threads_text = f', {threads} thread(s)' if threads else ', thread counts differ' if len(counts) > 1 else ''
    batch = board.attrs.get('batch_size', 1)
    ax.set_xlabel(f'CPU latency, batch {batch}{threads_text}{where} (ms; median, bar: IQR)')
    ax.set_ylabel(f"{metric} (mean over seeds; bar: {board.attrs.get('interval_label', '95 % t-interval, n ≥ 3')})")
    parts = [board.attrs.get('task'), board.attrs.get('dataset') or (datasets[0] if datasets else None)]
    ax.set_title(title or ' / '.join(p for p in parts if p) or 'accuracy vs latency')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    return fig


def save_figure(fig, path: str | os.PathLike) -> None:
    """Save a matplotlib figure to ``path`` (its format from the suffix) through a temporary file and a rename, so a
    failed save leaves the old file whole. An ``.svg`` is byte-identical for the same figure: fixed element ids
    (``svg.hashsalt``), glyphs as paths, no date."""
    import matplotlib

    path = Path(path)
    fmt = path.suffix.lstrip('.').lower() or 'png'
    tmp = path.with_name(f'.{path.name}.tmp')
    try:
        if fmt == 'svg':
            with matplotlib.rc_context({'svg.hashsalt': 'zoo', 'svg.fonttype': 'path'}):
                fig.savefig(tmp, format='svg', metadata={'Date': None})
        else:
            fig.savefig(tmp, format=fmt, dpi=150)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
