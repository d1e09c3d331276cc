"""The one timer and the machine it runs on: what every latency in zoo is measured with.

``interleave`` is the timer of ``zoo bench``, the benchmarks and ``zoo.optimize(model, 'auto')`` (which chooses
a runtime by timing the candidates); ``machine`` and ``versions`` name what a figure was measured on. They live
at the model level so that ``zoo.optimize`` can measure; ``zoo.eval.profile`` builds the recorded protocol
(warm-up, budget, load) on them.
"""
from __future__ import annotations

import functools
import platform
import time
from typing import Callable

__all__ = ['ISA_FLAGS', 'interleave', 'machine', 'versions']


# The instruction-set flags that decide which kernels a CPU runs (oneDNN's AVX-512 and AMX paths, bf16).
ISA_FLAGS = ('avx2', 'avx512f', 'avx512_bf16', 'amx_tile', 'amx_bf16')


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """The CPU a latency was measured on: ``{'cpu_model': ..., 'isa': [flags among ISA_FLAGS]}``, from
    ``/proc/cpuinfo`` (Linux); elsewhere ``platform.processor()`` (or the machine type) and no flags."""
    model, flags = None, set()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                key, _, value = line.partition(':')
                key = key.strip()
                if key in ('model name', 'Model', 'cpu model') and model is None:
                    model = value.strip()
                elif key in ('flags', 'Features') and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or 'unknown'
    return {'cpu_model': ' '.join(model.split()), 'isa': [f for f in ISA_FLAGS if f in flags]}


def versions() -> dict:
    """Versions of the libraries a latency depends on (those installed; nothing is imported)."""
    from importlib import metadata

    import torch

    import zoo
    out = {'zoo': zoo.__version__, 'torch': torch.__version__}
    for dist in ('onnxruntime', 'onnx', 'openvino', 'timm'):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def interleave(fns: dict[str, Callable[[], object]], repeats: int = 10, warmup: int = 3, *,
               budget_s: float | None = None, max_repeats: int | None = None,
               warmup_s: float = 0.0, settle: int | None = None) -> dict[str, list[float]]:
    """The one timer of every benchmark: call each function ``warmup`` times (and until ``warmup_s`` seconds
    have passed), then rounds of A, B, A, B, ... (interleaved, so machine noise hits all of them alike).
    Without ``budget_s``: exactly ``repeats`` rounds. With it: at least ``repeats`` rounds, then more until
    ``budget_s`` seconds of rounds are spent or ``max_repeats`` rounds are done. Returns every call's ms.

    ``settle`` (default: 1 when several functions are timed, else 0): untimed calls of the same function right
    before each timed one. Runtimes keep their worker threads spinning after a call (ONNX Runtime's pool,
    libgomp's), and whatever runs next shares the cores with them: a compiled PoolFormer timed right after an
    ONNX Runtime session took 2x its time. The settling call absorbs the previous function's spinning and each
    function is timed as it runs back to back, alone in the process."""
    settle = (1 if len(fns) > 1 else 0) if settle is None else settle
    times: dict[str, list[float]] = {name: [] for name in fns}
    start, n = time.perf_counter(), 0
    while n < warmup or time.perf_counter() - start < warmup_s:
        for fn in fns.values():
            fn()
        n += 1
    cap = repeats if budget_s is None else max(repeats, max_repeats or repeats)
    start, n = time.perf_counter(), 0
    while n < cap and (n < repeats or time.perf_counter() - start < budget_s):
        for name, fn in fns.items():
            for _ in range(settle):
                fn()
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000.0)
        n += 1
    return times
