"""``zoo benchmark report NAME``: ``docs/benchmarks/<name>.md`` and ``docs/benchmarks/<name>/<group>.svg`` from the
benchmark's results database alone, byte-identical for the same database (no dates; seeded bootstrap; SVGs with
fixed ids and no date).

Per group: one table (entry, params, MACs, the group's metric as mean and 95 % interval over seeds, on the
arcsine scale for a metric bounded in [0, 1] so no end leaves the range, training time, latency median and IQR at
each batch size and runtime, the command that re-runs the row), the metric against the fastest runtime's latency
at the group's largest batch with the Pareto front (``results.plot_pareto``), and the metric against training
time (``results.curves``). Then the papers' claims, decided by ``benchmark_claims`` (paired by seed where the claim
says so, against the paper's effect or margin, Holm-adjusted across the page, "undertrained" where an entry's
curve has not converged), and the "across" tables on scores relative to a reference entry per group.
"""
from __future__ import annotations

import math
import shlex
from pathlib import Path

from .benchmark_spec import Benchmark, Claim, Group, override_args, with_override

COMPARE_TEXT = {'<': 'lower than', '>': 'higher than', '~': 'equal (within ±{margin:g}) to',
                '>=': 'not worse (by {margin:g}) than'}
BOUNDED = {'acc', 'acc1', 'acc5', 'token_acc', 'miou', 'macc', 'aacc', 'map', 'map50', 'map75', 'ssim', 'ece',
           'ce'}  # in [0, 1]


def report_paths(bench: Benchmark, out: str | Path | None = None) -> tuple[Path, Path]:
    """``(<out>/<name>.md, <out>/<name>/)``; ``out`` defaults to ``docs/benchmarks`` below the working folder (never
    the installed checkout's, unless that is where the user is)."""
    out = Path(out) if out is not None else Path('docs') / 'benchmarks'
    return out / f'{bench.name}.md', out / bench.name


def rerun_command(group: Group, entry: str, seeds=None) -> str:
    """The ``zoo fit`` command that re-runs a row: the group's recipe with its and the entry's overrides, at the
    seeds the row holds (``seeds``; the group's first seeds when none ran yet)."""
    over = {**group.overrides, **group.entries[entry]}
    if group.pretrained_from:
        over = with_override(over, group.pretrained_from['arg'],
                             f"<checkpoint of {group.pretrained_from['group']}/{group.pretrained_entry(entry)}>")
    seeds = ','.join(map(str, sorted(seeds) if seeds else group.seeds))
    return ' '.join(['zoo fit -c', group.recipe, *(shlex.quote(a) for a in override_args(over)), f'--seeds {seeds}'])


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


def interval(metric: str, values) -> tuple[float, float, float]:
    """Mean and 95 % interval of an entry's seeds: on the arcsine scale for a metric bounded in [0, 1]
    (``decide.bounded_interval``: no end outside the range), else Student's t. NaN ends below two values."""
    from zoo.eval.results import decide, t_interval

    mean, half = t_interval(values)
    if metric.rsplit('/', 1)[-1] in BOUNDED and all(0 <= v <= 1 for v in values):
        lo, hi = decide.bounded_interval(values)
        return mean, lo, hi
    return mean, mean - half, mean + half


def difference_ends(metric: str, v) -> tuple[float, float]:
    """The ends of a claim's interval of a - b as shown: for a metric bounded in [0, 1] a difference lies in
    [-1, 1], so a t-interval end beyond it (three seeds of a large spread) is shown at the bound. The verdict is the
    same either way: it compares the ends with 0, the paper's effect and the margin, all inside the range."""
    if metric.rsplit('/', 1)[-1] in BOUNDED:
        return max(v.low, -1.0), min(v.high, 1.0)
    return v.low, v.high


def latency_column(runtime: str, batch_size: int) -> str:
    return f'latency_{runtime}{"" if batch_size == 1 else f"_b{batch_size}"}_ms'


