"""``zoo.optimize(model, 'auto')``: the fastest float32 runtime for this model, input and CPU, measured once.

The candidates (eager, compile, ONNX Runtime, OpenVINO) are built on the example input and timed interleaved with
the one timer (``zoo._timing.interleave``: warm-up, then rounds of A, B, C, ... with a settling call before
each, medians); a candidate whose output differs from eager's by more than ``rtol`` of eager's largest value is
never chosen (a fast runtime that is wrong), nor one that fails to build. The choice is cached in a JSON file
(``$ZOO_CACHE`` or ``~/.cache/zoo``, ``auto_runtime.json``) under a key of everything the timing depends on: the
architecture (parameter names, shapes and dtypes, not their values), the input's shape and dtype, the CPU
model, the thread count and the libraries' versions; the next call builds the cached runtime alone. A line on
stderr says what was chosen and why (``zoo: auto chose onnxruntime for resnet_tiny (2, 3, 32, 32) on AMD EPYC:
0.21 ms; eager 0.95, compile 0.40, openvino 0.26``).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import statistics
import sys
import tempfile

import torch
from torch import nn

__all__ = ['CANDIDATES', 'choose', 'cache_path', 'cache_key']

CANDIDATES = ('eager', 'compile', 'onnxruntime', 'openvino')
RTOL = 1e-3        # outputs within 0.1 % of eager's largest |value|: float32 reordering, not a wrong graph
REPEATS, WARMUP, BUDGET_S = 10, 3, 1.0


def cache_path() -> pathlib.Path:
    root = os.environ.get('ZOO_CACHE') or pathlib.Path.home() / '.cache' / 'zoo'
    return pathlib.Path(root) / 'auto_runtime.json'


def cache_key(model: nn.Module, example: torch.Tensor) -> str:
    """Everything a runtime's speed depends on, as one string: architecture, input, CPU, threads, versions."""
    from ._timing import machine, versions
    arch = hashlib.sha1(repr([type(model).__name__, *((k, tuple(v.shape), str(v.dtype))
                                                      for k, v in model.state_dict().items())]).encode())
    return json.dumps({'arch': arch.hexdigest()[:16], 'name': getattr(model, 'zoo_name', type(model).__name__),
                       'input': [list(example.shape), str(example.dtype)], 'cpu': machine()['cpu_model'],
                       'threads': torch.get_num_threads(), 'versions': versions()}, sort_keys=True)


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}  # no cache yet, or one a crash left unreadable: measure again


def _write_cache(key: str, entry: dict) -> None:
    """Add ``entry`` under ``key``, written to a temporary file then renamed: never a half-written cache."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    cache = _read_cache()
    cache[key] = entry
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')
    with os.fdopen(fd, 'w') as f:
        json.dump(cache, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _output(net, x):
    """What the candidates are compared on: a dense model's network maps (its detections may differ in count
    while the maps agree), else the output, flattened to one float32 vector."""
    from zoo.layers._torch_compat import tree_flatten
    out = net.forward_raw(x) if hasattr(net, 'forward_raw') else net(x)
    leaves, _ = tree_flatten(out)
    return torch.cat([t.detach().float().flatten() for t in leaves if isinstance(t, torch.Tensor)])


def choose(model: nn.Module, example: torch.Tensor, build, *, candidates=CANDIDATES, use_cache: bool = True,
           rtol: float = RTOL) -> nn.Module:
    """The fastest of ``candidates`` whose output matches eager's (``build(runtime)`` makes each), cached.
    The returned module has ``runtime`` (the choice) and ``auto`` (medians in ms, max |delta|, why others lost)."""
    from ._timing import interleave, machine

    bad = [c for c in candidates if c not in CANDIDATES]
    if bad or not candidates:
        raise ValueError(f'auto chooses among {", ".join(CANDIDATES)}; got {", ".join(map(str, bad)) or "none"}')
    key = cache_key(model, example)
    name = getattr(model, 'zoo_name', type(model).__name__)
    cached = _read_cache().get(key) if use_cache else None
    if cached and cached.get('runtime') in candidates:
        net = build(cached['runtime'])
        net.auto = {**cached, 'cached': True}
        _say(f'auto runs {cached["runtime"]} for {name} {tuple(example.shape)} (cached choice, '
             f'{cached["median_ms"][cached["runtime"]]:.3g} ms when measured)')
        return net
    with torch.no_grad():
        ref = _output(model.eval(), example)
    nets, deltas, failed = {}, {}, {}
    for rt in candidates:
        try:
            net = build(rt)
            with torch.no_grad():
                deltas[rt] = float((_output(net, example) - ref).abs().max())
        except Exception as e:  # a runtime that cannot run this model is not a choice (said in the report)
            failed[rt] = f'{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ""}'
            continue
        nets[rt] = net
    scale = float(ref.abs().max()) or 1.0
    wrong = {rt: d for rt, d in deltas.items() if d > rtol * scale}
    ok = {rt: net for rt, net in nets.items() if rt not in wrong}
    if not ok:
        raise ValueError(f'auto: no runtime ran {name} with eager\'s outputs (failed: {failed}, wrong: {wrong})')

    def call(net):
        def run():
            with torch.inference_mode():
                net(example)
        return run

    times = interleave({rt: call(net) for rt, net in ok.items()}, repeats=REPEATS, warmup=WARMUP,
                       budget_s=BUDGET_S)
    medians = {rt: statistics.median(t) for rt, t in times.items()}
    best = min(medians, key=medians.get)
    entry = {'runtime': best, 'median_ms': medians, 'max_delta': deltas, 'wrong': wrong, 'failed': failed,
             'cpu': machine()['cpu_model']}
    if use_cache:
        _write_cache(key, entry)
    others = ', '.join(f'{rt} {ms:.3g}' for rt, ms in medians.items() if rt != best)
    rejected = ''.join(f'; {rt} rejected (max |delta| {d:.2g})' for rt, d in wrong.items()) + \
        ''.join(f'; {rt} failed' for rt in failed)
    _say(f'auto chose {best} for {name} {tuple(example.shape)} on {entry["cpu"]}: {medians[best]:.3g} ms'
         f'{"; " + others if others else ""}{rejected}')
    net = ok[best]
    net.auto = {**entry, 'cached': False}
    return net


def _say(line: str) -> None:
    print(f'zoo: {line}', file=sys.stderr, flush=True)
