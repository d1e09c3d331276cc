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
process, and writes the rows (``source='bench'``): one command to refresh latency on a quiet machine. Only
trusted records are written (``untrusted``: a load above ``BUSY_LOAD`` per CPU or an IQR above ``MAX_IQR_RATIO``
of the median); an untrusted one is timed again after the load falls, and one still untrusted is recorded as a
failure. Every row keeps ``max_abs_delta``, its largest output difference from eager on the timed input.
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch

import zoo
from zoo import tasks

from .profile import (BUDGET_S, MAX_REPEATS, MIN_REPEATS, WARMUP, WARMUP_S, Latency, benchmark, count_macs,
                      count_params, example_input, fingerprint, resolve_dtype)


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


def _timing(repeats: int, warmup: int, budget_s: float | None, max_repeats: int | None) -> dict:
    """The ``benchmark`` keywords of the controlled protocol (``budget_s=0``: exactly ``repeats`` calls)."""
    return dict(repeats=repeats, warmup=warmup, budget_s=budget_s or None,
                max_repeats=max_repeats if max_repeats is not None else MAX_REPEATS,
                warmup_s=WARMUP_S if budget_s else 0.0)


def parse_runtimes(spec) -> tuple[str, ...]:
    """``'eager,compile,onnxruntime'`` (or a list) -> the runtimes, checked against ``zoo.RUNTIMES``; eager first
    (every other runtime is compared with it), each once."""
    from zoo._runtime import RUNTIMES, check_runtime

    items = [check_runtime(r.strip(), 'unknown runtime {runtime!r}; expected a comma-separated list of {runtimes}')
             for r in (spec.split(',') if isinstance(spec, str) else spec) if r.strip()]
    if not items:
        raise ValueError(f'no runtime given; expected a comma-separated list of {", ".join(RUNTIMES)}')
    return tuple(dict.fromkeys(['eager', *items]))


def _max_diff(a, b) -> float | None:
    """Largest absolute difference between two outputs (tensors, or the same nesting of tensors), in float32;
    None when their structure or shapes differ (e.g. detections, whose count may differ)."""
    from zoo.layers._torch_compat import tree_flatten

    la, sa = tree_flatten(a)
    lb, sb = tree_flatten(b)
    if sa != sb or any(not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape
                       for x, y in zip(la, lb)):
        return None
    diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(la, lb) if x.numel()]
    return max(diffs, default=0.0)


def error_summary(e: BaseException, limit: int = 300) -> str:
    """One line for an exporter's or compiler's error: the exception summary torch.export / torch.onnx put in
    their message (``<class '...'>: what``) when there is one, else its first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    summary = next((ln for ln in lines if ln.startswith("<class '")), None)
    text = summary.split("'>: ", 1)[-1] if summary else (lines[0] if lines else '')
    return f'{type(e).__name__}: {text}'[:limit]


def _set_threads(threads: int | None) -> None:
    """The thread count before anything is prepared: a compiled graph guards on it (set later, by the timer, the
    first timed call compiled again) and ONNX Runtime / OpenVINO sessions take it when they are created."""
    if threads is not None:
        torch.set_num_threads(threads)


def _prepare(model, runtime: str, x, dtype, compile_mode: str | None, net=None):
    """``zoo.optimize`` of ``model`` in ``runtime`` (unless ``net`` is that already: the exported graphs have a
    dynamic batch, so one export serves every batch size) and its first call on ``x``: the runtime's module, its
    output and the seconds the two took (compile or export time, or a recompile for a new batch size)."""
    t0 = time.perf_counter()
    if net is None and runtime == 'eager' and dtype is None:
        net = model.eval()
    elif net is None:
        # the compiled graph serves any grad mode (zoo.optimize runs it outside inference_mode), so compiling
        # here and timing under inference_mode compile once
        # the int8 runtimes are calibrated on the timed input: random, so their ranges (and the max |delta|
        # beside their time) are a timing setting, not an accuracy; `zoo test --runtime R` measures that
        net = zoo.optimize(model, runtime, x, dtype=dtype if runtime in ('eager', 'compile') else None,
                           mode=compile_mode if runtime == 'compile' else None,
                           calibration=[x] if runtime.endswith('-int8') else None)
    with torch.inference_mode():
        out = _compared(net, x)
    return net, out, time.perf_counter() - t0


def _compared(net, x):
    """The output the runtimes are compared on: a dense model's network maps (its detections after NMS may
    be empty, or differ in count), else the model's output."""
    return net.forward_raw(x) if hasattr(net, 'forward_raw') else net(x)


