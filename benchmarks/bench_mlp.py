"""RaftMLP, Strip-MLP and TNT against the PoolFormer of similar size: params, MACs, CPU latency.

No timm implementation of RaftMLP or Strip-MLP exists, so the reference here is our PoolFormer at similar MACs
(TNT-S, 5.2 G, beside PoolFormer-S36, 5.0 G; ``zoo bench`` compares TNT with timm's). Against the official
code, with your copy of it: ``zoo bench raftmlp_s --vs official:/src/raft-mlp/libs/models.py`` (eval/official.py,
docs/mlp.md).
All models of one batch size run in one process, interleaved (A, B, C, A, B, C, ...), so machine noise
hits them alike; figures are medians over the repeats and ratios against the paired PoolFormer.

    python -m benchmarks.bench_mlp --batch-sizes 1 16 --repeats 5 --markdown
"""
from __future__ import annotations

import argparse

import torch

import zoo

from zoo.eval.profile import benchmark, count_macs, count_params

# Each model and the PoolFormer it is compared with (similar MACs at 224).
PAIRS = {
    'raftmlp_s': 'poolformer_s12', 'raftmlp_m': 'poolformer_s24', 'raftmlp_l': 'poolformer_s36',
    'stripmlp_t_star': 'poolformer_s12', 'stripmlp_t': 'poolformer_s24', 'stripmlp_s': 'poolformer_s36',
    'stripmlp_b': 'poolformer_m36', 'tnt_s': 'poolformer_s36',
}


def run(names: list[str], batch_sizes=(1, 16), repeats: int = 5, warmup: int = 1, threads: int | None = None,
        img_size: int = 224) -> list[dict]:
    refs = sorted({PAIRS[n] for n in names if n in PAIRS})
    all_names = list(dict.fromkeys([*names, *refs]))
    torch.manual_seed(0)
    models = {n: zoo.create(n).eval() for n in all_names}
    size = (3, img_size, img_size)
    static = {n: {**count_params(m), 'macs': count_macs(m, size)} for n, m in models.items()}
    rows = []
    for bs in batch_sizes:
        lat = benchmark(models, input_size=size, batch_size=bs, warmup=warmup, repeats=repeats, threads=threads)
        for n in all_names:
            row = {'model': n, **static[n], **lat[n].as_dict()}
            if n in PAIRS and PAIRS[n] in lat:
                row['vs'] = PAIRS[n]
                row['speedup'] = lat[n].throughput / lat[PAIRS[n]].throughput
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ['| model | params (M) | MACs (G) | batch | median ms | img/s | vs PoolFormer (throughput) |',
             '|---|---:|---:|---:|---:|---:|---|']
    for r in rows:
        vs = f"{r['speedup']:.2f}x {r['vs']}" if 'speedup' in r else ''
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f} | {r['macs'] / 1e9:.2f} | {r['batch_size']} | "
                     f"{r['median_ms']:.1f} | {r['throughput']:.1f} | {vs} |")
    return '\n'.join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--models', nargs='+', default=list(PAIRS))
    p.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 16])
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--threads', type=int, default=None, help='torch threads (default: all cores)')
    p.add_argument('--img-size', type=int, default=224)
    p.add_argument('--markdown', action='store_true', help='print a markdown table (for the README)')
    args = p.parse_args(argv)
    rows = run(args.models, args.batch_sizes, args.repeats, args.warmup, args.threads, args.img_size)
    if args.markdown:
        print(markdown(rows))
    else:
        from zoo.eval.bench import print_table
        print_table(rows)


if __name__ == '__main__':
    main()