def _latency_cell(ok, runtime: str, batch_size: int) -> str:
    """'median (IQR)' in ms of the record ``results.data`` picked (``pick_latency``: trusted records only)."""
    col = latency_column(runtime, batch_size)
    med = _first(ok[col]) if col in ok.columns else None
    if med is None:
        return ''
    iqr_col = col[:-3] + '_iqr_ms'
    iqr = _first(ok[iqr_col]) if iqr_col in ok.columns else None
    return _num(med, '{:.2f}') + (f' ({iqr:.2f})' if iqr is not None else '')


def fastest(ok, runtimes, batch_size: int) -> tuple[float | None, float | None, str | None]:
    """(median, IQR, runtime) of the fastest runtime of a network at ``batch_size`` (the Pareto plot's axis: the
    latency a user would deploy, not batch-1 eager dispatch overhead)."""
    best = (None, None, None)
    for rt in runtimes:
        col = latency_column(rt, batch_size)
        med = _first(ok[col]) if col in ok.columns else None
        if med is not None and (best[0] is None or med < best[0]):
            iqr_col = col[:-3] + '_iqr_ms'
            best = (float(med), _first(ok[iqr_col]) if iqr_col in ok.columns else None, rt)
    return best


def group_table(group: Group, rows, failures=None) -> tuple[list[dict], object, list[str]]:
    """The rows of a group's table, the leaderboard-like frame ``plot_pareto`` draws, and one line per latency
    that failed (``failures``: ``ResultsDB.latency_failures()``) where no measurement exists: its cell says
    "failed"."""
    import pandas as pd

    lines, board, failed_latency = [], [], []
    plot_batch = max(group.batch_sizes)
    for entry in group.entries:
        mine = rows[rows.entry == entry]
        ok = mine[mine.status == 'finished']
        vals = _values(ok, group.metric)
        n = len(vals)
        mean, lo, hi = interval(group.metric, vals) if n else (math.nan, math.nan, math.nan)
        if n >= 2:
            shown = f'{mean:.4f} [{lo:.4f}, {hi:.4f}]'
        elif n:
            shown = f'{mean:.4f} (n=1)'
        else:
            shown = ''
        line = {'entry': entry, 'params (M)': _num(_first(ok.params) / 1e6 if _first(ok.params) else None, '{:.3f}'),
                'MACs (M)': _num(_first(ok.macs) / 1e6 if _first(ok.macs) else None, '{:.2f}'),
                f'{group.metric} (95 % CI)': shown, 'seeds': str(n),
                'train s': _num(ok.train_time_s.astype(float).mean() if len(ok) else None, '{:.1f}')}
        for rt in group.runtimes:
            for bs in group.batch_sizes:
                line[f'{rt} b{bs} ms (IQR)'] = cell = _latency_cell(ok, rt, bs)
                error = None if cell else _latency_failed(failures, ok.arch_fingerprint.dropna(), rt, bs)
                if error:
                    line[f'{rt} b{bs} ms (IQR)'] = 'failed'
                    failed_latency.append(f'- {entry}: {rt} at batch {bs} failed: {_cell(error)}')
        failed = mine[mine.status.isin(['failed', 'crashed'])]
        line['failed'] = str(len(failed.seed.unique())) if len(failed) else ''
        line['re-run'] = f'`{rerun_command(group, entry, {int(s) for s in ok.seed.dropna()})}`'
        lines.append(line)
        lat, iqr, rt = fastest(ok, group.runtimes, plot_batch)
        if n and lat is not None:
            board.append({'model': f'{entry} ({rt})', 'model_args': '', 'mean': mean,
                          'ci_low': lo if n >= 2 else None, 'ci_high': hi if n >= 2 else None,
                          'latency_ms': lat, 'latency_iqr_ms': iqr, 'n_seeds': n,
                          'values': ', '.join(f'{v:.4g}' for v in sorted(vals))})
    cols = ['model', 'model_args', 'mean', 'ci_low', 'ci_high', 'latency_ms', 'latency_iqr_ms', 'n_seeds', 'values']
    frame = pd.DataFrame(board, columns=cols)
    for c in ('mean', 'ci_low', 'ci_high', 'latency_ms', 'latency_iqr_ms'):
        frame[c] = frame[c].astype(float)
    frame.attrs['batch_size'] = plot_batch
    return lines, frame, failed_latency


