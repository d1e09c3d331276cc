"""Accuracy after INT8 quantization of trained networks: the paper-blocks benchmark's checkpoints (seed 0 of each
entry of the chosen groups) tested in eager float32 and in each int8 runtime through ``zoo test --runtime``,
which calibrates on the first 256 images of the recipe's training split. Every test is recorded in its own
results database (default ``benchmarks/int8.db``); the table gives float, each int8 runtime and the difference.

    python -m benchmarks.int8_accuracy --groups mixers_shapes backbones_shapes64 mlp_small_data \
        detectors_shapes_det semfpn_pretrained

Needs the benchmark's runs (``zoo benchmark run paper_blocks``: checkpoints under ``runs/benchmarks/``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os

from zoo.recipes import benchmark as B
from zoo.recipes.benchmark_spec import load, override_args
from zoo.recipes.main import main

RUNTIMES = ('eager', 'onnxruntime-int8', 'openvino-int8')


def test_argv(job, ckpt, runtime: str, db: str) -> list[str]:
    return ['test', '-c', job.recipe, *override_args(job.overrides), f'--seed_everything={job.seed}',
            '--ckpt_path', str(ckpt), '--runtime', runtime, f'--db={db}',
            '--trainer.enable_progress_bar=false', '--trainer.enable_model_summary=false']


def run(groups: list[str], seed: int, db: str, bench_name: str = 'paper_blocks') -> list[dict]:
    from zoo.eval import results as R

    bench = load(bench_name)
    rows = []
    for job in bench.jobs():
        if job.group not in groups or job.seed != seed:
            continue
        ckpt = B.checkpoint_of(bench, job)
        if ckpt is None or not ckpt.exists():
            print(f'{job.group}/{job.entry} seed {seed}: no checkpoint (run zoo benchmark run {bench_name})')
            continue
        metric = bench.groups[job.group].metric.replace('val/', 'test/')
        row = {'group': job.group, 'entry': job.entry, 'metric': metric}
        for rt in RUNTIMES:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    code = main(test_argv(job, ckpt, rt, db))
            except Exception as e:  # a runtime that cannot run a network is a result of the table, not a crash
                code = f'{type(e).__name__}: {str(e).splitlines()[0][:160]}'
            if code != 0:
                row[rt] = None
                row[f'{rt} error'] = code
                continue
            last = R.runs(db=db, stage='test').sort_values('id').iloc[-1]
            row[rt] = float(last[metric])
        rows.append(row)
        print(row, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = '| group | entry | metric | float32 | ' + ' | '.join(f'{r} (delta)' for r in RUNTIMES[1:]) + ' |'
    out = [head, '|' + '---|' * (4 + len(RUNTIMES) - 1)]
    for r in rows:
        cells = [f'{r["eager"]:.4f}' if r['eager'] is not None else 'failed']
        for rt in RUNTIMES[1:]:
            v = r[rt]
            cells.append('failed' if v is None else f'{v:.4f} ({v - r["eager"]:+.4f})' if r['eager'] is not None
                         else f'{v:.4f}')
        out.append(f'| {r["group"]} | {r["entry"]} | {r["metric"]} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(out)


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--groups', nargs='+', required=True, help='benchmark groups whose entries are tested')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--db', default='benchmarks/int8.db')
    p.add_argument('--run-root', help="where the benchmark's runs are (default $ZOO_RUNS or ./runs)")
    args = p.parse_args(argv)
    if args.run_root:
        os.environ['ZOO_RUNS'] = args.run_root
    print(table(run(args.groups, args.seed, args.db)))
    return 0


if __name__ == '__main__':
    raise SystemExit(cli())
