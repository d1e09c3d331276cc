"""``zoo benchmark report NAME``: ``docs/benchmarks/<name>.md`` and ``docs/benchmarks/<name>/<group>.svg`` from the
benchmark's results database alone, byte-identical for the same database (no dates; seeded bootstrap; SVGs with
fixed ids and no date).

Per group: one table (entry, params, MACs, the group's metric as mean and Student-t 95 % interval over seeds,
training time, latency at each batch size and runtime, the command that re-runs the row) and metric against
batch-1 latency with the Pareto front (``results.plot_pareto``). Then the papers' claims, each with zoo's
measurement: the Welch 95 % interval of the difference of the two entries' means (unequal variances; scipy)
decides whether the claim holds here, does not hold, or is inconclusive (``claim_verdict``). Across groups
(``across:`` in the file): IQM and mean with stratified-bootstrap intervals (``results.aggregate``).
"""
from __future__ import annotations

import math
import shlex
from pathlib import Path

from .benchmark_spec import Benchmark, Claim, Group, override_args

HOLDS, FAILS, INCONCLUSIVE = 'holds', 'does not hold', 'inconclusive'
COMPARE_TEXT = {'<': 'lower than', '>': 'higher than', '~': 'equal (within ±{tol:g}) to'}


def report_paths(bench: Benchmark, out: str | Path | None = None) -> tuple[Path, Path]:
    """``(<out>/<name>.md, <out>/<name>/)``; ``out`` defaults to ``docs/benchmarks`` below the working folder (never
    the installed checkout's, unless that is where the user is)."""
    out = Path(out) if out is not None else Path('docs') / 'benchmarks'
    return out / f'{bench.name}.md', out / bench.name


def rerun_command(group: Group, entry: str) -> str:
    """The ``zoo fit`` command that re-runs a row: the group's recipe with its and the entry's overrides."""
    over = {**group.overrides, **group.entries[entry]}
    if group.pretrained_from:
        over.setdefault(group.pretrained_from['arg'], '<checkpoint of '
                        f"{group.pretrained_from['group']}/{group.pretrained_from['entry']}>")
    seeds = ','.join(map(str, group.seeds))
    return ' '.join(['zoo fit -c', group.recipe, *(shlex.quote(a) for a in override_args(over)), f'--seeds {seeds}'])


def claim_verdict(a, b, compare: str, tolerance: float = 0.01, level: float = 0.95) -> dict:
    """Whether ``mean(a) <compare> mean(b)`` holds on these seeds: the Welch interval of ``mean(a) - mean(b)``.

    ``>``: holds when the interval lies above 0, does not hold when it lies below, else inconclusive; ``<``
    mirrored; ``~``: holds when the interval lies inside ±``tolerance``, does not hold when it lies outside it
    (an equivalence test by interval inclusion, TOST-like). Fewer than two values on a side: inconclusive."""
    import numpy as np
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    out = {'mean_a': float(a.mean()) if len(a) else math.nan, 'mean_b': float(b.mean()) if len(b) else math.nan,
           'n_a': len(a), 'n_b': len(b), 'diff': math.nan, 'low': math.nan, 'high': math.nan}
    if len(a) < 2 or len(b) < 2:
        return {**out, 'verdict': INCONCLUSIVE, 'why': 'fewer than two seeds on a side'}
    out['diff'] = out['mean_a'] - out['mean_b']
    if np.ptp(a) == 0 and np.ptp(b) == 0:     # no spread at all: the interval is the difference itself
        lo = hi = out['diff']
    else:
        lo, hi = stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)
    out['low'], out['high'] = float(lo), float(hi)
    if compare == '~':
        v = HOLDS if -tolerance <= lo and hi <= tolerance else FAILS if lo > tolerance or hi < -tolerance \
            else INCONCLUSIVE
    else:
        sign = 1 if compare == '>' else -1
        lo_s, hi_s = sorted((sign * lo, sign * hi))
        v = HOLDS if lo_s > 0 else FAILS if hi_s < 0 else INCONCLUSIVE
    return {**out, 'verdict': v, 'why': ''}


def _num(v, fmt: str = '{:.4f}') -> str:
    return '' if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _cell(text: str) -> str:
    return str(text).replace('|', '\\|').replace('\n', ' ')


def _first(series):
    s = series.dropna()
    return s.iloc[0] if len(s) else None


def _values(rows, column: str) -> list[float]:
    if column not in rows.columns:
        return []
    return [float(v) for v in rows[column].tolist() if v is not None and v == v]


def _latency_failed(failures, fingerprints, runtime: str, batch_size: int) -> str | None:
    """The first line of the recorded error of ``runtime`` at ``batch_size`` on any of these networks, if any."""
    if failures is None or failures.empty:
        return None
    hit = failures[failures.arch_fingerprint.isin(list(fingerprints)) & (failures.runtime == runtime)
                   & (failures.batch_size == batch_size)]
    return None if hit.empty else str(hit.error.iloc[-1]).strip().splitlines()[0]