def machines(rows) -> list[str]:
    """The CPUs a group's runs trained on and its latencies were taken on: a page may join groups run on
    different machines, and a training time or a latency means little without its CPU."""
    ok = rows[rows.status == 'finished']
    trained = sorted({str(c) for c in ok.train_cpu.dropna()}) if 'train_cpu' in ok else []
    timed = sorted({c for v in ok.latency_cpu.dropna() for c in str(v).split(', ')})
    if not trained and not timed:
        return []
    return [f'Trained on {"; ".join(trained) or "an unrecorded CPU"}; latency taken on '
            f'{"; ".join(timed) or "no CPU yet"}.', '']


def latency_checks(group: Group, rows) -> list[str]:
    """How the group's published latencies were taken: the highest 1-minute load per CPU and IQR/median among
    them, and per runtime the largest |output - eager output| (a fast runtime that is wrong must show)."""
    ok = rows[rows.status == 'finished']
    loads, ratios, deltas = [], [], {}
    for rt in group.runtimes:
        for bs in group.batch_sizes:
            col = latency_column(rt, bs)[:-3]
            for suffix, into in (('_load', loads), ('_delta', deltas.setdefault(rt, []))):
                if col + suffix in ok.columns:
                    into += [float(v) for v in ok[col + suffix].dropna()]
            if col + '_iqr_ms' in ok.columns and col + '_ms' in ok.columns:
                ratios += [float(i) / float(m) for i, m in zip(ok[col + '_iqr_ms'], ok[col + '_ms'])
                           if i == i and m == m and m]
    if not loads and not ratios:
        return []
    out = [f'Latency records: 1-minute load at most {max(loads):.2f} per CPU, IQR/median at most {max(ratios):.3f} '
           '(a record above 0.25 or 0.15 is re-taken, never published).' if loads and ratios else '']
    d = [f'{rt} {max(v):.2g}' for rt, v in deltas.items() if v and rt != 'eager']
    if d:
        out.append('Largest |output - eager output| on the timed input: ' + ', '.join(d) + '.')
    return [x for x in out if x]


def claims_table(results) -> list[dict]:
    """One row per claim of the page (``benchmark_claims.decide_claims``)."""
    out = []
    for r in results:
        c, g = r.claim, r.group
        row = {'group': g.name, 'paper': c.paper, 'claim (as the paper states it)': c.claim}
        if c.not_tested:
            out.append({**row, 'tested here': '', 'a vs b': '', 'difference a - b (95 % CI)': '', 'seeds': '',
                        'verdict': f'not tested: {c.not_tested}', 'Holm': '', 'seeds it would need': ''})
            continue
        v = r.raw
        target = (f"; paper's effect {c.effect:g}" if c.effect else '') + (f' ({c.note})' if c.note else '')
        tested = (f'{c.metric}: {c.entries[0]} {_compare_text(c)} {c.entries[1]}, '
                  f'{"paired by seed" if c.paired else "unpaired (Welch)"}{target}')
        measured = (f'{_num(r.mean_a)} vs {_num(r.mean_b)}' if r.n_a and r.n_b else 'no finished runs')
        low, high = difference_ends(c.metric, v)
        diff = (f'{_num(v.estimate)} [{_num(low)}, {_num(high)}]' if v.n >= 2 else '')
        verdict = (f'undertrained ({r.gate})' if r.gate else r.status if not (r.n_a and r.n_b) else
                   v.verdict + (f' ({v.why})' if v.why else ''))
        holm = '' if r.adjusted is None else r.adjusted.verdict
        out.append({**row, 'tested here': tested, 'a vs b': measured, 'difference a - b (95 % CI)': diff,
                    'seeds': f'{v.n} of {g.seed_cap()}' if c.paired else f'{r.n_a} / {r.n_b} of {g.seed_cap()}',
                    'verdict': verdict, 'Holm': holm,
                    'seeds it would need': '' if r.needed is None else f'~{r.needed}'})
    return out


