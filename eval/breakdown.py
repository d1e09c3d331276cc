"""``zoo profile NAME``: where a model's time and MACs go, per block kind (token mixer, channel mixer, norm,
stem, neck, head, ...), not only its total.

Every submodule whose class is registered in ``zoo.layers`` (or is the model's classifier, neck or dense head)
carries its kind; so do torch's own norms and activations, and family-specific modules by the attribute name
or class name the families give them (``attn``/``mixing``/``ssm`` token mixers, ``mlp`` channel mixers,
``*embed``/``stem``, ``downsample``/``merging``; see ``NAME_KINDS``). A module's *own* share is what it does
outside the kind-carrying modules nested in it (a
``block`` keeps its residual adds and layer scale; its token mixer and channel mixer count for themselves),
so the kinds' shares add up to the whole model: time through forward pre/post hooks (inclusive wall time of
each call, minus that of its nested kind-carrying modules), MACs through ``FlopCounterMode``'s per-module
counts (the same counter as ``profile.count_macs``). Warm-up calls run with the hooks detached; the timed
calls are averaged. Hooks cost a few microseconds per module call, charged to the calling module's own share.

Only eager PyTorch runs module hooks: a compiled or exported graph has no modules left to time, so for
another runtime only its total is measured (interleaved with eager under the one timer).
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch import nn

from zoo.layers._torch_compat import BatchNormBase

OTHER = 'other'
# Unregistered family modules, by the last component of their path or their class name (first match wins).
NAME_KINDS = (('channel_mix', 'channel_mixer'), ('mlp', 'channel_mixer'), ('ffn', 'channel_mixer'),
              ('attn', 'token_mixer'), ('attention', 'token_mixer'), ('mixing', 'token_mixer'),
              ('mixer', 'token_mixer'), ('ssm', 'token_mixer'),
              ('word_to_sentence', 'token_mixer'),     # TNT: a patch's pixel tokens into its sentence token
              ('interaction', 'token_mixer'),          # PIIP: cross-branch attention
              ('embed', 'stem'), ('stem', 'stem'), ('downsample', 'downsample'), ('merging', 'downsample'),
              ('fpn', 'neck'), ('merge_branch', 'neck'),  # PIIP's pyramid for dense heads
              ('neck', 'neck'), ('head', 'head'))
_TORCH_KINDS = ((BatchNormBase, 'norm'), (nn.LayerNorm, 'norm'), (nn.GroupNorm, 'norm'),
                (nn.GELU, 'act'), (nn.ReLU, 'act'), (nn.SiLU, 'act'), (nn.Hardswish, 'act'))


def kind_map(model: nn.Module) -> dict[str, str]:
    """``{module path: kind}`` for every submodule that carries a block kind (``''``, the model, is never one)."""
    import zoo

    by_cls = {}
    for rec in zoo.layers.records():
        by_cls.setdefault(rec.cls, rec.kind)
    kinds = {}
    for path, m in model.named_modules():
        if not path:
            continue
        kind = next((by_cls[c] for c in type(m).__mro__ if c in by_cls), None)
        kind = kind or next((k for cls, k in _TORCH_KINDS if isinstance(m, cls)), None)
        parent, _, leaf = path.rpartition('.')
        if leaf.isdigit() and parent not in kinds:  # an entry of a list or Sequential without a kind: by its name
            leaf = parent.rpartition('.')[2]          # (Strip-MLP's ``merging.0``, PIIP's ``fpn1.0``)
        if kind is None and not leaf.isdigit() and not isinstance(m, (nn.Sequential, nn.ModuleList, nn.Identity)) \
                or kind is None and isinstance(m, nn.Sequential) and leaf in ('mlp', 'ffn'):
            names = f'{leaf}|{type(m).__name__.lower()}'
            kind = next((k for key, k in NAME_KINDS if key in names), None)
        if kind is not None:
            kinds[path] = kind
    prefix = getattr(model, 'classifier_prefix', None)    # a family's plain nn.Linear classifier is its head
    if isinstance(prefix, str) and prefix in dict(model.named_modules()):
        kinds.setdefault(prefix, 'head')
    for attr, kind in (('neck', 'neck'), ('head', 'dense_head')):
        if isinstance(getattr(model, attr, None), nn.Module) and hasattr(model, 'forward_raw'):
            kinds.setdefault(attr, kind)
    return kinds


def _owner(path: str, kinds: dict[str, str]) -> str:
    """The innermost kind-carrying module at or above ``path`` ('' for the model itself)."""
    while path:
        if path in kinds:
            return path
        path = path.rpartition('.')[0]
    return ''


def _own_shares(inclusive: dict[str, float], kinds: dict[str, str]) -> dict[str, float]:
    """Inclusive figures of the kind-carrying modules (and the model, '') -> their own shares, summed by kind."""
    own = dict(inclusive)
    for path, value in inclusive.items():
        if path:
            parent = _owner(path.rpartition('.')[0], kinds)
            own[parent] = own.get(parent, 0.0) - value
    out: dict[str, float] = defaultdict(float)
    for path, value in own.items():
        out[kinds.get(path, OTHER)] += value
    return dict(out)


def _macs_inclusive(model: nn.Module, x: torch.Tensor, kinds: dict[str, str]) -> dict[str, float]:
    from torch.utils.flop_counter import FlopCounterMode

    from .profile import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()
    root = type(model).__name__
    # Grad mode on, like count_macs: inference-only fused kernels (oneDNN conv+GELU) are invisible to the counter.
    with FlopCounterMode(display=False) as counter, torch.enable_grad():
        model(x)
    counts = counter.get_flop_counts()
    out = {'': counter.get_total_flops() / 2}
    for path in kinds:
        out[path] = sum(counts.get(f'{root}.{path}', {}).values()) / 2
    return out


def _time_inclusive(model: nn.Module, x: torch.Tensor, kinds: dict[str, str], repeats: int,
                    warmup: int) -> tuple[dict[str, float], dict[str, int]]:
    """Mean inclusive ms per forward of each kind-carrying module and of the whole model ('') (hooks attached
    only for the timed calls), and how many timed calls each module made."""
    modules = dict(model.named_modules())
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    starts: dict[str, list[float]] = defaultdict(list)

    def pre(path):
        def hook(_m, _a):
            starts[path].append(time.perf_counter())
        return hook

    def post(path):
        def hook(_m, _a, _o):
            totals[path] += time.perf_counter() - starts[path].pop()
            calls[path] += 1
        return hook

    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        handles = [h for path in kinds for h in (modules[path].register_forward_pre_hook(pre(path)),
                                                 modules[path].register_forward_hook(post(path)))]
        try:
            whole = 0.0
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(x)
                whole += time.perf_counter() - t0
        finally:
            for h in handles:
                h.remove()
    out = {path: 1000.0 * totals.get(path, 0.0) / repeats for path in kinds if path in totals}
    out[''] = 1000.0 * whole / repeats
    return out, dict(calls)


def profile_kinds(model: nn.Module, x: torch.Tensor, repeats: int = 10, warmup: int = 3) -> dict:
    """Time (ms per forward, eager) and MACs per block kind of ``model`` on input ``x``.

    Returns ``{'rows': [{'kind', 'modules', 'ms', 'ms_pct', 'macs', 'macs_pct'}, ...] (by time, largest first),
    'total_ms', 'total_macs'}``. A kind is listed when a module of it ran; ``other`` is what the model does outside
    every kind-carrying module (reshapes, residual adds of unregistered blocks, unregistered layers)."""
    model.eval()
    kinds = kind_map(model)
    ran, calls = _time_inclusive(model, x, kinds, repeats, warmup)
    total_ms = ran['']
    # One partition for both figures: the modules that ran in the timed (inference) forward. A module an
    # inference fast path bypasses (a fused MLP) is part of its caller's own share, its MACs too.
    kinds = {p: k for p, k in kinds.items() if p in ran}
    ms = _own_shares(ran, kinds)
    macs = _own_shares(_macs_inclusive(model, x, kinds), kinds)
    count = defaultdict(int)
    for k in kinds.values():
        count[k] += 1
    total_macs = sum(macs.values())
    rows = [{'kind': k, 'modules': count.get(k, 0), 'ms': v, 'ms_pct': 100.0 * v / total_ms if total_ms else 0.0,
             'macs': int(round(macs.get(k, 0.0))),
             'macs_pct': 100.0 * macs.get(k, 0.0) / total_macs if total_macs else 0.0}
            for k, v in sorted(ms.items(), key=lambda kv: -kv[1]) if k != OTHER or v > 0 or macs.get(k)]
    return {'rows': rows, 'total_ms': total_ms, 'total_macs': int(round(total_macs)), 'repeats': repeats,
            'calls': calls}


def print_table(name: str, result: dict, input_shape, runtimes: dict | None = None) -> None:
    """The per-kind table (rich), with each other runtime's total below it."""
    from rich.table import Table

    from zoo._console import console

    from .profile import machine

    table = Table(title=f'zoo profile {name} ({"x".join(map(str, input_shape))}, eager, '
                        f'{torch.get_num_threads()} threads, {machine()["cpu_model"]})')
    for col in ('block kind', 'modules', 'ms', '% time', 'MMACs', '% MACs'):
        table.add_column(col, justify='left' if col == 'block kind' else 'right')
    for r in result['rows']:
        table.add_row(r['kind'], str(r['modules']), f"{r['ms']:.3f}", f"{r['ms_pct']:.1f}",
                      f"{r['macs'] / 1e6:.2f}", f"{r['macs_pct']:.1f}")
    table.add_row('total', '', f"{result['total_ms']:.3f}", '100.0', f"{result['total_macs'] / 1e6:.2f}", '100.0',
                  style='bold')
    console().print(table)
    for rt, ms in (runtimes or {}).items():
        console().print(f'{rt}: {ms:.3f} ms per forward (median, interleaved with eager; no per-kind split inside '
                        'a compiled or exported graph)')