def _sizes(img_size) -> list:
    """``--img-size``: None (the model's own size), one size, or several (a resolution sweep), each once, in order."""
    if img_size is None or isinstance(img_size, int):
        return [img_size]
    sizes = list(dict.fromkeys(img_size))
    return sizes or [None]


def size_problem(model, size, task: str | None = None, device='cpu') -> str | None:
    """Why ``model`` cannot run at ``size`` (one sample's shape), in one line, or None when it can.

    A model with a fixed input size (timm's ``pretrained_cfg['fixed_input_size']``: position embeddings or token
    mixers whose weights are built for one grid, e.g. TNT, Strip-MLP) cannot take any size but the one it was built
    for: a resolution sweep skips it there rather than build another network (other weights, other parameters) at
    each size. Any other size is tried with one eager forward of one sample: a size the model refuses (below its
    ``min_input_size``, not a multiple of a patch embedding's stride) is skipped with the model's own error."""
    cfg = dict(getattr(model, 'pretrained_cfg', None) or {})
    built = tuple(cfg.get('input_size') or ())
    if cfg.get('fixed_input_size') and len(built) == 3 and tuple(size[-2:]) != built[-2:]:
        return (f'fixed input size {built[1]}x{built[2]} (pretrained_cfg fixed_input_size: its weights are built for '
                f'one grid)')
    try:
        with torch.inference_mode():
            _compared(model.eval(), example_input(model, size, 1, task).to(device))
    except Exception as e:  # the model's own words for a size it cannot take
        return error_summary(e)
    return None


def scaling_fit(pixels, latencies_ms) -> dict:
    """How latency grows with resolution: the least-squares line of log(median latency) on log(pixels), ``latency
    ~ c * pixels ** exponent``; ``{'exponent', 'r2', 'n'}``. An exponent of 1 is linear in pixels (convolutions,
    pooling), 2 quadratic (global attention over the tokens); ``r2`` is the fit's coefficient of determination (1:
    a straight line in log-log). Fewer than two distinct pixel counts: exponent and r2 None."""
    import numpy as np

    x = np.log(np.asarray(pixels, dtype=float))
    y = np.log(np.asarray(latencies_ms, dtype=float))
    if len(x) != len(y):
        raise ValueError(f'scaling_fit needs one latency per pixel count, got {len(x)} pixel counts and {len(y)} '
                         'latencies')
    if len(np.unique(x)) < 2:
        return {'exponent': None, 'r2': None, 'n': len(x)}
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (slope * x + intercept)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    return {'exponent': float(slope), 'r2': 1.0 - residual / total if total > 0 else 1.0, 'n': len(x)}


def _extent(size) -> tuple:
    """The spatial part of one sample's shape: (H, W) of a (C, H, W) image, the shape itself otherwise ((T,) tokens)."""
    size = tuple(size)
    return size[1:] if len(size) == 3 else size


def scaling_rows(rows: list[dict]) -> list[dict]:
    """The fit of ``scaling_fit`` per model, runtime, dtype and batch size among ``run``'s rows (those measured at
    two or more sizes): ``{'model', 'runtime', 'dtype', 'batch_size', 'sizes', 'exponent', 'r2', 'n'}``."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r['model'], r.get('runtime', 'eager'), r.get('dtype', 'float32'), r['batch_size'])
        groups.setdefault(key, []).append(r)
    out = []
    for (model, runtime, dtype, bs), rs in groups.items():
        rs = sorted(rs, key=lambda r: math.prod(_extent(r['input_size'])))
        if len({tuple(r['input_size']) for r in rs}) < 2:
            continue
        fit = scaling_fit([math.prod(_extent(r['input_size'])) for r in rs], [r['median_ms'] for r in rs])
        out.append({'model': model, 'runtime': runtime, 'dtype': dtype, 'batch_size': bs,
                    'sizes': ' '.join('x'.join(map(str, _extent(r['input_size']))) for r in rs), **fit})
    return out


def check_device(device: str, runtimes=('eager',)) -> str:
    """``device`` if zoo bench can time on it here: ``cpu``, or ``cuda``/``cuda:N`` when PyTorch sees that GPU
    (eager and compile only: zoo's ONNX Runtime and OpenVINO sessions run on the CPU); else a one-line error."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f'unknown device {device!r}; expected cpu or cuda (cuda:N for one GPU)') from None
    if dev.type not in ('cpu', 'cuda'):
        raise ValueError(f'unknown device {device!r}; expected cpu or cuda (cuda:N for one GPU)')
    if dev.type == 'cuda':
        if not torch.cuda.is_available():
            raise ValueError(f'--device {device} needs a CUDA GPU, and PyTorch sees none here (torch '
                             f'{torch.__version__}, built with CUDA {torch.version.cuda}); time on --device cpu')
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f'--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), '
                             f'cuda:0 to cuda:{torch.cuda.device_count() - 1}')
        other = [r for r in runtimes if r not in ('eager', 'compile')]
        if other:
            raise ValueError(f'--device {device} times eager and compile; {", ".join(other)} run(s) on the CPU '
                             '(time them with --device cpu)')
    return str(dev)


