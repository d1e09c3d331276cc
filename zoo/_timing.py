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

__all__ = ['ISA_FLAGS', 'call_timer', 'gpu', 'interleave', 'machine', 'parse_nvidia_smi', 'versions']


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


# What ``gpu`` asks nvidia-smi for, in this order (``--format=csv,noheader,nounits``): the driver, and the clocks the
# GPU ran at when asked (graphics/SM and memory) beside the SM clock it can reach; a figure taken at a throttled
# clock is slower for a reason that is not the model.
NVIDIA_SMI_FIELDS = ('driver_version', 'clocks.sm', 'clocks.max.sm', 'clocks.mem')


def parse_nvidia_smi(text: str) -> dict:
    """One line of ``nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits``, as
    ``{'gpu_driver': '550.54.15', 'gpu_clocks': {'sm_mhz': 1410, 'max_sm_mhz': 1410, 'mem_mhz': 1215}}``; a field
    nvidia-smi reports as ``[N/A]`` (or that is missing) is None."""
    cells = [c.strip() for c in text.strip().splitlines()[0].split(',')] if text.strip() else []
    cells += [''] * (len(NVIDIA_SMI_FIELDS) - len(cells))

    def mhz(cell):
        try:
            return int(float(cell))
        except ValueError:          # '[N/A]', '[Not Supported]', ''
            return None
    driver = cells[0] if cells[0] and not cells[0].startswith('[') else None
    return {'gpu_driver': driver, 'gpu_clocks': {'sm_mhz': mhz(cells[1]), 'max_sm_mhz': mhz(cells[2]),
                                                  'mem_mhz': mhz(cells[3])}}


def gpu(device='cuda') -> dict:
    """The GPU a latency was measured on: ``{'gpu_name', 'gpu_driver', 'gpu_clocks'}``; the name from
    ``torch.cuda.get_device_name``, the driver and clocks from ``nvidia-smi`` when it is on the PATH (else None:
    PyTorch does not know them). ``device`` (``cuda`` or ``cuda:N``) must be a CUDA device PyTorch sees."""
    import shutil
    import subprocess

    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    out = {'gpu_name': torch.cuda.get_device_name(index), 'gpu_driver': None, 'gpu_clocks': None}
    smi = shutil.which('nvidia-smi')
    if smi:
        try:
            text = subprocess.run([smi, f'--query-gpu={",".join(NVIDIA_SMI_FIELDS)}', '--format=csv,noheader,nounits',
                                   '-i', str(index)], capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):   # a broken driver install: the figure keeps its GPU name
            text = ''
        if text.strip():
            out.update(parse_nvidia_smi(text))
    return out


def call_timer(device='cpu') -> Callable[[Callable[[], object]], float]:
    """The clock of one timed call on ``device``: a function ``time(fn) -> milliseconds``.

    CPU: ``time.perf_counter`` around the call. CUDA: kernels run asynchronously, so a host clock would time the
    launches only. The device is synchronized first (nothing earlier counts), CUDA events are recorded around the
    call on the current stream, and the end event is waited for: the GPU's own time of the call's kernels."""
    import torch

    dev = torch.device(device)
    if dev.type == 'cpu':
        def cpu_time(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1000.0
        return cpu_time
    if dev.type != 'cuda':
        raise ValueError(f'no timer for device {str(device)!r}; expected cpu or cuda')

    def cuda_time(fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    return cuda_time


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
               warmup_s: float = 0.0, settle: int | None = None, device='cpu') -> dict[str, list[float]]:
    """The one timer of every benchmark: call each function ``warmup`` times (and until ``warmup_s`` seconds
    have passed), then rounds of A, B, A, B, ... (interleaved, so machine noise hits all of them alike).
    Without ``budget_s``: exactly ``repeats`` rounds. With it: at least ``repeats`` rounds, then more until
    ``budget_s`` seconds of rounds are spent or ``max_repeats`` rounds are done. Returns every call's ms.

    ``settle`` (default: 1 when several functions are timed, else 0): untimed calls of the same function right
    before each timed one. Runtimes keep their worker threads spinning after a call (ONNX Runtime's pool,
    libgomp's), and whatever runs next shares the cores with them: a compiled PoolFormer timed right after an
    ONNX Runtime session took 2x its time. The settling call absorbs the previous function's spinning and each
    function is timed as it runs back to back, alone in the process.

    ``device``: where the functions run, which decides the clock (``call_timer``: CUDA events on a GPU, after a
    synchronize, so a call's queued kernels are timed and not only their launch)."""
    timer = call_timer(device)
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
            times[name].append(timer(fn))
        n += 1
    return times