def _compare_text(c: Claim) -> str:
    return COMPARE_TEXT[c.compare].format(margin=c.margin or 0)


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


def _latency_environment(store, df) -> str:
    """The ISA flags and library versions of the trusted latency records of this benchmark's networks (a figure
    means little without them: AMX, AVX-512 VNNI and the runtimes' versions move it)."""
    import json

    from zoo.eval.bench import trusted

    lat = store.latency()
    if lat.empty or 'arch_fingerprint' not in df.columns:
        return ''
    lat = trusted(lat[lat.arch_fingerprint.isin(set(df.arch_fingerprint.dropna())) & (lat.source == 'bench')])
    if lat is None or lat.empty:
        return ''
    isa, versions = set(), {}
    for flags, ver in zip(lat.isa, lat.versions):
        for v, into in ((flags, 'isa'), (ver, 'versions')):
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except ValueError:
                    continue
            if into == 'isa' and isinstance(v, list):
                isa |= set(map(str, v))
            elif into == 'versions' and isinstance(v, dict):
                for k, x in v.items():
                    versions.setdefault(str(k), set()).add(str(x))
    ver = '; '.join(f'{k} {", ".join(sorted(v))}' for k, v in sorted(versions.items()))
    return (f'ISA flags: {", ".join(sorted(isa)) or "not recorded"}. Versions: {ver or "not recorded"}.')


def across_table(bench: Benchmark, label: str, df) -> list[dict]:
    """Every entry's final metric relative to the reference entry's mean in each group (1.0 = the reference;
    ``decide.normalised``), so a dataset at 0.95 and one at 0.56 weigh alike; the mean over groups of the
    per-group means, and a percentile bootstrap of the pooled relative scores only from 5 values on."""
    import numpy as np

    from zoo.eval.results import decide

    from .benchmark_claims import by_seed

    spec = bench.across[label]
    names, ref = spec['groups'], spec['reference']
    metric = bench.groups[names[0]].metric
    scores = {n: {e: list(by_seed(df, n, e, metric).values()) for e in bench.groups[n].entries} for n in names}
    scores = {n: s for n, s in scores.items() if s.get(ref)}
    if not scores:
        return []
    rel = decide.normalised(scores, ref)
    entries = [e for e in bench.groups[names[0]].entries if all(e in rel[n] for n in rel)]
    out = []
    for e in entries:
        row = {'entry': e}
        means = []
        for n in rel:
            v = rel[n][e]
            row[f'{n} (x {ref})'] = f'{np.mean(v):.3f}' if len(v) else ''
            if len(v):
                means.append(float(np.mean(v)))
        pooled = np.concatenate([rel[n][e] for n in rel])
        row['mean over groups'] = f'{np.mean(means):.3f}' if means else ''
        if len(pooled) >= decide.MIN_BOOTSTRAP:
            lo, hi = decide.bootstrap_interval(pooled)
            row[f'95 % bootstrap ({len(pooled)} runs)'] = f'[{lo:.3f}, {hi:.3f}]'
        else:
            row[f'95 % bootstrap ({len(pooled)} runs)'] = f'fewer than {decide.MIN_BOOTSTRAP} runs'
        out.append(row)
    return sorted(out, key=lambda r: -float(r['mean over groups'] or 0) if _higher(metric)
                  else float(r['mean over groups'] or 0))


