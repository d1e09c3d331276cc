"""``zoo bench``: parameters, MACs and CPU latency of models, optionally against a reference, and the
re-measurement of every model recorded in a results database.

Every latency is taken with the controlled protocol of ``zoo.eval.profile`` (warm-up, at least
``--repeats`` timed calls and more while the ``--time`` budget lasts, median and IQR, the load average
before and after), so the rows ``--db`` writes are the ones the leaderboard trusts most.

With ``--vs timm/<name>`` the zoo model and the reference run in one process, interleaved, and
the table gives the throughput ratio. When the zoo model declares a timm equivalent, the
reference's weights are loaded into it first and the largest logit difference is reported, so
the speed comparison is between models that compute the same function.

``zoo bench --db URL`` without model names re-measures the networks of that database's leaderboard (every
distinct architecture among its finished runs, optionally filtered by ``--task/--dataset/--model``), each
rebuilt from its run's recorded model arguments at the input shape it was trained at, interleaved in one
process, and writes the rows (``source='bench'``): one command to refresh latency on a quiet machine.
"""
from __future__ import annotations

import sys

import torch

import zoo

from .profile import (BUDGET_S, MAX_REPEATS, MIN_REPEATS, WARMUP, WARMUP_S, Latency, benchmark, count_macs,
                      count_params, example_input, fingerprint)


# ------------------------------------------------------------------------------------------ reference (--vs)
def _build(name: str, vs: str | None, num_classes: int | None):
    """Build ``name``; when it has a timm equivalent equal to ``vs``, build it in that form."""
    kwargs = {'num_classes': num_classes}
    if vs and not name.startswith('timm/'):
        eq = zoo.model_info(name).timm_equivalent
        if eq and vs == f'timm/{eq[0]}':
            kwargs.update(eq[1])
    return zoo.create(name, **kwargs).eval()


def _reference(vs: str, model, num_classes: int | None):
    """The ``--vs`` model: a zoo/timm name, or ``official:SOURCE[:CALLABLE]`` (eval/official.py)."""
    if vs.startswith('official:'):  # the user's copy of the official code, with ``model``'s weights
        from .official import build_official
        return build_official(vs, model)
    return _build(vs, None, num_classes)