def weighted_kinds(model: nn.Module, kinds: dict[str, str] | None = None) -> dict[str, int]:
    """``{kind: number of convolutions and linear layers it owns}`` (the ops an int8 runtime quantizes), for the
    kinds that own at least one; a layer belongs to the innermost kind-carrying module above it. The layers every
    int8 runtime keeps float (``zoo._quantize.float_modules``: the classifier, the first convolution) are left
    out."""
    from zoo._quantize import float_modules

    kinds = kind_map(model) if kinds is None else kinds  # ``kinds``: the caller's kind_map(model), not rebuilt
    keep = float_modules(model)
    out = defaultdict(int)
    for path, m in model.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and \
                not any(path == k or path.startswith(k + '.') for k in keep):
            out[kinds.get(_owner(path, kinds), OTHER)] += 1
    return dict(out)


def int8_sensitivity(model: nn.Module, x: torch.Tensor, calibration, evaluate=None,
                     runtime: str = 'onnxruntime-int8', repeats: int = 20, warmup: int = 3) -> list[dict]:
    """Quantize one block kind at a time: for each kind that owns weighted layers (:func:`weighted_kinds`), the
    model in ``runtime`` with only that kind's Conv / Gemm / MatMul ops in int8 (the classifier and first
    convolution stay float, as in the full int8 runtime), beside the float32 graph of the same runtime family and
    the whole model in int8.

    Every variant is timed on ``x`` under the one interleaved timer (``profile.benchmark``) and, with
    ``evaluate`` (a network -> its metric, e.g. top-1 on a test split), scored. Returns one row per variant:
    ``{'variant': 'float32' | 'all' | kind, 'layers', 'metric', 'delta' (metric - float32's), 'ms' (median),
    'iqr_ms', 'speedup' (float32 ms / ms), 'max_abs_delta' (largest |output - float32 output| on x)}``."""
    import zoo

    from .bench import _compared, _max_diff
    from .profile import benchmark

    model.eval()
    kinds = kind_map(model)
    layers = weighted_kinds(model, kinds)
    base = runtime.removesuffix('-int8')
    nets = {'float32': zoo.optimize(model, base, x), 'all': zoo.optimize(model, runtime, x, calibration=calibration)}
    for kind in sorted(layers):
        nets[kind] = zoo.optimize(model, runtime, x, calibration=calibration,
                                  int8_only=lambda path, kind=kind: kinds.get(_owner(path, kinds), OTHER) == kind)
    with torch.inference_mode():
        outs = {name: _compared(net, x) for name, net in nets.items()}
    lat = benchmark(nets, inputs=dict.fromkeys(nets, x), batch_size=len(x), repeats=repeats, warmup=warmup)
    metrics = {name: evaluate(net) if evaluate is not None else None for name, net in nets.items()}
    rows = []
    for name in nets:
        m, ref = metrics[name], metrics['float32']
        rows.append({'variant': name, 'layers': sum(layers.values()) if name in ('float32', 'all') else layers[name],
                     'metric': m, 'delta': m - ref if m is not None and ref is not None else None,
                     'ms': lat[name].median_ms, 'iqr_ms': lat[name].iqr_ms,
                     'speedup': lat['float32'].median_ms / lat[name].median_ms,
                     'max_abs_delta': _max_diff(outs[name], outs['float32'])})
    return rows


def int8_table(results: list[tuple[str, list[dict]]]) -> str:
    """:func:`int8_sensitivity` rows of one or more models as a Markdown table."""
    out = ['| model | quantized | layers | metric | change | ms | IQR | speed-up | max abs logit delta |',
           '|---|---|---|---|---|---|---|---|---|']
    for name, rows in results:
        for r in rows:
            acc = '' if r['metric'] is None else f'{r["metric"]:.4f}'
            drop = '' if r['delta'] is None else f'{r["delta"]:+.4f}'
            delta = '' if r['max_abs_delta'] is None else f'{r["max_abs_delta"]:.3g}'
            out.append(f'| {name} | {r["variant"]} | {r["layers"]} | {acc} | {drop} | {r["ms"]:.3f} | '
                       f'{r["iqr_ms"]:.3f} | {r["speedup"]:.2f}x | {delta} |')
    return '\n'.join(out)