def write_report(bench: Benchmark, db: str, out: str | Path | None = None) -> Path:
    """Write the report of ``bench`` from database ``db``; returns the Markdown file's path."""
    from zoo.eval import results

    from .benchmark_claims import current, decide_claims

    md_path, fig_dir = report_paths(bench, out)
    fig_dir.mkdir(parents=True, exist_ok=True)
    store = results.open_db(db, create=False)
    every = results.data(db=store, status=None)
    df = current(bench, every, store)
    failures = store.latency_failures()
    lines = [f'# Benchmark: {bench.name}', '',
             f'Generated by `zoo benchmark report {bench.name}` from its results database; re-run the whole '
             f'benchmark with `zoo benchmark run {bench.name}` (only what the database lacks is run). '
             'Do not edit by hand.', '']
    if bench.description:
        lines += [bench.description.strip(), '']
    lines += [f'Latency: {_latency_conditions(df)}; a cell is the median and, in brackets, the IQR (ms). Metric: '
              'mean over seeds with its 95 % interval (arcsine scale for a metric in [0, 1], else Student\'s t). '
              'Training time: the sum of the training epochs\' wall time (validation excluded), mean over seeds.',
              '']
    env = _latency_environment(store, df)
    if env:
        lines += [env, '']
    claims = decide_claims(bench, df, store)
    fresh = current(bench.fresh_seeds(), every, store) if bench.recheck else None
    stable = stability_rows(bench, fresh, store, claims) if bench.recheck else []
    summary = stability_summary(bench, stable, claims) if stable else ''
    if claims:
        lines += ['## What the benchmark decides', '', SUMMARY_BEGIN, verdict_table(claims, df), '',
                  decided_summary(claims), *(['', summary] if summary else []), SUMMARY_END, '',
                  'One row per claim (details, Holm-adjusted verdicts and the seeds each took: "Claims of the '
                  'papers" below). Latency: each network\'s fastest runtime at batch 16, a over b; training time: '
                  'the mean over seeds, a over b.', '']
    lines += cost_lines(df, fresh, store)
    for g in bench.groups.values():
        rows = df[df.group == g.name]
        table, board, failed_latency = group_table(g, rows, failures)
        data = g.dataset or "the recipe's"
        seeds = (f'seeds {", ".join(map(str, g.seeds))}' if not g.max_seeds else
                 f'seeds 0-{len(g.seeds) - 1}, more (up to {g.max_seeds}) where a claim is still open')
        lines += [f'## {g.name}', '', f'{g.description.strip()}  ' if g.description else '',
                  f'Task {g.task}, data {data}, recipe `{g.recipe}` with '
                  f'{" ".join(f"`{a}`" for a in override_args(g.overrides)) or "no overrides"}; {seeds}; metric '
                  f'`{g.metric}`' + (f' (floor {g.floor:g}: learned nothing)' if g.floor is not None else '') + '.',
                  '', _md_table(table), '']
        lines += machines(rows)
        lines += latency_checks(g, rows)
        if lines[-1]:
            lines.append('')
        svg = fig_dir / f'{g.name}.svg'
        if board.empty:
            svg.unlink(missing_ok=True)
            lines += ['(no entry has both a finished run and a latency yet: no plot)', '']
        else:
            cpu = ', '.join(sorted({str(c) for c in rows.latency_cpu.dropna()}))
            board.attrs.update(metric=g.metric, higher_is_better=_higher(g.metric), task=g.task, dataset=g.dataset,
                               runtime='fastest runtime', cpu=cpu or None,
                               interval_label='95 % interval, arcsine scale' if g.metric.rsplit('/', 1)[-1] in BOUNDED
                               else '95 % t-interval')
            results.plot_pareto(board, svg, title=f'{bench.name} / {g.name}')
            lines += [f'![{g.metric} against the fastest runtime\'s latency at batch {board.attrs["batch_size"]}, '
                      f'Pareto front in red]({bench.name}/{g.name}.svg)', '']
        lines += _curves_section(bench, g, rows, store, fig_dir)
        errors = rows[rows.status.isin(['failed', 'crashed'])]
        for r in errors.sort_values(['entry', 'seed']).itertuples():
            first = str(r.error or '').strip().splitlines()
            lines.append(f'- {r.entry} seed {r.seed} {r.status}: {_cell(first[0] if first else "no error recorded")}')
        lines += failed_latency
        if len(errors) or failed_latency:
            lines.append('')
    if claims:
        lines += ['## Claims of the papers, measured here', '',
                  'Each claim compares two entries of its group on the interval of a - b at 95 % (paired by seed '
                  'where a seed fixes initialisation, data order and checkpoint; else Welch). Verdicts: **holds** '
                  '(the interval excludes 0 and not the paper\'s effect; for `~`, it lies inside ±margin: TOST; '
                  'for `>=`, above -margin); **smaller than claimed** (it excludes the paper\'s effect from below); '
                  '**does not hold** (it lies against the claim, or outside the margin); **inconclusive** '
                  '(otherwise); **undertrained** (an entry\'s validation curve still rose by more than the '
                  'interval\'s half-width, or a `~` / `>=` claim\'s margin when larger, both at its last check and '
                  'on the trend of its last 3 checks, or ended at its floor: more steps decide it, not a verdict; '
                  'the trend was added on 2026-12-06 after one fresh seed\'s wiggling plateau was called '
                  'undertrained, a more lenient rule chosen after seeing data). Holm: the verdict re-decided at Holm\'s step-down '
                  'error across every claim of this page. Seeds it would need: at the observed spread, for the '
                  'interval to reach a verdict (a claim still inconclusive at its cap).', '',
                  _md_table(claims_table(claims)), '']
    if stable:
        lines += stability_section(bench, stable)
    for label in bench.across:
        spec = bench.across[label]
        metric = bench.groups[spec['groups'][0]].metric
        lines += [f'## Across {label}: {", ".join(spec["groups"])}', '',
                  f'`{metric}` of every entry relative to `{spec["reference"]}`\'s mean in each group (1.0 = the '
                  'reference), so groups at different levels weigh alike.', '',
                  _md_table(across_table(bench, label, df)), '']
    text = '\n'.join(lines).rstrip() + '\n'
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    for old in fig_dir.glob('*.svg'):       # the figures of groups the file no longer has
        if f']({bench.name}/{old.name})' not in text:
            old.unlink()
    return md_path


