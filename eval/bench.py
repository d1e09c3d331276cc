"""``zoo bench``: parameters, MACs and CPU latency of models, optionally against a reference.

With ``--vs timm/<name>`` the zoo model and the reference run in one process, interleaved, and
the table gives the throughput ratio. When the zoo model declares a timm equivalent, the
reference's weights are loaded into it first and the largest logit difference is reported, so
the speed comparison is between models that compute the same function.
"""
from __future__ import annotations

import torch

import zoo

from .profile import Latency, benchmark, count_macs, count_params, fingerprint


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


def input_size_of(name: str, img_size: int | None) -> tuple:
    if name.startswith('timm/'):
        size = (3, 224, 224)
    else:
        size = zoo.model_info(name).input_size
    return (size[0], img_size, img_size) if img_size else tuple(size)


def max_logit_diff(model, reference, input_size) -> float | None:
    """Copy the reference's weights into ``model`` (through its key mapping) and compare outputs."""
    try:
        zoo.load_checkpoint(model, reference.state_dict())
    except ValueError:  # not the same network
        return None
    x = torch.randn(2, *input_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        return (model(x) - reference(x)).abs().max().item()


def run(names: list[str], vs: str | None = None, batch_sizes=(1,), img_size: int | None = None, repeats: int = 10,
        warmup: int = 3, threads: int | None = None, dtype: str = 'float32', mode: str = 'inference',
        num_classes: int | None = None) -> list[dict]:
    """Benchmark each model (and the reference) at each batch size; one dict per (model, batch)."""
    rows = []
    for name in names:
        models = {name: _build(name, vs, num_classes)}
        if vs:
            models[vs] = _reference(vs, models[name], num_classes)
        size = input_size_of(name, img_size)
        diff = max_logit_diff(models[name], models[vs], size) if vs else None
        static = {n: {**count_params(m), 'macs': count_macs(m, size), 'arch_fingerprint': fingerprint(m)}
                  for n, m in models.items()}
        for bs in batch_sizes:
            lat: dict[str, Latency] = benchmark(models, input_size=size, batch_size=bs, warmup=warmup,
                                                repeats=repeats, threads=threads, dtype=dtype, mode=mode)
            for n, res in lat.items():
                row = {**static[n], **res.as_dict()}
                if vs and n == name:
                    row['vs'] = vs
                    row['speedup'] = res.throughput / lat[vs].throughput
                    row['max_abs_diff'] = diff
                rows.append(row)
    return rows


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

    table = Table(title='zoo bench (CPU, medians over repeats, models interleaved)')
    for col in ('model', 'params (M)', 'MACs (G)', 'batch', 'threads', 'median ms', 'IQR ms', 'img/s',
                'speedup', 'max |Δ| logits'):
        table.add_column(col, justify='left' if col == 'model' else 'right')
    for r in rows:
        table.add_row(r['model'], f"{r['params'] / 1e6:.2f}", f"{r['macs'] / 1e9:.3f}", str(r['batch_size']),
                      str(r['threads']), f"{r['median_ms']:.2f}", f"{r['iqr_ms']:.2f}", f"{r['throughput']:.1f}",
                      f"{r['speedup']:.2f}x" if 'speedup' in r else '',
                      '' if r.get('max_abs_diff') is None else f"{r['max_abs_diff']:.1e}")
    console().print(table)
