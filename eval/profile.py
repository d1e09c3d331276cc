"""Profiling: parameters, MACs and CPU latency / throughput.

MACs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (which reports FLOPs as 2 per
multiply-add, so MACs = FLOPs / 2). It counts convolutions, matrix products (mm, addmm, bmm,
baddbmm, linear), and scaled-dot-product attention; it does not count norms, pooling,
elementwise ops, softmax or activations. That is the "core MACs" of the reference pages (fvcore
additionally counts norm layers: fvcore totals are 0.5-1 % higher for the PoolFormer family).
Counting runs on the ``meta`` device when the model can be built there, so full-size models cost
no memory and almost no time.
"""
from __future__ import annotations

import copy
import hashlib
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from zoo._timing import ISA_FLAGS, interleave, machine, versions  # noqa: F401 (this module's names too)
# the one example-input function (zoo.tasks): a model's own input, by its task's input spec
from zoo.tasks import example_input  # noqa: F401  (re-exported: zoo.eval.profile.example_input)


def count_params(model: nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {'params': total, 'trainable_params': trainable}


def count_macs(model: nn.Module, input_size=(3, 224, 224), batch_size: int = 1, example=None) -> int:
    """Multiply-adds of one forward pass (conv, linear, matmul, attention; 1 multiply-add = 1 MAC).

    ``example`` overrides the input (e.g. token ids for language models).
    """
    from torch.utils.flop_counter import FlopCounterMode

    register_cpu_sdpa_flops()
    p = next(iter(model.parameters()), None)
    device = p.device if p is not None else torch.device('cpu')
    if example is None:
        example = torch.zeros(batch_size, *input_size, device=device)
    was_training = model.training
    model.eval()
    try:
        # zoo.layers.onednn runs the plain ops under any dispatch mode, so the counter sees every MAC whatever
        # requires_grad says (tests/test_onednn.py); grad mode on keeps TNT's full last block (not class token only).
        with FlopCounterMode(display=False) as counter, torch.enable_grad():
            model(example)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2


def register_cpu_sdpa_flops() -> None:
    """Teach FlopCounterMode the CPU flash-attention kernel that ``F.scaled_dot_product_attention``
    dispatches to on CPU tensors (torch counts only the CUDA kernels, and the math fallback on meta).
    Same formula as torch's: 2 batched matmuls, q @ k^T and attn @ v. ``count_macs`` calls it; call it
    yourself before using ``FlopCounterMode`` directly. Idempotent."""
    from torch.utils import flop_counter

    _register_scan_flops(flop_counter)
    op = getattr(torch.ops.aten, '_scaled_dot_product_flash_attention_for_cpu', None)
    if op is None or op in flop_counter.flop_registry or op.default in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(op, get_raw=True)
    def _cpu_flash_flop(query, key, value, *args, out_val=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _register_scan_flops(flop_counter) -> None:
    """zoo's selective-scan operators (``zoo::selective_scan`` and its backward) are opaque to FlopCounterMode: count
    the batched products their eager code runs, as the counter saw them before they were operators: y_t = C_t . h_t
    (B KD N per position, padded to whole chunks) forward, three such products per position backward."""
    import zoo.layers.selective_scan  # noqa: F401  (registers the operators)

    fwd, bwd = torch.ops.zoo.selective_scan, torch.ops.zoo.selective_scan_backward
    if fwd in flop_counter.flop_registry or fwd.default in flop_counter.flop_registry:
        return

    def macs(u_shape, a_shape, chunk):
        bsz, kd, length = u_shape
        return bsz * kd * a_shape[1] * -(-length // chunk) * chunk

    @flop_counter.register_flop_formula(fwd)
    def _scan_flop(u, delta, A, B, C, D, delta_bias, delta_softplus, chunk, *args, out_shape=None, **kwargs) -> int:
        return 2 * macs(u, A, chunk)

    @flop_counter.register_flop_formula(bwd)
    def _scan_backward_flop(gy, u, delta, A, B, C, D, delta_bias, delta_softplus, chunk, *args, out_shape=None,
                            **kwargs) -> int:
        return 3 * 2 * macs(u, A, chunk)


@dataclass
class Latency:
    """One latency measurement: the keys the results database stores it under, the figures, and the
    conditions it was taken in (warm-up calls, the machine's 1-minute load average before and after, the
    number of CPUs, how long the timed part lasted), so a reader can tell a quiet-machine number from a busy one."""
    model: str
    batch_size: int
    input_size: tuple
    device: str = 'cpu'
    threads: int = 1
    dtype: str = 'float32'
    channels_last: bool = False
    compiled: bool = False
    mode: str = 'inference'
    runtime: str = 'eager'                # eager | compile | onnxruntime | openvino (zoo.RUNTIMES)
    compile_mode: str | None = None       # torch.compile's mode for runtime 'compile'
    warmup: int = 0
    load_1m: float | None = None          # os.getloadavg()[0] just before the warm-up
    load_1m_after: float | None = None    # ... and after the timed rounds (includes this process)
    cpus: int | None = None
    duration_s: float | None = None       # wall time of the timed rounds (all interleaved models)
    # on a GPU: the memory one call allocates at its peak (torch.cuda.max_memory_allocated, weights included), and
    # which GPU, driver and clocks (zoo._timing.gpu); None on the CPU
    peak_mem_mb: float | None = None
    gpu_name: str | None = None
    gpu_driver: str | None = None
    gpu_clocks: dict | None = None
    times_ms: list = field(default_factory=list, repr=False)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)

    @property
    def max_ms(self) -> float:
        return max(self.times_ms)

    @property
    def iqr_ms(self) -> float:
        """Interquartile range of the per-call times (0 below 4 calls: no quartiles to speak of)."""
        if len(self.times_ms) < 4:
            return 0.0
        q = statistics.quantiles(self.times_ms, n=4)
        return q[2] - q[0]

    @property
    def throughput(self) -> float:
        """Samples per second at the median step time."""
        return self.batch_size / (self.median_ms / 1000.0)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop('times_ms')
        d.update(median_ms=self.median_ms, min_ms=self.min_ms, max_ms=self.max_ms, iqr_ms=self.iqr_ms,
                 throughput=self.throughput, repeats=len(self.times_ms))
        return d


# The controlled protocol of every recorded latency (``zoo bench`` and the after-training record): warm up
# for at least WARMUP calls *and* WARMUP_S seconds (allocator, oneDNN kernel choice, caches), then time
# interleaved rounds until BUDGET_S seconds are spent, with at least MIN_REPEATS and at most MAX_REPEATS
# rounds; report the median and the IQR, and record the load average around it. A slow model gets
# MIN_REPEATS rounds whatever the budget; a fast one gets as many as fit in the budget.
WARMUP, WARMUP_S = 5, 0.5
MIN_REPEATS, MAX_REPEATS, BUDGET_S = 20, 500, 2.0


def load_average() -> float | None:
    """The 1-minute load average (runnable + waiting processes), None where the OS has none (Windows)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


_DTYPES = {'float32': torch.float32, 'fp32': torch.float32, 'bfloat16': torch.bfloat16, 'bf16': torch.bfloat16,
           'float16': torch.float16, 'fp16': torch.float16}


def _proc_status_kib(field: str) -> int | None:
    try:
        with open('/proc/self/status') as f:
            return next((int(line.split()[1]) for line in f if line.startswith(field + ':')), None)
    except OSError:  # not Linux
        return None


def reset_peak_memory(device: torch.device | str = 'cpu') -> None:
    """Start a new peak-memory window: CUDA's allocator peak, or on the CPU the kernel's peak resident set
    (``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs``; Linux >= 4.0). Where neither can be reset,
    ``peak_memory_mb`` reports the process's peak so far."""
    if torch.device(device).type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass


def resident_memory_mb() -> float | None:
    """The process's resident set now, in MiB (``VmRSS``; None where ``/proc`` is missing): the baseline to
    subtract from ``peak_memory_mb`` for what one step adds."""
    kib = _proc_status_kib('VmRSS')
    return None if kib is None else kib / 1024


def peak_memory_mb(device: torch.device | str = 'cpu') -> float | None:
    """Peak memory since ``reset_peak_memory``, in MiB: tensors allocated on a CUDA device, or the process's
    resident set on the CPU (model, activations, data and the interpreter: what the machine must hold)."""
    if torch.device(device).type == 'cuda':
        return torch.cuda.max_memory_allocated(device) / 2**20
    kib = _proc_status_kib('VmHWM')
    if kib is None:
        import resource
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, the whole process's life
    return kib / 1024


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f'unknown dtype {dtype!r}; expected one of {", ".join(_DTYPES)}')
    return _DTYPES[dtype]


def make_step(model: nn.Module, x: torch.Tensor, mode: str) -> Callable[[], None]:
    """What ``benchmark`` times per call, for ``interleave``: ``'inference'``, an eval forward under
    ``torch.inference_mode``; ``'train'``, a train-mode forward and backward of the output's sum."""
    if mode == 'inference':
        model.eval()

        def step():
            with torch.inference_mode():
                model(x)
    elif mode == 'train':
        model.train()

        def step():
            model.zero_grad(set_to_none=True)
            model(x).float().sum().backward()
    else:
        raise ValueError(f"mode must be 'inference' or 'train', got {mode!r}")
    return step


def benchmark(models: dict[str, nn.Module], input_size=(3, 224, 224), batch_size: int = 1, warmup: int = 3,
              repeats: int = 10, threads: int | None = None, dtype: str = 'float32', channels_last: bool = False,
              mode: str = 'inference', inputs: dict[str, torch.Tensor] | None = None, *,
              budget_s: float | None = None, max_repeats: int | None = None, warmup_s: float = 0.0,
              task: str | None = None, device: str = 'cpu') -> dict[str, Latency]:
    """Time several models in one process, interleaved (A, B, A, B, ...), so that machine noise
    hits all of them alike. Returns a ``Latency`` per model with every repeat's time and the load average
    before and after. ``repeats``/``budget_s``/``max_repeats``/``warmup``/``warmup_s``: see ``interleave``
    (the recorded measurements use the protocol constants above). ``inputs`` overrides a model's input;
    otherwise ``example_input`` draws one (token ids for a language model).

    ``device``: where the models and inputs are (``cuda``: moved there; ``call_timer`` times each call with CUDA
    events). On a GPU each model's ``peak_mem_mb`` is the allocator's peak over one call of it alone, before the
    interleaved rounds (interleaved, the peak would be the largest model's), and the GPU's name, driver and clocks
    are recorded (``zoo._timing.gpu``)."""
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    tdtype = resolve_dtype(dtype)
    steps, results = {}, {}
    cuda = torch.device(device).type == 'cuda'
    for name, model in models.items():
        x = inputs[name] if inputs and name in inputs else example_input(model, input_size, batch_size, task)
        if cuda:
            x, model = x.to(device), (model.to(device) if isinstance(model, nn.Module) else model)
        if x.is_floating_point():
            x = x.to(tdtype)
        model = model.to(tdtype) if tdtype != torch.float32 else model
        if channels_last and x.ndim == 4:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        steps[name] = make_step(model, x, mode)
        results[name] = Latency(name, batch_size, tuple(x.shape[1:]), torch.device(device).type, threads,
                                str(tdtype).replace('torch.', ''), channels_last, False, mode)
    if cuda:
        from zoo._timing import gpu
        card = gpu(device)
        for name, step in steps.items():
            step()                   # the first call's one-off allocations (cuDNN workspaces, compiled graphs)
            torch.cuda.synchronize(device)
            reset_peak_memory(device)
            step()
            torch.cuda.synchronize(device)
            results[name].peak_mem_mb = peak_memory_mb(device)
            results[name].gpu_name = card['gpu_name']
            results[name].gpu_driver, results[name].gpu_clocks = card['gpu_driver'], card['gpu_clocks']
    load_before, cpus = load_average(), os.cpu_count()
    t0 = time.perf_counter()
    times = interleave(steps, repeats, warmup, budget_s=budget_s, max_repeats=max_repeats, warmup_s=warmup_s,
                       device=device)
    duration = time.perf_counter() - t0
    load_after = load_average()
    for name, t in times.items():
        r = results[name]
        r.times_ms.extend(t)
        r.warmup, r.load_1m, r.load_1m_after, r.cpus, r.duration_s = warmup, load_before, load_after, cpus, duration
    return results


def controlled_benchmark(models: dict[str, nn.Module], input_size=(3, 224, 224), batch_size: int = 1,
                         budget_s: float = BUDGET_S, **kw) -> dict[str, Latency]:
    """``benchmark`` with the recorded-latency protocol (WARMUP/WARMUP_S, MIN_REPEATS..MAX_REPEATS rounds
    within ``budget_s``); keyword arguments override single settings."""
    kw = {'warmup': WARMUP, 'warmup_s': WARMUP_S, 'repeats': MIN_REPEATS, 'max_repeats': MAX_REPEATS, **kw}
    return benchmark(models, input_size=input_size, batch_size=batch_size, budget_s=budget_s, **kw)


def profile(model: nn.Module, name: str = 'model', input_size=(3, 224, 224), batch_size: int = 1,
            **bench_kwargs) -> dict:
    """Params, MACs and latency of one model, as one flat record."""
    rec = {'model': name, **count_params(model), 'macs': count_macs(model, input_size)}
    lat = benchmark({name: model}, input_size=input_size, batch_size=batch_size, **bench_kwargs)[name]
    rec.update(lat.as_dict())
    return rec


def fingerprint(model) -> str:
    """A hash of a network's module structure (class and constructor summary of every submodule) and its
    parameter and buffer shapes. Two names that build the same network get the same fingerprint;
    weights and the name do not enter it."""
    h = hashlib.sha256()
    for name, m in model.named_modules():
        h.update(f'{name}|{type(m).__name__}|{m.extra_repr()}\n'.encode())
    for kind, items in (('p', model.named_parameters()), ('b', model.named_buffers())):
        for name, t in items:
            h.update(f'{kind}|{name}|{tuple(t.shape)}|{t.dtype}\n'.encode())
    return h.hexdigest()[:16]


# Modules that hold the weights of a layer: depth counts them (LEMUR's "depth" of a network).
_WEIGHTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.Linear, nn.Embedding)