def cost_lines(df, fresh, store) -> list[str]:
    """What the page cost, from the database: the recorded wall time of every run it counts (main seeds and the
    fresh-seed re-check, failed runs included) and of every latency timing of its networks (retries included).
    The issue's budget is 4 hours of the 2-core CPU; wall time taken while the machine was busy counts as taken."""
    import pandas as pd

    from zoo.eval.bench import trusted

    runs = [d for d in (df, fresh) if d is not None and len(d)]
    if not runs:
        return []
    train = [float(pd.to_numeric(d.wall_s, errors='coerce').fillna(0).sum()) for d in runs]
    fps = set().union(*(set(d.arch_fingerprint.dropna()) for d in runs))
    lat = store.latency()
    lat = lat[lat.arch_fingerprint.isin(fps) & (lat.source == 'bench')] if not lat.empty else lat
    timing = float(lat.duration_s.fillna(0).sum()) if not lat.empty else 0.0
    published = trusted(lat) if not lat.empty else lat
    cpus = sorted({str(c) for d in runs for c in d.get('train_cpu', pd.Series(dtype=object)).dropna()})
    total = sum(train) + timing
    parts = [f'training {train[0] / 3600:.2f} h ({len(runs[0])} runs)']
    if len(runs) > 1:
        parts.append(f'the fresh-seed re-check {train[1] / 3600:.2f} h ({len(runs[1])} runs)')
    parts.append(f'latency {timing / 60:.0f} min ({len(lat)} timings, {len(published)} of them quiet enough to '
                 'publish)')
    return [f'Cost of this page, from the database: {total / 3600:.2f} h of wall time on a 2-core CPU '
            f'({"; ".join(cpus) or "CPU not recorded"}): {", ".join(parts)}. Wall time as recorded, including runs '
            'trained while the machine was busy; the time to build and export a network for timing is not counted.',
            '']


