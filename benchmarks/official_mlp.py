"""RaftMLP and Strip-MLP against their official code in every runtime (issue 26): eager, ``torch.compile``
(inductor, freezing), ONNX Runtime, for zoo and for the official model given zoo's weights.

The target: zoo's best runtime at least 1.3x the official code's best runtime (the official code under
``torch.compile`` and in ONNX Runtime included). Each model runs as ``zoo bench NAME --vs official:SOURCE
--runtime ...`` does (``zoo.eval.bench.run``: every runtime of both models interleaved in one process under the
one timer, outputs checked equal); the equivalent command line is printed before each model. Printed: the CPU
model and its ISA flags, threads and load average, then per batch and runtime the medians, max |Δ| logits
(zoo vs official, same weights) and compile/export seconds, and per batch the two best runtimes and their
ratio. Quote ratios from a quiet machine only.

The official code is never part of zoo: point at your checkouts (a checkout folder, or the model's ``.py``)::

    git clone https://github.com/okojoalg/raft-mlp /work/official/raft-mlp            # @ 6060d5d
    git clone https://github.com/Med-Process/Strip_MLP /work/official/Strip_MLP       # @ 492d705
    python -m benchmarks.official_mlp                                  # raftmlp_s, stripmlp_t_star; batch 1, 16
    OFFICIAL_RAFTMLP=/src/raft-mlp python -m benchmarks.official_mlp --models raftmlp_s raftmlp_m --batch-sizes 1
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from zoo.eval import bench
from zoo.eval.profile import load_average

import zoo
from benchmarks.runtimes import cpu_model

# family -> (environment variable, default checkout, the official model file inside a checkout)
CHECKOUTS = {'raftmlp': ('OFFICIAL_RAFTMLP', '/work/official/raft-mlp', 'libs/models.py'),
             'stripmlp': ('OFFICIAL_STRIPMLP', '/work/official/Strip_MLP', 'models/strip_mlp.py')}
MODELS = ('raftmlp_s', 'stripmlp_t_star')
TARGET = 1.3


def official_spec(name: str, sources: dict[str, str | None]) -> str:
    """``official:FILE`` for a zoo model: its family's source (a checkout folder or a .py file), from the command
    line, else the environment variable, else the default checkout."""
    family = zoo.model_info(name).family
    if family not in CHECKOUTS:
        raise SystemExit(f'{name} is {family}; expected a model of {", ".join(CHECKOUTS)}')
    env, default, inside = CHECKOUTS[family]
    path = Path(sources.get(family) or os.environ.get(env) or default).expanduser()
    path = path / inside if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f'no official {family} code at {path}: clone it (see python -m benchmarks.official_mlp '
                         f'--help) or set {env} / --{family}')
    return f'official:{path}'


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog='\n'.join(__doc__.splitlines()[10:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', default=list(MODELS), help='zoo RaftMLP / Strip-MLP names')
    p.add_argument('--raftmlp', help='official RaftMLP: checkout folder or libs/models.py (env OFFICIAL_RAFTMLP)')
    p.add_argument('--stripmlp', help='official Strip-MLP: checkout folder or models/strip_mlp.py '
                                      '(env OFFICIAL_STRIPMLP)')
    p.add_argument('--runtimes', nargs='+', default=['eager', 'compile', 'onnxruntime'], choices=zoo.RUNTIMES)
    p.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 16])
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--warmup', type=int, default=5)
    p.add_argument('--threads', type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sources = {'raftmlp': args.raftmlp, 'stripmlp': args.stripmlp}
    specs = {name: official_spec(name, sources) for name in args.models}
    print(f'CPU: {cpu_model()}; {torch.get_num_threads()} threads; torch {torch.__version__}; '
          f'load average {load_average()}')
    for name, spec in specs.items():
        print(f"\n$ zoo bench {name} --vs {spec} --runtime {','.join(args.runtimes)} --batch-size "
              f"{' '.join(map(str, args.batch_sizes))} --repeats {args.repeats} --warmup {args.warmup} --time 0")
        rows = bench.run([name], vs=spec, batch_sizes=tuple(args.batch_sizes), repeats=args.repeats,
                         warmup=args.warmup, budget_s=0, runtimes=args.runtimes,
                         warn=lambda msg: print(msg, file=sys.stderr))
        got = {(r['model'] == name, r['runtime'], r['batch_size']): r for r in rows}
        print('| model | batch | runtime | zoo ms | official ms | zoo speedup | max abs diff logits | '
              'zoo compile/export s | official compile/export s |')
        print('|---|---|---|---|---|---|---|---|---|')
        for bs in args.batch_sizes:
            for rt in bench.parse_runtimes(args.runtimes):
                z, o = got.get((True, rt, bs)), got.get((False, rt, bs))
                cells = [f"{r['median_ms']:.2f}" if r else 'failed' for r in (z, o)]
                speed = f"{z['speedup']:.2f}x" if z and 'speedup' in z else ''
                diff = f"{z['max_abs_diff']:.1e}" if z and z.get('max_abs_diff') is not None else ''
                secs = [f"{r['compile_s']:.1f}" if r and r.get('compile_s') is not None else '' for r in (z, o)]
                print(f'| {name} | {bs} | {rt} | {cells[0]} | {cells[1]} | {speed} | {diff} | {secs[0]} | {secs[1]} |')
            best = {side: min((r for (s, _, b), r in got.items() if s == side and b == bs),
                              key=lambda r: r['median_ms'], default=None) for side in (True, False)}
            if best[True] and best[False]:
                ratio = best[False]['median_ms'] / best[True]['median_ms']
                print(f"| {name} | {bs} | best: zoo {best[True]['runtime']}, official {best[False]['runtime']} | "
                      f"{best[True]['median_ms']:.2f} | {best[False]['median_ms']:.2f} | ratio {ratio:.2f} "
                      f"(official best / zoo best; target >= {TARGET}: {'met' if ratio >= TARGET else 'missed'}) "
                      f'| | | |')
    print(f'\nload average {load_average()}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