def run(names: list[str], vs: str | None = None, batch_sizes=(1,), img_size=None,
        repeats: int = MIN_REPEATS, warmup: int = WARMUP, threads: int | None = None, dtype: str = 'float32',
        mode: str = 'inference', num_classes: int | None = None, budget_s: float | None = BUDGET_S,
        max_repeats: int | None = None, runtimes=('eager',), compile_mode: str | None = None,
        warn=None, device: str = 'cpu') -> list[dict]:
    """Benchmark each model (and the ``vs`` reference) in each runtime at each batch size: one dict per
    (model, runtime, batch). Every runtime of every model at one batch size runs interleaved in one process
    under the one timer (``profile.benchmark``).

    ``runtimes``: among ``zoo.RUNTIMES`` (eager is always measured: the others are compared with it). Each row
    has ``runtime``, ``compile_s`` (``zoo.optimize`` plus the first call: compile or export time; at later batch
    sizes the first call alone, as the graph is reused), ``vs_eager``
    (this runtime's throughput over eager's, same model) and ``max_abs_diff_eager`` (largest output difference
    from eager on the timed input); the zoo model's rows also have ``speedup`` (its throughput over the
    reference's in the same runtime) and ``max_abs_diff`` (logits against the reference with its weights).
    ``dtype`` bfloat16 (or float16) runs eager and compile under autocast; ONNX Runtime and OpenVINO stay float32
    (said once to ``warn``). A runtime that fails on a model (export or compile error) is reported to ``warn`` and
    left out.

    ``img_size``: one size (int), or several (a resolution sweep): each model is built once and timed at every
    size, all sizes interleaved in one process, one row per size (its ``input_size``); ``scaling_rows`` fits the
    exponent. A size a model cannot take is skipped with its reason to ``warn`` (``size_problem``).

    ``device``: ``cpu``, or ``cuda`` (``check_device``): models and inputs on the GPU, each call timed with CUDA
    events after a synchronize (``zoo._timing``), the peak memory of one call (``peak_mem_mb``) and the GPU's name,
    driver and clocks in each row."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    _set_threads(threads)
    runtimes = parse_runtimes(runtimes)
    device = check_device(device, runtimes)
    sizes = _sizes(img_size)
    if vs and len(sizes) > 1:
        raise ValueError('--vs compares two models at one size; give one --img-size (or none)')
    if mode != 'inference' and runtimes != ('eager',):
        raise ValueError(f'--mode {mode} times training steps, which only the eager runtime runs; '
                         'other runtimes are inference only')
    tdtype = resolve_dtype(dtype)
    low = None if tdtype == torch.float32 else tdtype
    if low is not None and any(r not in ('eager', 'compile') for r in runtimes):
        warn(f'zoo bench: the ONNX runtimes take float32 inputs; only eager and compile run {dtype}')
    rows = []
    for name in names:
        base = _build(name, vs, num_classes)
        task = tasks.task_of(name)
        # one entry per (model, size): label -> (module, one sample's shape, the model's name)
        entries = {}
        for s in sizes:
            size = tasks.input_size(name, img_size=s)
            shown = 'x'.join(map(str, _extent(size)))
            label = name if len(sizes) == 1 else f'{name} @{shown}'
            if label in entries:     # a task whose input ignores the image size (token ids): one entry
                continue
            why = size_problem(base, size, task) if len(sizes) > 1 else None
            if why:
                warn(f'zoo bench: {name} skipped at {shown}: {why}')
                continue
            entries[label] = (base, size, name)
        if not entries:
            continue
        if vs:
            entries[vs] = (_reference(vs, base, num_classes), entries[name][1], vs)
        models = {k: e[0] for k, e in entries.items()}
        diff = max_logit_diff(base, models[vs], entries[name][1], task) if vs else None
        static = {n: {**count_params(m), 'arch_fingerprint': fingerprint(m),
                      'macs': count_macs(m, example=example_input(m, entries[n][1], 1, task))}
                  for n, m in models.items()}
        for m in dict.fromkeys(models.values()):    # (one module serves every size)
            m.to(device)
        prepared = {}                                           # (entry, runtime) -> its module, or None: failed
        for bs in batch_sizes:
            inputs = {n: example_input(m, entries[n][1], bs, task).to(device) for n, m in models.items()}
            plain = runtimes == ('eager',) and low is None    # one eager float32 module per model, as it is
            timed = {}                                          # key -> (entry, runtime, module, max |Δ|, secs)
            if plain:
                timed = {n: (n, 'eager', m.eval(), None, None) for n, m in models.items()}
            done, eager_out = {}, {}
            # every model's exports before any compile: an export lets einops cache the tracer's tensor types, a
            # global that compiled graphs guard on, so a graph compiled before a later export recompiled on its
            # first timed call (and the compile time was not reported)
            order = [rt for rt in runtimes if rt != 'compile'] + [rt for rt in runtimes if rt == 'compile']
            for rt in order if not plain else ():
                d = low if rt in ('eager', 'compile') else None
                for n, m in models.items():
                    if prepared.get((n, rt), True) is None:
                        continue
                    try:
                        net, out, secs = _prepare(m, rt, inputs[n], d, compile_mode, prepared.get((n, rt)))
                    except Exception as e:  # a runtime failing on one model is a result, not a crash
                        warn(f'zoo bench: {n} in {rt} failed: {error_summary(e)}')
                        prepared[n, rt] = None
                        continue
                    prepared[n, rt] = net
                    if rt == 'eager':       # the reference of every runtime: eager float32
                        with torch.inference_mode():
                            eager_out[n] = _compared(m.eval(), inputs[n]) if d is not None else out
                    done[n, rt] = (n, rt, net, _max_diff(out, eager_out[n]) if n in eager_out else None, secs)
            for (n, rt), (_, _, net, d_eager, secs) in done.items():
                if rt == 'compile':         # a recompile caused by anything prepared after it counts as compile time
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        net(inputs[n])
                    done[n, rt] = (n, rt, net, d_eager, secs + time.perf_counter() - t0)
            timed.update({f'{n} [{rt}]': done[n, rt] for n in models for rt in runtimes if (n, rt) in done})
            lat: dict[str, Latency] = benchmark(
                {k: t[2] for k, t in timed.items()}, batch_size=bs, threads=threads,
                dtype=dtype if plain else 'float32', mode=mode, inputs={k: inputs[t[0]] for k, t in timed.items()},
                device=device, **_timing(repeats, warmup, budget_s * len(timed) if budget_s else None, max_repeats))
            for key, (n, rt, _, d_eager, secs) in timed.items():
                res = lat[key]
                res.model, res.runtime, res.compiled = entries[n][2], rt, rt == 'compile'
                res.dtype = dtype if rt in ('eager', 'compile') else 'float32'
                res.compile_mode = (compile_mode or 'default') + '+freezing' if rt == 'compile' else None
                row = {**static[n], **res.as_dict(), 'source': 'bench', 'label': key}
                # plain: every row is eager float32 itself, the output the others are compared with
                row['max_abs_delta'] = 0.0 if plain else d_eager
                if not plain:
                    row.update(compile_s=secs, max_abs_diff_eager=d_eager)
                eager_key = next((k for k, t in timed.items() if t[0] == n and t[1] == 'eager'), None)
                if eager_key is not None and rt != 'eager':
                    row['vs_eager'] = res.throughput / lat[eager_key].throughput
                if vs and n == name:
                    row['vs'], row['max_abs_diff'] = vs, diff
                    ref_key = next((k for k, t in timed.items() if t[0] == vs and t[1] == rt), None)
                    if ref_key is not None:
                        row['speedup'] = res.throughput / lat[ref_key].throughput
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
        hparams = r.hparams if isinstance(r.hparams, dict) else {}
        spec = hparams.get('network')
        if not isinstance(spec, dict) or not spec.get('name'):
            warn(f'zoo bench: skipped {r.model} (run {r.id}): it recorded no network spec (a run of a system that '
                 f'is not a zoo ZooSystem, or recorded before they did)')
            continue
        kwargs = dict(spec.get('kwargs') or {})
        # runs recorded before the spec carried the ConvBN mode have it in the system's hparams only
        convbn_mode = spec.get('convbn_mode') or hparams.get('convbn_mode')
        try:
            net = zoo.create(spec['name'], **kwargs)
            if convbn_mode is not None:
                from zoo.layers.convbn import set_mode
                set_mode(net, convbn_mode)
            net.eval()
        except (KeyError, ValueError, TypeError) as e:
            warn(f'zoo bench: skipped {r.model} (run {r.id}): cannot rebuild it: {e}')
            continue
        if fp and fingerprint(net) != fp:
            warn(f'zoo bench: skipped {r.model} (run {r.id}): rebuilt from its recorded spec it is not the recorded '
                 f'network (fingerprint {fingerprint(net)} != {fp})')
            continue
        size = tuple(spec.get('input_size') or tasks.input_size(spec['name']))
        shown = {k: v for k, v in kwargs.items() if k not in ('num_classes', 'in_chans', 'img_size', 'vocab_size')}
        if convbn_mode is not None:
            shown['convbn_mode'] = convbn_mode
        label = r.model + (f' ({", ".join(f"{k}={v}" for k, v in sorted(shown.items()))})' if shown else '')
        out.append(dict(name=r.model, label=label, model=net, input_size=size, task=r.task, fingerprint=fp))
    return out


def remeasure(db, task: str | None = None, dataset: str | None = None, model: str | None = None,
              repeats: int = MIN_REPEATS, warmup: int = WARMUP, threads: int | None = None,
              budget_s: float | None = BUDGET_S, max_repeats: int | None = None, warn=None, run_ids=None,
              batch_sizes=(1,), runtimes=('eager',), failures: list | None = None, attempts: int = 3,
              sleep=time.sleep) -> list[dict]:
    """Measure every network ``recorded_networks`` finds, interleaved in one process (each gets
    ``budget_s`` seconds of the shared budget), at each of ``batch_sizes`` (default batch 1) and in each of
    ``runtimes`` (default eager; others through ``zoo.optimize``); one row per network, runtime and batch size,
    ready for ``record``, with ``max_abs_delta``: its largest output difference from eager on the timed input.

    Only trusted records are returned (``untrusted``): before each timing the machine is given time to quiet
    down (``wait_for_quiet``, sleeping with ``sleep``), and a record that is untrusted is timed again, up to
    ``attempts`` timings in all. A runtime failing on a network, and a record still untrusted after the last
    attempt (error ``'untrusted: <reason>'``), is reported to ``warn``, left out, and appended to ``failures``
    (when given) as ``{'model', 'arch_fingerprint', 'input_size', 'batch_size', 'runtime', 'error'}``, which
    ``record`` also writes: a loaded or noisy figure is never published."""
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    if attempts < 1:
        raise ValueError(f'attempts must be at least 1, got {attempts}')
    _set_threads(threads)
    nets = recorded_networks(db, task, dataset, model, warn, run_ids)
    if not nets:
        raise ValueError('no finished run in the database matches'
                         + ''.join(f' {k}={v!r}' for k, v in (('task', task), ('dataset', dataset), ('model', model))
                                   if v) + '; nothing to measure')
    runtimes = tuple(runtimes)
    one = {n['label']: example_input(n['model'], n['input_size'], 1, n['task']) for n in nets}
    macs = {n['label']: count_macs(n['model'], example=one[n['label']]) for n in nets}

    def failed(n, rt, bs, error):
        warn(f"zoo bench: {n['label']} in {rt} failed: {error}")
        if failures is not None:
            failures.append({'model': n['name'], 'arch_fingerprint': fingerprint(n['model']),
                             'input_size': n['input_size'], 'batch_size': bs, 'runtime': rt, 'error': error})

    rows = []
    for bs in batch_sizes:
        inputs = {n['label']: example_input(n['model'], n['input_size'], bs, n['task']) for n in nets}
        timed = {}                       # key -> (network record, runtime, module, max |delta| from eager)
        for n in nets:
            x = inputs[n['label']]
            with torch.inference_mode():
                eager_out = _compared(n['model'], x)
            for rt in runtimes:
                if rt == 'eager':
                    timed[n['label'] if runtimes == ('eager',) else f"{n['label']} [eager]"] = (n, rt, n['model'], 0.0)
                    continue
                try:
                    net, out, _ = _prepare(n['model'], rt, x, None, None)
                except Exception as e:  # a runtime failing on one network is a result, not a crash
                    first = (str(e).strip().splitlines() or [''])[0]
                    failed(n, rt, bs, f'{type(e).__name__}: {first}'[:300])
                    continue
                timed[f"{n['label']} [{rt}]"] = (n, rt, net, _max_diff(out, eager_out))
        kept, pending, reasons = {}, list(timed), {}
        for _ in range(attempts):
            if not pending:
                break
            wait_for_quiet(sleep)    # the preparing above (export, compile) or the last timing loaded the machine
            lat = benchmark({k: timed[k][2] for k in pending},
                            inputs={k: inputs[timed[k][0]['label']] for k in pending}, threads=threads, batch_size=bs,
                            **_timing(repeats, warmup, budget_s * len(pending) if budget_s else None, max_repeats))
            for key in pending:
                n, rt, _, delta = timed[key]
                res = lat[key]
                res.model, res.runtime, res.compiled = n['name'], rt, rt == 'compile'
                res.compile_mode = 'default+freezing' if rt == 'compile' else None
                row = {**count_params(n['model']), **res.as_dict(), 'label': n['label'], 'source': 'bench',
                       'arch_fingerprint': fingerprint(n['model']), 'macs': macs[n['label']], 'max_abs_delta': delta}
                reasons[key] = untrusted(row)
                if reasons[key] is None:
                    kept[key] = row
            pending = [k for k in pending if k not in kept]
        for key in pending:              # untrusted at every attempt: a failure, never a row
            n, rt, _, _ = timed[key]
            failed(n, rt, bs, f'untrusted: {reasons[key]} ({attempts} attempt{"s" * (attempts > 1)})')
        rows += [kept[k] for k in timed if k in kept]
    return rows


# ------------------------------------------------------------------------------------------ output
def record(rows: list[dict], db=None, failures=()) -> int:
    """Write ``run()``'s rows to the results database (one latency row each), and ``remeasure``'s ``failures``
    (one failure row each); returns how many latency rows."""
    from .results import open_db

    store = open_db(db)
    for r in rows:
        store.add_latency_record(r)
    for f in failures:
        store.add_latency_failure(f['model'], f['error'], input_shape=f['input_size'], batch_size=f['batch_size'],
                                  runtime=f['runtime'], arch_fingerprint=f['arch_fingerprint'])
    return len(rows)


def print_table(rows: list[dict]) -> None:
    from rich.table import Table

    from zoo._console import console

    r0 = rows[0] if rows else {}
    load = f", load {r0['load_1m']:.2f} on {r0['cpus']} CPUs before" if r0.get('load_1m') is not None else ''
    if r0.get('load_1m_start') is not None and r0.get('load_1m') is not None:
        load = (f", 1-minute load {r0['load_1m_start']:.2f} on {r0['cpus']} CPUs at the start, "
                f"{r0['load_1m']:.2f} before timing")
    runtimes = any('compile_s' in r or r.get('runtime', 'eager') != 'eager' for r in rows)
    gpu = r0.get('gpu_name')
    where = (f"{gpu}, driver {r0.get('gpu_driver') or '?'}" if gpu else r0.get('cpu_model') or _cpu())
    table = Table(title=f"zoo bench ({'GPU, CUDA events' if gpu else 'CPU'}, median and IQR over repeats, models "
                        f'interleaved{load})' + (f'\n{where}' if runtimes or gpu else ''))
    cols = ['model', 'input', 'params (M)', 'MACs (G)', 'batch', 'threads', 'repeats', 'median ms', 'IQR ms',
            'samples/s', 'speedup', 'max |Δ| logits']
    if runtimes:
        cols[1:1] = ['runtime', 'dtype']
        cols += ['vs eager', 'max |Δ| eager', 'compile/export s']
    if gpu:
        cols.append('peak MiB')
    for col in cols:
        table.add_column(col, justify='left' if col in ('model', 'runtime', 'dtype') else 'right')
    for r in rows:
        name = r.get('label', r['model'])  # a re-measured network's label names its run; here the runtime is a column
        cells = [name.removesuffix(f" [{r['runtime']}]") if runtimes else name, 'x'.join(map(str, r['input_size'])),
                 f"{r['params'] / 1e6:.2f}", '' if r['macs'] is None else f"{r['macs'] / 1e9:.3f}",
                 str(r['batch_size']), str(r['threads']), str(r['repeats']), f"{r['median_ms']:.2f}",
                 f"{r['iqr_ms']:.2f}", f"{r['throughput']:.1f}", f"{r['speedup']:.2f}x" if 'speedup' in r else '',
                 '' if r.get('max_abs_diff') is None else f"{r['max_abs_diff']:.1e}"]
        if runtimes:
            cells[1:1] = [r['runtime'], r['dtype']]
            cells += [f"{r['vs_eager']:.2f}x" if 'vs_eager' in r else '',
                      '' if r.get('max_abs_diff_eager') is None else f"{r['max_abs_diff_eager']:.1e}",
                      '' if r.get('compile_s') is None else f"{r['compile_s']:.1f}"]
        if gpu:
            cells.append('' if r.get('peak_mem_mb') is None else f"{r['peak_mem_mb']:.0f}")
        table.add_row(*cells)
    console().print(table)


def print_scaling(fits: list[dict]) -> None:
    """``scaling_rows``'s fits as a table: per model (and runtime, dtype, batch) the exponent of latency ~
    pixels^k and its R^2."""
    from rich.table import Table

    from zoo._console import console

    table = Table(title='latency ~ pixels^k (least squares on log median latency against log pixels)')
    for col in ('model', 'runtime', 'dtype', 'batch', 'sizes', 'k', 'R^2'):
        table.add_column(col, justify='right' if col in ('batch', 'k', 'R^2') else 'left')
    for f in fits:
        table.add_row(f['model'], f['runtime'], f['dtype'], str(f['batch_size']), f['sizes'],
                      f"{f['exponent']:.2f}", f"{f['r2']:.3f}")
    console().print(table)


NOISY_IQR = 0.10       # an IQR above this fraction of the median: the timings spread too much to quote
BUSY_LOAD = 0.25       # a 1-minute load above this per CPU when zoo bench started: something else was running


def noise_warning(rows: list[dict]) -> str | None:
    """One line saying which rows were timed on a busy or noisy machine (load average above ``BUSY_LOAD`` per CPU,
    or IQR above ``NOISY_IQR`` of the median), or None. A hypervisor's other guests do not show in the load
    average, only in the spread, hence both. The load is the one when the command started (``load_1m_start``)
    where known: the load just before timing also counts the command's own compiling and exporting."""
    spread = [(r['iqr_ms'] / r['median_ms'], r) for r in rows if r.get('median_ms') and r.get('iqr_ms') is not None]
    noisy = [(f, r) for f, r in spread if f > NOISY_IQR]
    start = any(r.get('load_1m_start') is not None for r in rows)
    key = 'load_1m_start' if start else 'load_1m'
    busy = [r for r in rows if r.get(key) is not None and r.get('cpus') and r[key] / r['cpus'] > BUSY_LOAD]
    if not noisy and not busy:
        return None
    parts = []
    if busy:
        parts.append(f"1-minute load {max(r[key] for r in busy):.2f} on {busy[0]['cpus']} CPUs "
                     + ('when it started' if start else 'before timing'))
    if noisy:
        f, r = max(noisy, key=lambda t: t[0])
        name = r.get('label', r['model'])
        parts.append(f'IQR above {NOISY_IQR:.0%} of the median in {len(noisy)} of {len(rows)} rows (largest '
                     f"{f:.0%}: {name}, batch {r['batch_size']})")
    return 'zoo bench: a busy or noisy machine: ' + '; '.join(parts) + '. Re-take these figures on a quiet machine ' \
           'before quoting them.'