def stability_rows(bench: Benchmark, fresh_df, store, claims) -> list[dict]:
    """The ``recheck`` groups' claims decided again on fresh seeds (``zoo benchmark run NAME --fresh-seeds``;
    ``fresh_df``: their runs, ``current(bench.fresh_seeds(), ...)``) beside the main verdicts, one row per claim: a
    decision someone else can re-run gives the same verdict on other seeds."""
    from .benchmark_claims import decide_claims

    decided = decide_claims(bench.fresh_seeds(), fresh_df, store)
    again = {(r.group.name, r.claim.claim): r for r in decided}
    k = bench.recheck['seeds_from']
    rows = []
    for r in claims:
        other = again.get((r.group.name, r.claim.claim))
        if other is None or r.claim.not_tested:
            continue
        v2 = other.raw
        rows.append({'group': r.group.name, 'claim': r.claim.claim,
                     'seeds 0.. verdict': r.status, 'seeds 0.. difference': _diff(r),
                     f'seeds {k}.. verdict': other.status if other.n_a or other.n_b else 'not run yet',
                     f'seeds {k}.. difference': _diff(other) if v2 is not None else '',
                     'same': ('yes' if other.status == r.status else 'no') if other.n_a and other.n_b else ''})
    return rows


def stability_section(bench: Benchmark, rows: list[dict]) -> list[str]:
    k = bench.recheck['seeds_from']
    return [f'## The same claims on fresh seeds ({k}, {k + 1}, ...)', '',
            f'`zoo benchmark run {bench.name} --fresh-seeds` decides the claims of '
            f'{", ".join(bench.recheck["groups"])} again on seeds no verdict here has seen, by the same rule.', '',
            _md_table(rows), '']


def _decided(verdict: str) -> bool:
    """holds / smaller than claimed / does not hold: a decision (not inconclusive, undertrained or untested)."""
    from zoo.eval.results import decide

    return verdict in (decide.HOLDS, decide.SMALLER, decide.FAILS)


def decided_summary(claims) -> str:
    """'N of M claims decided ...': the count the front page leads with, raw and Holm-adjusted."""
    tested = [r for r in claims if not r.claim.not_tested]
    raw = sum(_decided(r.status) for r in tested)
    holm = sum(r.adjusted is not None and _decided(r.adjusted.verdict) for r in tested)
    return (f'Decided: {raw} of the {len(claims)} claims ({holm} after Holm\'s correction across the page); '
            f'{len(claims) - len(tested)} not testable on a CPU, {len(tested) - raw} still open or undertrained.')


def stability_summary(bench: Benchmark, rows: list[dict], claims) -> str:
    """One sentence for the front page: how many decided claims the fresh seeds decided the same way, and what the
    others gave (the table is the page's last section)."""
    ran = [r for r in rows if r['same'] and _decided(r['seeds 0.. verdict'])]
    if not ran:
        return ''
    k = bench.recheck['seeds_from']
    same = [r for r in ran if r['same'] == 'yes']
    titles = {c.claim.claim: c.claim.title or c.claim.claim for c in claims}
    other = [f'{titles[r["claim"]]}: {r["seeds 0.. verdict"]}, then {r[f"seeds {k}.. verdict"]}'
             for r in ran if r['same'] != 'yes']
    return (f'Re-decided on fresh seeds ({k}, {k + 1}, ...): {len(same)} of the {len(ran)} decided claims re-run '
            f'gave the same verdict' + (f' ({"; ".join(titles[r["claim"]] for r in same)})' if same else '')
            + (f'; not the same: {"; ".join(other)}' if other else '') + '.')