def group_table(group: Group, rows, failures=None) -> tuple[list[dict], object, list[str]]:
    """The rows of a group's table, the leaderboard-like frame ``plot_pareto`` draws, and one line per latency
    that failed (``failures``: ``ResultsDB.latency_failures()``) where no measurement exists: its cell says
    "failed"."""
    import pandas as pd

    from zoo.eval.results import MIN_SEEDS_FOR_INTERVAL, t_interval

    lines, board, failed_latency = [], [], []
    for entry in group.entries:
        mine = rows[rows.entry == entry]
        ok = mine[mine.status == 'finished']
        vals = _values(ok, group.metric)
        n = len(vals)
        mean, half = t_interval(vals) if n else (math.nan, math.nan)
        if n >= MIN_SEEDS_FOR_INTERVAL:
            shown = f'{mean:.4f} [{mean - half:.4f}, {mean + half:.4f}]'
        elif n:
            shown = f'{mean:.4f} (n={n}: {", ".join(f"{v:.4f}" for v in sorted(vals))})'
        else:
            shown = ''
        line = {'entry': entry, 'params (M)': _num(_first(ok.params) / 1e6 if _first(ok.params) else None, '{:.3f}'),
                'MACs (M)': _num(_first(ok.macs) / 1e6 if _first(ok.macs) else None, '{:.2f}'),
                f'{group.metric} (95 % CI)': shown, 'seeds': f'{n}/{len(group.seeds)}',
                'train s': _num(ok.train_time_s.astype(float).mean() if len(ok) else None, '{:.1f}')}
        for rt in group.runtimes:
            for bs in group.batch_sizes:
                col = f'latency_{rt}{"" if bs == 1 else f"_b{bs}"}_ms'
                line[f'{rt} b{bs} ms'] = _num(_first(ok[col]) if col in ok.columns else None, '{:.2f}')
                error = None if line[f'{rt} b{bs} ms'] else _latency_failed(failures, ok.arch_fingerprint.dropna(),
                                                                           rt, bs)
                if error:
                    line[f'{rt} b{bs} ms'] = 'failed'
                    failed_latency.append(f'- {entry}: {rt} at batch {bs} failed: {_cell(error)}')
        failed = mine[mine.status.isin(['failed', 'crashed'])]
        line['failed'] = str(len(failed.seed.unique())) if len(failed) else ''
        line['re-run'] = f'`{rerun_command(group, entry)}`'
        lines.append(line)
        lat = _first(ok[f'latency_{group.runtimes[0]}_ms']) if f'latency_{group.runtimes[0]}_ms' in ok.columns else None
        if n and lat is not None:
            board.append({'model': entry, 'model_args': '', 'mean': mean,
                          'ci_low': mean - half if n >= MIN_SEEDS_FOR_INTERVAL else None,
                          'ci_high': mean + half if n >= MIN_SEEDS_FOR_INTERVAL else None,
                          'latency_ms': float(lat), 'latency_iqr_ms': None, 'n_seeds': n,
                          'values': ', '.join(f'{v:.4g}' for v in sorted(vals))})
    cols = ['model', 'model_args', 'mean', 'ci_low', 'ci_high', 'latency_ms', 'latency_iqr_ms', 'n_seeds', 'values']
    frame = pd.DataFrame(board, columns=cols)
    for c in ('mean', 'ci_low', 'ci_high', 'latency_ms', 'latency_iqr_ms'):
        frame[c] = frame[c].astype(float)
    return lines, frame, failed_latency


def claims_table(bench: Benchmark, df) -> list[dict]:
    out = []
    for g in bench.groups.values():
        rows = df[(df.group == g.name) & (df.status == 'finished')]
        for c in g.claims:
            a, b = (_values(rows[rows.entry == e], c.metric) for e in c.entries)
            v = claim_verdict(a, b, c.compare, c.tolerance)
            out.append({'group': g.name, 'paper': c.paper, 'claim': c.claim,
                        'tested': f'{c.metric}: {c.entries[0]} {_compare_text(c)} {c.entries[1]}',
                        'zoo measured': (f'{_num(v["mean_a"])} vs {_num(v["mean_b"])}; difference '
                                         f'{_num(v["diff"])} [{_num(v["low"])}, {_num(v["high"])}]'
                                         if v['n_a'] and v['n_b'] else 'no finished runs'),
                        'seeds': f'{v["n_a"]} / {v["n_b"]}',
                        'verdict': v['verdict'] + (f' ({v["why"]})' if v['why'] else '')})
    return out


def _compare_text(c: Claim) -> str:
    return COMPARE_TEXT[c.compare].format(tol=c.tolerance)


def _md_table(rows: list[dict]) -> str:
    if not rows:
        return '(nothing recorded yet)'
    cols = list(rows[0])
    head = '| ' + ' | '.join(cols) + ' |\n|' + '|'.join('---' for _ in cols) + '|\n'
    return head + '\n'.join('| ' + ' | '.join(_cell(r[c]) for c in cols) + ' |' for r in rows)