# ------------------------------------------------------------------------------ which latency records are trusted
MAX_IQR_RATIO = 0.15   # a published record's IQR at most this fraction of its median (issue 43)
QUIET_WAIT_S = 90.0    # at most this long waiting for the load to fall before a timing (the 1-minute load
QUIET_POLL_S = 5.0     # average decays with a 60 s time constant; the kernel updates it every 5 s)


def trust_limits() -> tuple[float, float]:
    """``(busy load per CPU, IQR/median)`` above which a record is untrusted: ``BUSY_LOAD`` and
    ``MAX_IQR_RATIO``, or ``$ZOO_BUSY_LOAD`` and ``$ZOO_MAX_IQR_RATIO`` where set (e.g. ``inf`` in the test
    suite, whose own workers keep a 2-core machine at a load of 1 per CPU and whose figures nobody publishes)."""
    def limit(name, default):
        text = os.environ.get(name, '').strip()
        try:
            return float(text) if text else default
        except ValueError:
            raise ValueError(f'${name} must be a number (a limit such as {default}, or inf), got {text!r}') from None
    return limit('ZOO_BUSY_LOAD', BUSY_LOAD), limit('ZOO_MAX_IQR_RATIO', MAX_IQR_RATIO)


def own_load(threads, duration_s) -> float:
    """What the timing itself adds to the 1-minute load average it ends at: the kernel's average moves towards the
    number of runnable threads with a 60 s time constant, so ``threads`` threads busy for ``duration_s`` seconds
    add ``threads * (1 - exp(-duration_s / 60))``; 0.0 when either is unknown."""
    if not threads or not duration_s:
        return 0.0
    return float(threads) * (1.0 - math.exp(-float(duration_s) / 60.0))


