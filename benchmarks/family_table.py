"""One model per family in every runtime (issue 26): the per-family latency table with the CPU named.

For each model: median ms at each batch size in eager, ``torch.compile`` (inductor, freezing), ONNX Runtime,
OpenVINO (when importable), bf16 eager and bf16 compile (CPU autocast), all through ``zoo.eval.bench.run`` (so
``zoo.optimize``, the one timer and the one MAC counter of ``zoo bench``: the float32 runtimes of a model
interleaved in one process, the bf16 ones in a second ``run``); for the families whose code takes the oneDNN
door (``zoo.layers.onednn``), eager with the door open against eager with ``ZOO_ONEDNN=0`` (read on every call),
interleaved with each other (``zoo.eval.profile.benchmark``). Then fp32 GMAC/s (MACs per sample x batch / the
fastest fp32 runtime's median) against the CPU's fp32 peak (``fp32_peak``: an estimate, see there) and against what
one large fp32 matrix product reaches on it (``gemm_roof``, measured).

    python -m benchmarks.family_table --repeats 10 --threads 2           # the whole table (docs/runtimes.md)
    python -m benchmarks.family_table --models poolformer_s12 tnt_s --batch-sizes 1 16 --repeats 10
    python -m benchmarks.family_table --models poolformer_tiny --batch-sizes 1 2 --repeats 1   # smoke
    python -m benchmarks.family_table --table a.jsonl b.jsonl           # print the table of earlier --out files

A model is ``NAME[@IMG][:B,B,...]``: ``@IMG`` sets the image side (default: the registered size), ``:B,...``
the batch sizes of that model (default ``--batch-sizes``). ``--out FILE`` appends every measured cell as a JSON
line, so the table can be measured in parts and printed whole with ``--table``. Quote figures from a quiet
machine only; the load (``uptime``) is printed before and after.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
from torch import nn
from zoo.eval import bench
from zoo.eval.profile import benchmark, example_input, interleave, machine, versions

import zoo
from benchmarks.runtimes import cpu_model

# One full-size model per family, at its registered input size unless @IMG says otherwise. PIIP-TSB (17 GMAC at
# 368 px, 144 M parameters) at batch 1 only: at batch 16 one call is ~280 GMAC, several seconds in each of six
# runtimes, which alone would take a quarter of the table's budget; piip_tiny (64 px) would say nothing about
# the full-size family's speed. Mamba-YOLO-T at 640 px at batch 1 only (one eager call ~0.6 s, ONNX Runtime ~1.3
# s). VGG-11 rather than VGG-16: the same family at half the MACs (7.6 against 15.5 GMAC) and half the time.
MODELS = ('poolformer_s12', 'tnt_s', 'raftmlp_s', 'stripmlp_t_star', 'resnet50', 'vgg11', 'piip_tsb:1',
          'mamba_yolo_t@640:1', 'semfpn_seg', 'yolo_det')
COLUMNS = ('eager', 'eager ZOO_ONEDNN=0', 'compile', 'onnxruntime', 'openvino', 'bf16 eager', 'bf16 compile')
RUNTIMES = ('eager', 'compile', 'onnxruntime', 'openvino', 'bf16-eager', 'bf16-compile', 'onednn-off')
FP32 = ('eager', 'compile', 'onnxruntime', 'openvino')
DOOR = 'zoo.layers.onednn'


# ------------------------------------------------------------------------------------------ the CPU's peak
def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(['lscpu'], check=False, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (ln.partition(':') for ln in out.splitlines()) if v}


def _cpuinfo_mhz() -> float | None:
    try:
        with open('/proc/cpuinfo') as f:
            return next((float(ln.split(':')[1]) for ln in f if ln.startswith('cpu MHz')), None)
    except (OSError, ValueError):
        return None


def fma_lanes(vendor: str, family: int | None, flags: set[str]) -> tuple[int, int, str]:
    """(FMA units per core, bits each one handles per cycle, why) for the fp32 peak.

    - AMD family 25 (Zen 3, Zen 4): two 256-bit FMA pipes; Zen 4 runs an AVX-512 instruction as two 256-bit
      halves (two pipes together), so AVX-512 does not raise its FMA peak: 2 x 8 fp32 lanes.
    - AMD family 26 (Zen 5): two 512-bit FMA pipes on desktop and server parts (mobile parts keep 256 bits).
    - Intel with AVX-512: two 512-bit FMA units (Xeon Scalable Gold/Platinum, Sapphire Rapids); parts with one
      (some Silver/Bronze, client cores) have half this peak.
    - otherwise with FMA (AVX2): two 256-bit units; without FMA: one 128-bit unit (no fused multiply-add)."""
    if vendor == 'AuthenticAMD' and family == 25:
        return 2, 256, 'AMD family 25 (Zen 3/4): 2 FMA pipes x 256 bit (AVX-512 runs as two 256-bit halves)'
    if vendor == 'AuthenticAMD' and family == 26:
        return 2, 512, 'AMD family 26 (Zen 5): 2 FMA pipes x 512 bit'
    if vendor == 'GenuineIntel' and 'avx512f' in flags:
        return 2, 512, 'Intel with AVX-512: 2 FMA units x 512 bit (1 on some parts: then half)'
    if 'fma' in flags:
        return 2, 256, 'AVX2 + FMA: 2 FMA units x 256 bit'
    return 1, 128, 'no FMA flag: 1 unit x 128 bit'


def fp32_peak(threads: int, clock_ghz: float | None = None) -> dict:
    """Estimate of the CPU's fp32 peak for ``threads`` threads, from ``lscpu``:

        peak GMAC/s = cores used x clock (GHz) x FMA units per core x fp32 lanes per unit (bits / 32)
        peak GFLOP/s = 2 x peak GMAC/s (one FMA = one multiply-add = 2 FLOPs)

    cores used = min(threads, physical cores); clock = ``lscpu``'s max MHz, else the ``cpu MHz`` of
    /proc/cpuinfo (a virtual machine often reports only the nominal/TSC clock: under boost the real peak is
    higher and the % of peak reads high). An estimate: sustained AVX clocks, one-FMA-unit parts and SMT are not
    modelled. ``clock_ghz`` overrides the clock."""
    info = _lscpu()
    flags = set(info.get('Flags', '').split()) or set()
    if not flags:
        try:
            with open('/proc/cpuinfo') as f:
                flags = set(next((ln.split(':')[1] for ln in f if ln.startswith('flags')), '').split())
        except OSError:
            pass
    family = int(info['CPU family']) if info.get('CPU family', '').isdigit() else None
    units, bits, why = fma_lanes(info.get('Vendor ID', ''), family, flags)
    try:
        physical = int(info['Core(s) per socket']) * int(info.get('Socket(s)', '1'))
    except (KeyError, ValueError):
        physical = os.cpu_count() or 1
    cores = max(1, min(threads, physical))
    src = 'given'
    if clock_ghz is None:
        mhz, src = (float(info['CPU max MHz']), 'lscpu max MHz') if info.get('CPU max MHz') else (_cpuinfo_mhz(),
                                                                                                 '/proc/cpuinfo cpu MHz')
        clock_ghz = (mhz or 0.0) / 1000
    gmacs = cores * clock_ghz * units * bits / 32
    return {'cores': cores, 'clock_ghz': clock_ghz, 'clock_source': src, 'fma_units': units, 'bits': bits,
            'why': why, 'gmacs': gmacs, 'gflops': 2 * gmacs,
            'formula': f'{cores} cores x {clock_ghz:.2f} GHz ({src}) x {units} FMA x {bits // 32} fp32 lanes '
                       f'= {gmacs:.1f} GMAC/s = {2 * gmacs:.1f} GFLOP/s'}


def gemm_roof(n: int = 2048, repeats: int = 5) -> float:
    """GMAC/s of one large fp32 matrix product (n x n by n x n, n^3 MACs) at torch's thread count, median of
    ``repeats`` calls under the one timer: what this CPU reaches in practice, beside the estimated peak (which a
    virtual machine's under-reported clock can put below it)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = statistics.median(interleave({'mm': lambda: torch.mm(a, b)}, repeats=repeats, warmup=2)['mm'])
    return n ** 3 / (ms / 1e3) / 1e9


def uptime() -> str:
    try:
        return subprocess.run(['uptime'], check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f'load average {os.getloadavg()[0]:.2f}' if hasattr(os, 'getloadavg') else 'load unknown'


# ------------------------------------------------------------------------------------------ the oneDNN door
def takes_onednn_door(model: nn.Module) -> bool:
    """Some module of ``model`` is defined in a file that calls the oneDNN door (imports from
    ``zoo.layers.onednn``): eager float32 inference may take the fused kernels."""
    for m in model.modules():
        src = sys.modules.get(type(m).__module__)
        if src is not None and any(getattr(v, '__module__', None) == DOOR for v in vars(src).values() if callable(v)):
            return True
    return False


class DoorShut(nn.Module):
    """``model`` with ``ZOO_ONEDNN=0`` for the length of each call (``zoo.layers.onednn`` reads it on every call),
    so door open and door shut run interleaved in one process."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        old = os.environ.get('ZOO_ONEDNN')
        os.environ['ZOO_ONEDNN'] = '0'
        try:
            return self.model(x)
        finally:
            if old is None:
                os.environ.pop('ZOO_ONEDNN', None)
            else:
                os.environ['ZOO_ONEDNN'] = old


# ------------------------------------------------------------------------------------------ measuring
def parse_model(spec: str, batch_sizes) -> tuple[str, int | None, tuple[int, ...]]:
    m = re.fullmatch(r'([\w.-]+?)(?:@(\d+))?(?::(\d+(?:,\d+)*))?', spec)
    if m is None:
        raise ValueError(f'bad model {spec!r}; expected NAME[@IMG][:B,B,...], e.g. mamba_yolo_t@640:1')
    name, img, bs = m.groups()
    if name not in zoo.list_models():
        import difflib
        close = difflib.get_close_matches(name, zoo.list_models(), n=3)
        raise ValueError(f'unknown model {name!r}' + (f' (close: {", ".join(close)})' if close else ''))
    return name, int(img) if img else None, tuple(int(b) for b in bs.split(',')) if bs else tuple(batch_sizes)


def _cells(rows: list[dict], column_of, family: str, spec: str) -> list[dict]:
    return [{'model': r['model'], 'spec': spec, 'family': family, 'input': list(r['input_size']),
             'batch': r['batch_size'], 'column': column_of(r), 'ms': r['median_ms'], 'macs': r['macs'],
             'setup_s': r.get('compile_s'), 'max_abs_diff_eager': r.get('max_abs_diff_eager'),
             'threads': r['threads'], 'repeats': r['repeats']} for r in rows]


def measure(spec: str, batch_sizes, runtimes, repeats: int, warmup: int, threads: int | None, warn) -> list[dict]:
    """Every cell of one model: one dict per (batch, column)."""
    name, img, bss = parse_model(spec, batch_sizes)
    family = zoo.model_info(name).family
    timing = {'batch_sizes': bss, 'img_size': img, 'repeats': repeats, 'warmup': warmup, 'threads': threads,
              'budget_s': 0, 'warn': warn}
    cells = []
    fp32 = [r for r in FP32 if r in runtimes]
    if fp32:
        rows = bench.run([name], runtimes=fp32, **timing)
        cells += _cells(rows, lambda r: r['runtime'], family, spec)
    low = [r for r in ('eager', 'compile') if f'bf16-{r}' in runtimes]
    if low:
        rows = bench.run([name], runtimes=low, dtype='bfloat16', **timing)
        cells += _cells(rows, lambda r: f"bf16 {r['runtime']}", family, spec)
    if 'onednn-off' in runtimes:
        model = zoo.create(name).eval()
        if takes_onednn_door(model):
            size = zoo.tasks.input_size(name, img_size=img)
            for bs in bss:
                x = example_input(model, size, bs)
                lat = benchmark({'open': model, 'shut': DoorShut(model)}, batch_size=bs, repeats=repeats,
                                warmup=warmup, threads=threads, inputs={'open': x, 'shut': x})
                for key, column in (('open', 'eager (A/B)'), ('shut', 'eager ZOO_ONEDNN=0')):
                    cells.append({'model': name, 'spec': spec, 'family': family, 'input': list(size), 'batch': bs,
                                  'column': column, 'ms': lat[key].median_ms, 'macs': None, 'setup_s': None,
                                  'max_abs_diff_eager': None, 'threads': lat[key].threads,
                                  'repeats': len(lat[key].times_ms)})
        del model
    return cells


# ------------------------------------------------------------------------------------------ the table
def _ms(v: float | None) -> str:
    return '—' if v is None else (f'{v:,.0f}' if v >= 100 else f'{v:.1f}' if v >= 10 else f'{v:.2f}')


def table(cells: list[dict], peak: dict) -> str:
    """The markdown table: one row per (model, batch); fp32 GMAC/s of the fastest fp32 runtime and its % of peak."""
    by: dict[tuple, dict[str, dict]] = {}
    for c in cells:
        by.setdefault((c['model'], c['batch']), {})[c['column']] = c
    lines = ['| family | model | input | batch | GMAC / sample | ' + ' | '.join(COLUMNS)
             + ' | fastest fp32 | fp32 GMAC/s | % of peak | % of GEMM |', '|' + '---|' * (len(COLUMNS) + 9)]
    for (model, bs), cols in by.items():
        any_cell = next(iter(cols.values()))
        macs = next((c['macs'] for c in cols.values() if c['macs']), None)
        cells_txt = []
        for col in COLUMNS:
            c = cols.get(col)
            text = _ms(c['ms'] if c else None)
            if col == 'eager ZOO_ONEDNN=0' and c and 'eager (A/B)' in cols:   # door shut / door open, same session
                text += f" ({c['ms'] / cols['eager (A/B)']['ms']:.2f}x)"
            cells_txt.append(text)
        fp32 = {col: cols[col]['ms'] for col in FP32 if col in cols}
        best = min(fp32, key=fp32.get) if fp32 else None
        rate = macs * bs / (fp32[best] / 1e3) / 1e9 if best and macs else None
        pct = f'{100 * rate / peak["gmacs"]:.0f} %' if rate and peak['gmacs'] else '—'
        gemm = f'{100 * rate / peak["gemm"]:.0f} %' if rate and peak.get('gemm') else '—'
        lines.append(f"| {any_cell['family']} | {model} | {'x'.join(map(str, any_cell['input']))} | {bs} | "
                     f"{'—' if macs is None else f'{macs / 1e9:.2f}'} | {' | '.join(cells_txt)} | {best or '—'} | "
                     f"{'—' if rate is None else f'{rate:.1f}'} | {pct} | {gemm} |")
    return '\n'.join(lines)


def setup_table(cells: list[dict]) -> str:
    """Per runtime: what ``zoo.optimize`` and the first call took (compile or export) and the output's distance
    from fp32 eager (bf16: rounding)."""
    lines = ['| model | batch | runtime | compile / export + first call (s) | max abs diff vs fp32 eager |',
             '|---|---|---|---|---|']
    for c in cells:
        if c['column'] in ('eager', 'eager (A/B)', 'eager ZOO_ONEDNN=0'):
            continue
        setup, d = c['setup_s'], c['max_abs_diff_eager']
        lines.append(f"| {c['model']} | {c['batch']} | {c['column']} | {'—' if setup is None else f'{setup:.1f}'} | "
                     f"{'—' if d is None else f'{d:.1e}'} |")
    return '\n'.join(lines)


def header(peak: dict) -> str:
    v = versions()
    return (f"CPU: {cpu_model()}; {torch.get_num_threads()} threads; "
            + ', '.join(f'{k} {val}' for k, val in v.items())
            + f"\nfp32 peak (estimate): {peak['formula']}; {peak['why']}"
            + (f"\nfp32 GEMM (measured, 2048^3 torch.mm): {peak['gemm']:.1f} GMAC/s = "
               f"{100 * peak['gemm'] / peak['gmacs']:.0f} % of the estimate" if peak.get('gemm') else ''))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--models', nargs='+', default=list(MODELS), help='NAME[@IMG][:B,B,...] (default: one per family)')
    p.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 16])
    openvino = importlib.util.find_spec('openvino') is not None
    p.add_argument('--runtimes', nargs='+', choices=RUNTIMES,
                   default=[r for r in RUNTIMES if r != 'openvino' or openvino],
                   help='default: all (openvino when importable); onednn-off is the ZOO_ONEDNN=0 A/B of eager')
    p.add_argument('--repeats', type=int, default=10, help='timed rounds per batch (exactly this many)')
    p.add_argument('--warmup', type=int, default=1, help='untimed rounds after the first call (default 1)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--clock-ghz', type=float, default=None, help='override the clock of the peak estimate')
    p.add_argument('--out', help='append every measured cell to this JSON-lines file')
    p.add_argument('--table', nargs='+', metavar='JSONL', help='print the table of earlier --out files; measure nothing')
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = fp32_peak(torch.get_num_threads(), args.clock_ghz)
    if args.table:
        cells = []
        for path in args.table:
            with open(path) as f:
                cells += [json.loads(ln) for ln in f if ln.strip()]
        measured = sorted({f"{c.get('cpu', '?')}, {c['threads']} threads" for c in cells})
        print(f"measured on: {'; '.join(measured)}" + (' (MIXED: do not compare across them)' if len(measured) > 1
                                                       else ''))
        roofs = [c['gemm_gmacs'] for c in cells if c.get('gemm_gmacs')]
        peak['gemm'] = statistics.median(roofs) if roofs else None
        print(header(peak))
        print(table(cells, peak))
        print()
        print(setup_table(cells))
        return 0
    try:
        specs = [(s, parse_model(s, args.batch_sizes)) for s in args.models]
    except ValueError as e:
        print(f'family_table: {e}', file=sys.stderr)
        return 2
    notes = []

    def warn(msg):
        notes.append(msg)
        print(msg, file=sys.stderr)
    if os.environ.get('ZOO_ONEDNN') == '0':
        warn('ZOO_ONEDNN=0 is set for the whole run: the eager column is the door shut as well')
    peak['gemm'] = gemm_roof()
    print(header(peak))
    print(f'uptime before: {uptime()}', flush=True)
    t0, cells, cpu = time.perf_counter(), [], machine()['cpu_model']
    for spec, _ in specs:
        t1 = time.perf_counter()
        got = measure(spec, args.batch_sizes, args.runtimes, args.repeats, args.warmup, args.threads, warn)
        for c in got:
            c['cpu'], c['gemm_gmacs'] = cpu, peak['gemm']
        cells += got
        if args.out:
            with open(args.out, 'a') as f:
                f.writelines(json.dumps(c) + '\n' for c in got)
        print(f'[{spec}: {time.perf_counter() - t1:.0f} s]', file=sys.stderr, flush=True)
    print(f'uptime after: {uptime()} ({time.perf_counter() - t0:.0f} s in all)')
    print()
    print(f'median ms over {args.repeats} interleaved rounds; fastest fp32 = fastest of '
          f'{", ".join(r for r in FP32 if r in args.runtimes)}; ZOO_ONEDNN=0: eager with the oneDNN door shut, '
          '(x) = shut / open timed interleaved (> 1: the door helps)')
    print(table(cells, peak))
    print()
    print(setup_table(cells))
    for n in notes:
        print(f'- {n}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
