"""zoo against timm in every runtime (issue 26): eager, ``torch.compile`` (inductor, freezing), ONNX Runtime, OpenVINO.

Each model pair (a zoo model and the timm model a user would pick instead) is put in every runtime through
``zoo.optimize`` (the one switch a zoo user has), then all of them are timed interleaved in one process
(``zoo.eval.profile.interleave``: A, B, C, A, B, C, ...), at each batch size. Printed: the CPU model and its ISA
flags, per runtime the median ms, max |output - eager| and the time to compile/export; per pair the ratio of
zoo's fastest runtime to timm's fastest (> 1: zoo faster). Quote ratios from a quiet machine only.

    python -m benchmarks.runtimes --batch-sizes 1 16 --repeats 20
    python -m benchmarks.runtimes --pairs poolformer_s12:poolformer_s12 --runtimes eager compile onnxruntime
    python -m benchmarks.runtimes --pairs poolformer_s12:poolformer_s12 --batch-sizes 1 --settle 0   # no settling
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from zoo.eval.profile import interleave, load_average, machine

import zoo

PAIRS = ('poolformer_s12:poolformer_s12', 'tnt_s:tnt_s_patch16_224')
def cpu_model() -> str:
    """The CPU's model name and the ISA flags that decide which kernels run (``zoo.eval.profile.machine``)."""
    m = machine()
    return f"{m['cpu_model']} ({', '.join(m['isa']) or 'no AVX2'})"


def _build(spec: str, side: str):
    if side == 'zoo':
        return zoo.create(spec).eval()
    import timm
    return timm.create_model(spec, pretrained=False).eval()


def run_pair(zoo_name: str, timm_name: str, runtimes, batch: int, img_size: int, repeats: int, warmup: int,
             settle: int | None = None):
    torch.manual_seed(0)
    x = torch.randn(batch, 3, img_size, img_size)
    fns, info = {}, {}
    for side, spec in (('zoo', zoo_name), ('timm', timm_name)):
        model = _build(spec, side)
        with torch.no_grad():
            ref = model(x)
        for rt in runtimes:
            t0 = time.perf_counter()
            fast = zoo.optimize(model, rt, example=x)
            with torch.no_grad():
                out = fast(x)
            setup = time.perf_counter() - t0
            key = (side, rt)
            info[key] = {'setup_s': setup, 'max_abs': (out.float() - ref.float()).abs().max().item()}

            def step(fast=fast):
                with torch.no_grad():
                    fast(x)
            fns[key] = step
    times = interleave(fns, repeats=repeats, warmup=warmup, settle=settle)
    for key, t in times.items():
        info[key]['ms'] = statistics.median(t)
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--pairs', nargs='+', default=list(PAIRS), help='zoo_name:timm_name')
    p.add_argument('--runtimes', nargs='+', default=['eager', 'compile', 'onnxruntime'], choices=zoo.RUNTIMES)
    p.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 16])
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--settle', type=int, default=None,
                   help='untimed calls of a runtime before each timed one (default 1; 0 shows what the previous '
                        "runtime's still-spinning threads cost the next)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f'CPU: {cpu_model()}; {torch.get_num_threads()} threads; torch {torch.__version__}; '
          f'load average {load_average()}')
    print('| pair | batch | runtime | zoo ms | timm ms | zoo setup s | timm setup s | zoo max abs diff |')
    print('|---|---|---|---|---|---|---|---|')
    for pair in args.pairs:
        zoo_name, _, timm_name = pair.partition(':')
        for bs in args.batch_sizes:
            info = run_pair(zoo_name, timm_name, args.runtimes, bs, args.img_size, args.repeats, args.warmup,
                            args.settle)
            for rt in args.runtimes:
                z, t = info[('zoo', rt)], info[('timm', rt)]
                print(f"| {zoo_name} / {timm_name} | {bs} | {rt} | {z['ms']:.2f} | {t['ms']:.2f} | "
                      f"{z['setup_s']:.1f} | {t['setup_s']:.1f} | {z['max_abs']:.1e} |")
            best = {side: min(args.runtimes, key=lambda rt, s=side: info[(s, rt)]['ms']) for side in ('zoo', 'timm')}
            ratio = info[('timm', best['timm'])]['ms'] / info[('zoo', best['zoo'])]['ms']
            print(f"| {zoo_name} / {timm_name} | {bs} | best: zoo {best['zoo']}, timm {best['timm']} | "
                  f"ratio {ratio:.2f} (timm best / zoo best; > 1: zoo faster) | | | | |")
    print(f'load average {load_average()}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