def untrusted(row) -> str | None:
    """Why a latency record (a row of ``run``/``remeasure``, or of ``zoo_latency``) must not be published, in one
    line, or None when it may: the one rejection rule of ``remeasure`` and ``results.pick_latency`` (issue 43).

    Untrusted when the 1-minute load average per CPU is above the busy limit (``BUSY_LOAD``, 0.25) before the
    timing (``load_1m``) or after it (``load_1m_after``, less what the timing's own threads add: ``own_load``),
    or when the IQR is above ``MAX_IQR_RATIO`` (0.15) of the median (a hypervisor's other guests show in the
    spread, not in the load). A figure that is not recorded (a record older than schema 4, no CPU count) cannot
    be held against the record; exactly at a limit is trusted."""
    busy, spread = trust_limits()
    from .results.data import as_float as _number        # one reading of a stored field, shared with data()

    cpus = _number(row.get('cpus'))
    before, after = _number(row.get('load_1m')), _number(row.get('load_1m_after'))
    before = before / cpus if before is not None and cpus else None
    if after is not None and cpus:
        after = max(0.0, after - own_load(_number(row.get('threads')), _number(row.get('duration_s')))) / cpus
    else:
        after = None
    median, iqr = _number(row.get('median_ms')), _number(row.get('iqr_ms'))
    ratio = iqr / median if iqr is not None and median else None
    why = [w for w, bad in (('busy', any(v is not None and v > busy for v in (before, after))),
                            ('noisy', ratio is not None and ratio > spread)) if bad]
    if not why:
        return None

    def fmt(v):
        return '?' if v is None else f'{v:.2f}'
    return (f"{' and '.join(why)}: 1-minute load {fmt(before)} per CPU before timing, {fmt(after)} after (less its "
            f"own threads), IQR/median {fmt(ratio)}; limits {busy:g} per CPU and {spread:g}")