def peak_activation_mb(model: nn.Module, example: torch.Tensor) -> float | None:
    """Peak CPU memory one inference forward allocates beyond the weights (activations and workspaces), in MB:
    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free as the self memory of
    the op that made it; the running sum of those, in time order, peaks at the activation high-water mark.
    None when the profiler records no memory events (a build without the CPU memory profiler)."""
    from torch.profiler import ProfilerActivity, profile

    # kineto prints its start, its stop and (without a GPU) "ERROR: ... gpuGetDeviceCount failed" on stderr at
    # every profile: noise at the end of each recorded `zoo fit`. Level 6 is past its highest; read when kineto
    # first starts, and a user's own setting stays.
    os.environ.setdefault('KINETO_LOG_LEVEL', '6')
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model(example)
    finally:
        model.train(was_training)
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage),
                    key=lambda e: (e.time_range.start, e.id))
    if not events:
        return None
    running = peak = 0
    for e in events:
        running += e.self_cpu_memory_usage
        peak = max(peak, running)
    return peak / 2 ** 20


def network_stats(model: nn.Module, example: torch.Tensor) -> dict:
    """Architecture statistics of one network at one input (LEMUR's ``include_nn_stats``, made explicit):

    - ``size_mb``: parameters and buffers in memory (MB);
    - ``weighted_layers``: convolutions, linear layers and embeddings (the network's depth in weight layers);
    - ``leaf_modules``: modules without children;
    - ``blocks``: ``{kind: count}`` of the modules that are registered zoo blocks, per kind (``zoo.layers``);
    - ``peak_activation_mb``: ``peak_activation_mb(model, example)`` (batch and size of ``example``);
    - ``input_shape``: one sample's shape of ``example``."""
    import zoo

    kinds: dict[type, str] = {}
    for rec in zoo.layers.records():
        kinds.setdefault(rec.cls, rec.kind)
    blocks: dict[str, int] = {}
    for m in model.modules():
        kind = kinds.get(type(m))
        if kind is not None:
            blocks[kind] = blocks.get(kind, 0) + 1
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return {'size_mb': size / 2 ** 20,
            'weighted_layers': sum(isinstance(m, _WEIGHTED) for m in model.modules()),
            'leaf_modules': sum(1 for m in model.modules() if not any(True for _ in m.children())),
            'blocks': dict(sorted(blocks.items())),
            'peak_activation_mb': peak_activation_mb(model, example),
            'input_shape': list(example.shape[1:])}