def _latency_conditions(df) -> str:
    """'CPU X, N thread(s)' of the benchmark's latency: the CPU and thread count of the records ``results.data``
    picked for its runs (``results.pick_latency``, the rule the leaderboard uses too)."""
    cpus = sorted({c for v in df.latency_cpu.dropna() for c in str(v).split(', ')})
    if not cpus:
        return 'no latency measured yet'
    threads = sorted({int(t) for v in df.latency_threads.dropna() for t in str(v).split(', ')})
    return (f'CPU: {"; ".join(cpus)}; {", ".join(map(str, threads))} thread(s); median of the controlled protocol '
            '(`zoo bench`, models interleaved in one process)')


def write_report(bench: Benchmark, db: str, out: str | Path | None = None) -> Path:
    """Write the report of ``bench`` from database ``db``; returns the Markdown file's path."""
    from zoo.eval import results

    md_path, fig_dir = report_paths(bench, out)
    fig_dir.mkdir(parents=True, exist_ok=True)
    store = results.open_db(db, create=False)
    df = results.data(db=store, status=None)
    df = df[df.benchmark == bench.name]
    failures = store.latency_failures()
    lines = [f'# Benchmark: {bench.name}', '',
             f'Generated by `zoo benchmark report {bench.name}` from its results database; re-run the whole '
             f'benchmark with `zoo benchmark run {bench.name}` (only what the database lacks is run). '
             'Do not edit by hand.', '']
    if bench.description:
        lines += [bench.description.strip(), '']
    lines += [f'Latency: {_latency_conditions(df)}. Metric: mean over seeds with the Student-t 95 % interval '
              '(from 3 seeds; fewer show their values). Training time: the sum of the training epochs\' wall time '
              '(validation excluded), mean over seeds.', '']
    for g in bench.groups.values():
        rows = df[df.group == g.name]
        table, board, failed_latency = group_table(g, rows, failures)
        data = g.dataset or "the recipe's"
        lines += [f'## {g.name}', '', f'{g.description.strip()}  ' if g.description else '',
                  f'Task {g.task}, data {data}, recipe `{g.recipe}` with '
                  f'{" ".join(f"`{a}`" for a in override_args(g.overrides)) or "no overrides"}; seeds '
                  f'{", ".join(map(str, g.seeds))}; metric `{g.metric}`.', '', _md_table(table), '']
        svg = fig_dir / f'{g.name}.svg'
        if board.empty:
            svg.unlink(missing_ok=True)
            lines += ['(no entry has both a finished run and a latency yet: no plot)', '']
        else:
            cpu = ', '.join(sorted({str(c) for c in rows.latency_cpu.dropna()}))
            board.attrs.update(metric=g.metric, higher_is_better=_higher(g.metric), task=g.task, dataset=g.dataset,
                               runtime=g.runtimes[0], cpu=cpu or None)
            results.plot_pareto(board, svg, title=f'{bench.name} / {g.name}')
            lines += [f'![{g.metric} against batch-1 {g.runtimes[0]} latency, Pareto front in red]'
                      f'({bench.name}/{g.name}.svg)', '']
        errors = rows[rows.status.isin(['failed', 'crashed'])]
        for r in errors.sort_values(['entry', 'seed']).itertuples():
            first = str(r.error or '').strip().splitlines()
            lines.append(f'- {r.entry} seed {r.seed} {r.status}: {_cell(first[0] if first else "no error recorded")}')
        lines += failed_latency
        if len(errors) or failed_latency:
            lines.append('')
    claims = claims_table(bench, df)
    if claims:
        lines += ['## Claims of the papers, measured here', '',
                  'Each claim compares two entries of its group; the verdict is decided by the Welch 95 % interval '
                  'of the difference of their means over seeds (holds: the interval lies on the claimed side, or '
                  'within the tolerance for `~`; does not hold: it lies on the other side or outside the '
                  'tolerance; else inconclusive). CPU scale: a few epochs on small data, not the papers\' setting.',
                  '', _md_table(claims), '']
    for label, names in bench.across.items():
        names = names if isinstance(names, list) else [names]
        ids = df[df.group.isin(names) & (df.status == 'finished')].run_id.tolist()
        metric = bench.groups[names[0]].metric
        runs = store.runs(status='finished')
        runs = runs[runs.id.isin(ids)]
        lines += [f'## Across {label}: {", ".join(names)}', '',
                  f'IQM and mean of `{metric}` over the groups\' datasets and seeds, with stratified-bootstrap 95 % '
                  'intervals (Agarwal et al. 2021; `zoo results --aggregate`).', '']
        if runs.empty or metric not in runs.columns:
            lines += ['(no finished runs yet)', '']
            continue
        agg = results.aggregate(metric, runs=runs, common=False)
        lines += [results.format_aggregate(agg, 'markdown'), '']
    text = '\n'.join(lines).rstrip() + '\n'
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    return md_path


def _higher(metric: str) -> bool:
    from zoo.eval.results import ResultsDBError, is_higher_better
    try:
        return is_higher_better(metric)
    except ResultsDBError:
        return True