def trusted(records):
    """The rows of a ``zoo_latency`` DataFrame that ``untrusted`` accepts (the benchmark runner counts only these
    as measured)."""
    if records is None or records.empty:
        return records
    return records[[untrusted(r) is None for r in records.to_dict('records')]]


def wait_for_quiet(sleep=time.sleep, limit_s: float | None = None) -> float | None:
    """Sleep ``QUIET_POLL_S`` seconds at a time (``limit_s`` in all, default ``QUIET_WAIT_S``) until the 1-minute
    load per CPU is at most the busy limit; returns the last load per CPU (None where the platform has no load
    average). Bounded: on a machine that stays busy the timing goes ahead, and ``untrusted`` judges its record."""
    from . import profile     # looked up at the call: tests replace profile.load_average

    busy, cpus = trust_limits()[0], os.cpu_count() or 1
    for _ in range(int((QUIET_WAIT_S if limit_s is None else limit_s) // QUIET_POLL_S)):
        load = profile.load_average()
        if load is None or load / cpus <= busy:
            break
        sleep(QUIET_POLL_S)
    load = profile.load_average()
    return None if load is None else load / cpus


def _cpu() -> str:
    from .profile import machine

    m = machine()
    return f"{m['cpu_model']} ({', '.join(m['isa']) or 'no AVX2'})"