def max_logit_diff(model, reference, input_size, task: str | None = None) -> float | None:
    """Copy the reference's weights into ``model`` (through its key mapping) and compare outputs."""
    try:
        zoo.load_checkpoint(model, reference.state_dict())
    except ValueError:  # not the same network
        return None
    x = example_input(model, input_size, 2, task, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return (model(x) - reference(x)).abs().max().item()


# ------------------------------------------------------------------------------------------ named models
def task_of(name: str) -> str | None:
    return None if name.startswith('timm/') else zoo.model_info(name).task


def input_size_of(name: str, img_size: int | None) -> tuple:
    """One sample's shape: (C, H, W) for image models (``img_size`` overrides H and W), (T,) for a language
    model (its registered context length; ``img_size`` is not used)."""
    if name.startswith('timm/'):
        size = (3, 224, 224)
    else:
        size = zoo.model_info(name).input_size
    if len(size) != 3:
        return tuple(size)
    return (size[0], img_size, img_size) if img_size else tuple(size)


def _timing(repeats: int, warmup: int, budget_s: float | None, max_repeats: int | None) -> dict:
    """The ``benchmark`` keywords of the controlled protocol (``budget_s=0``: exactly ``repeats`` calls)."""
    return dict(repeats=repeats, warmup=warmup, budget_s=budget_s or None,
                max_repeats=max_repeats if max_repeats is not None else MAX_REPEATS,
                warmup_s=WARMUP_S if budget_s else 0.0)


def run(names: list[str], vs: str | None = None, batch_sizes=(1,), img_size: int | None = None,
        repeats: int = MIN_REPEATS, warmup: int = WARMUP, threads: int | None = None, dtype: str = 'float32',
        mode: str = 'inference', num_classes: int | None = None, budget_s: float | None = BUDGET_S,
        max_repeats: int | None = None) -> list[dict]:
    """Benchmark each model (and the reference) at each batch size; one dict per (model, batch)."""
    rows = []
    for name in names:
        models = {name: _build(name, vs, num_classes)}
        if vs:
            models[vs] = _reference(vs, models[name], num_classes)
        size, task = input_size_of(name, img_size), task_of(name)
        diff = max_logit_diff(models[name], models[vs], size, task) if vs else None
        static = {n: {**count_params(m), 'arch_fingerprint': fingerprint(m),
                      'macs': count_macs(m, example=example_input(m, size, 1, task))} for n, m in models.items()}
        for bs in batch_sizes:
            inputs = {n: example_input(m, size, bs, task) for n, m in models.items()}
            lat: dict[str, Latency] = benchmark(models, input_size=size, batch_size=bs, threads=threads, dtype=dtype,
                                                mode=mode, inputs=inputs,
                                                **_timing(repeats, warmup, budget_s * len(models) if budget_s else None,
                                                          max_repeats))
            for n, res in lat.items():
                row = {**static[n], **res.as_dict(), 'source': 'bench'}
                if vs and n == name:
                    row['vs'] = vs
                    row['speedup'] = res.throughput / lat[vs].throughput
                    row['max_abs_diff'] = diff
                rows.append(row)
    return rows


# ------------------------------------------------------------------------------- re-measure a results database
def recorded_networks(db, task: str | None = None, dataset: str | None = None, model: str | None = None,
                      warn=None, run_ids=None) -> list[dict]:
    """The distinct networks of a database's finished runs (one per architecture fingerprint, or per model
    name for runs without one): ``{'name', 'label', 'model', 'input_size', 'task', 'fingerprint'}``, each
    rebuilt from the newest run's recorded network spec (``hparams['network']``: the registered name, the
    arguments ``zoo.create`` built it with and one sample's input size, which every zoo system records) and
    checked against the recorded fingerprint; a run without a spec, or whose network cannot be rebuilt exactly,
    is skipped with a line to ``warn``. ``run_ids``: only these runs (``zoo benchmark run`` measures its own)."""
    from .results import open_db

    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    store = open_db(db, create=False)
    runs = store.runs(model=model, task=task, dataset=dataset, status='finished')
    if run_ids is not None:
        runs = runs[runs.id.isin(list(run_ids))]
    out, seen = [], set()
    for _, r in runs.sort_values('id', ascending=False).iterrows():
        fp = r.arch_fingerprint if isinstance(r.arch_fingerprint, str) else None
        key = fp or f'name:{r.model}'
        if key in seen:
            continue
        seen.add(key)
        spec = (r.hparams if isinstance(r.hparams, dict) else {}).get('network')
        if not isinstance(spec, dict) or not spec.get('name'):
            warn(f'zoo bench: skipped {r.model} (run {r.id}): it recorded no network spec (a run of a system that '
                 f'is not a zoo ZooSystem, or recorded before they did)')
            continue
        kwargs = dict(spec.get('kwargs') or {})
        try:
            net = zoo.create(spec['name'], **kwargs).eval()
        except (KeyError, ValueError, TypeError) as e:
            warn(f'zoo bench: skipped {r.model} (run {r.id}): cannot rebuild it: {e}')
            continue
        if fp and fingerprint(net) != fp:
            warn(f'zoo bench: skipped {r.model} (run {r.id}): rebuilt from its recorded spec it is not the recorded '
                 f'network (fingerprint {fingerprint(net)} != {fp})')
            continue
        size = tuple(spec.get('input_size') or input_size_of(spec['name'], None))
        shown = {k: v for k, v in kwargs.items() if k not in ('num_classes', 'in_chans', 'img_size', 'vocab_size')}
        label = r.model + (f' ({", ".join(f"{k}={v}" for k, v in sorted(shown.items()))})' if shown else '')
        out.append(dict(name=r.model, label=label, model=net, input_size=size, task=r.task, fingerprint=fp))
    return out


def remeasure(db, task: str | None = None, dataset: str | None = None, model: str | None = None,
              repeats: int = MIN_REPEATS, warmup: int = WARMUP, threads: int | None = None,
              budget_s: float | None = BUDGET_S, max_repeats: int | None = None, warn=None, run_ids=None,
              batch_sizes=(1,)) -> list[dict]:
    """Measure every network ``recorded_networks`` finds, interleaved in one process (each gets
    ``budget_s`` seconds of the shared budget), at each of ``batch_sizes`` (default batch 1); one row per network
    and batch size, ready for ``record``."""
    nets = recorded_networks(db, task, dataset, model, warn, run_ids)
    if not nets:
        raise ValueError('no finished run in the database matches'
                         + ''.join(f' {k}={v!r}' for k, v in (('task', task), ('dataset', dataset), ('model', model))
                                   if v) + '; nothing to measure')
    models = {n['label']: n['model'] for n in nets}
    one = {n['label']: example_input(n['model'], n['input_size'], 1, n['task']) for n in nets}
    macs = {n['label']: count_macs(n['model'], example=one[n['label']]) for n in nets}
    rows = []
    for bs in batch_sizes:
        inputs = {n['label']: example_input(n['model'], n['input_size'], bs, n['task']) for n in nets}
        lat = benchmark(models, inputs=inputs, threads=threads, batch_size=bs,
                        **_timing(repeats, warmup, budget_s * len(nets) if budget_s else None, max_repeats))
        for n in nets:
            res = lat[n['label']].as_dict()
            res['model'] = n['name']
            rows.append({**count_params(n['model']), **res, 'label': n['label'], 'source': 'bench',
                         'arch_fingerprint': fingerprint(n['model']), 'macs': macs[n['label']]})
    return rows


# ------------------------------------------------------------------------------------------ output
def record(rows: list[dict], db=None) -> int:
    """Write ``run()``'s rows to the results database (one latency row each); returns how many."""
    from .results import open_db

    store = open_db(db)
    for r in rows:
        store.add_latency_record(r)
    return len(rows)


def print_table(rows: list[dict]) -> None:
    from zoo._console import console
    from rich.table import Table

    r0 = rows[0] if rows else {}
    load = f", load {r0['load_1m']:.2f} on {r0['cpus']} CPUs before" if r0.get('load_1m') is not None else ''
    table = Table(title=f'zoo bench (CPU, median and IQR over repeats, models interleaved{load})')
    for col in ('model', 'input', 'params (M)', 'MACs (G)', 'batch', 'threads', 'repeats', 'median ms', 'IQR ms',
                'samples/s', 'speedup', 'max |Δ| logits'):
        table.add_column(col, justify='left' if col == 'model' else 'right')
    for r in rows:
        table.add_row(r.get('label', r['model']), 'x'.join(map(str, r['input_size'])), f"{r['params'] / 1e6:.2f}",
                      '' if r['macs'] is None else f"{r['macs'] / 1e9:.3f}", str(r['batch_size']), str(r['threads']),
                      str(r['repeats']), f"{r['median_ms']:.2f}", f"{r['iqr_ms']:.2f}", f"{r['throughput']:.1f}",
                      f"{r['speedup']:.2f}x" if 'speedup' in r else '',
                      '' if r.get('max_abs_diff') is None else f"{r['max_abs_diff']:.1e}")
    console().print(table)