SUMMARY_BEGIN, SUMMARY_END = '<!-- verdicts: begin -->', '<!-- verdicts: end -->'


def verdict_table(claims, df) -> str:
    """The decided results as one short Markdown table: which entry wins, by how much (the interval of a - b), at
    what latency and training-time cost (a over b); what the README's front page shows (between SUMMARY_BEGIN and
    SUMMARY_END, checked by the tests against the committed database)."""
    rows = []
    for r in claims:
        c, g = r.claim, r.group
        if c.not_tested:
            rows.append({'claim (paper)': _title(c), 'a vs b': '', 'verdict':
                         'not tested on a CPU', 'a - b (95 % CI)': '', 'latency a/b': '', 'training time a/b': ''})
            continue
        ok = df[(df.group == g.name) & (df.status == 'finished')]
        lat, train = [], []
        for e in c.entries:
            mine = ok[ok.entry == e]
            lat.append(fastest(mine, g.runtimes, max(g.batch_sizes))[0])
            train.append(float(mine.train_time_s.astype(float).mean()) if len(mine) else None)
        ratio = (lambda x: '' if None in x or not x[1] or x[0] != x[0] or x[1] != x[1] else f'{x[0] / x[1]:.2f}x')
        v = r.raw
        rows.append({'claim (paper)': _title(c),
                     'a vs b': f'{c.entries[0]} {c.compare} {c.entries[1]}',
                     'verdict': r.status if r.adjusted is None or r.adjusted.verdict == r.status
                     else f'{r.status} (Holm: {r.adjusted.verdict})',
                     'a - b (95 % CI)': '' if v is None or v.n < 2 else
                     '{:+.4g} [{:+.4g}, {:+.4g}] {}, n={}'.format(v.estimate, *difference_ends(c.metric, v), c.metric,
                                                                   v.n),
                     'latency a/b': ratio(lat), 'training time a/b': ratio(train)})
    return _md_table(rows)


def _title(c: Claim) -> str:
    """'title (first author)' for the front page's table."""
    who = c.paper.split(',')[0].strip()
    return f'{c.title or c.claim} ({who})' if who else (c.title or c.claim)


def _diff(r) -> str:
    v = r.raw
    if v is None or v.n < 2:
        return ''
    low, high = difference_ends(r.claim.metric, v)
    return f'{_num(v.estimate)} [{_num(low)}, {_num(high)}] (n={v.n})'


def _curves_section(bench: Benchmark, g: Group, rows, store, fig_dir: Path) -> list[str]:
    """The metric against training wall time per entry (``results.curves``: mean and the seeds' min..max band),
    the time each entry needs to reach the group's target and its value at equal training time."""
    from zoo.eval.results import ResultsDBError, curves

    from .benchmark_claims import run_ids

    entries = {e: run_ids(rows, g.name, e) for e in g.entries}
    entries = {e: ids for e, ids in entries.items() if ids}
    svg = fig_dir / f'{g.name}_time.svg'
    try:
        gc = curves.group_curves(store, entries, g.metric, higher_is_better=_higher(g.metric)) if entries else None
    except ResultsDBError:
        gc = None
    if gc is None:
        svg.unlink(missing_ok=True)
        return []
    curves.plot_curves(gc.bands, svg, f'{bench.name} / {g.name}: {g.metric} against training time', g.metric,
                       target=gc.target, equal_time=gc.equal_time)
    return [f'![{g.metric} against training wall time, mean and min..max band over seeds]'
            f'({bench.name}/{g.name}_time.svg)', '', _md_table(gc.table), '']


def _higher(metric: str) -> bool:
    from zoo.eval.results import ResultsDBError, is_higher_better
    try:
        return is_higher_better(metric)
    except ResultsDBError:
        return True