# ------------------------------------------------------------------------- memory and time of a training step


def saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable | None = None) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves for backward during one training forward
    (``torch.autograd.graph.saved_tensors_hooks``; a storage saved twice counts once), the activation memory
    You et al. (ICLR 2024, "Efficient ConvBN Blocks for Transfer Learning and Beyond") compare the ConvBN modes
    on. Runs the backward too (it frees what was saved), so ``model`` ends with gradients (and, with BN in train
    mode, updated running statistics): pass a copy where that matters. ``loss_fn(logits, y)`` defaults to
    cross-entropy."""
    loss_fn = loss_fn or nn.functional.cross_entropy
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x), y)
    loss.backward()
    return sum(seen.values())


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable | None = None,
               lr: float = 1e-3) -> Callable[[], None]:
    """One training step of ``model`` on the batch ``(x, y)`` as a function for ``interleave``: forward,
    ``loss_fn(logits, y)`` (cross-entropy by default), backward and an SGD step (momentum 0.9). It changes
    ``model``'s weights: time a copy."""
    loss_fn = loss_fn or nn.functional.cross_entropy
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return step


def convbn_probe(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable | None = None,
                 rounds: int = 15, warmup: int = 2) -> dict:
    """A network's ConvBN mode against Eval mode with the same weights, on one training batch (You et al., ICLR
    2024: Tune keeps fewer activations for backward and steps faster than Eval):

    - ``saved_backward_mb``: ``saved_bytes`` of ``model`` as it is (its modes and train/eval flags), in MB;
    - ``saved_backward_eval_mb``: the same with every Conv+BN pair switched to ``eval``;
    - ``saved_backward_vs_eval``: their ratio (exactly 1.0 for a network already in Eval mode);
    - ``step_ms``, ``step_eval_ms``: the median ``train_step`` times of the two, timed interleaved in this
      process (``interleave``: ``warmup`` calls, then ``rounds`` alternating rounds), on the same batch;
    - ``step_time_vs_eval``: their ratio.

    Everything runs on deep copies (eager, whatever the network was compiled with): ``model``'s weights, gradients
    and BN statistics are left as they were. A network in ``deploy`` mode has no BN left to switch: ValueError."""
    from zoo.layers._torch_compat import drop_compiled_forward
    from zoo.layers.convbn import ConvBN, set_mode

    if any(isinstance(m, ConvBN) and m.mode == 'deploy' for m in model.modules()):
        raise ValueError('convbn_probe: the network is in deploy mode (BN folded into the convs for good); '
                         'there is no Eval mode to compare it with')
    nets = {'run': copy.deepcopy(model), 'eval': copy.deepcopy(model)}
    for net in nets.values():
        for module in net.modules():      # the eager network (torch.compile's wrapper is not copied)
            drop_compiled_forward(module)
    set_mode(nets['eval'], 'eval')
    saved = {k: saved_bytes(net, x, y, loss_fn) for k, net in nets.items()}
    # settle=0: two eager torch steps leave no runtime threads spinning for the other to absorb
    times = interleave({k: train_step(net, x, y, loss_fn) for k, net in nets.items()}, rounds, warmup, settle=0)
    step = {k: statistics.median(t) for k, t in times.items()}
    return {'saved_backward_mb': saved['run'] / 2 ** 20, 'saved_backward_eval_mb': saved['eval'] / 2 ** 20,
            'saved_backward_vs_eval': saved['run'] / saved['eval'],
            'step_ms': step['run'], 'step_eval_ms': step['eval'], 'step_time_vs_eval': step['run'] / step['eval']}
