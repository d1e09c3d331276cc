"""Latency against resolution for every MetaFormer token mixer at (nearly) equal MACs (issue 45, item 4).

MetaFormer (Yu et al., CVPR 2022, "MetaFormer Is Actually What You Need for Vision"; official repository
https://github.com/sail-sg/poolformer) is one geometry with an exchangeable token mixer (``zoo.create('metaformer_s12',
token_mixer=...)``, the mixers of ``zoo list --blocks``). How each mixer's latency grows with the image is the
question: pooling and convolutions grow linearly in the pixels (exponent ~1), global attention quadratically in the
tokens (towards 2), the MLP mixers (RaftMLP, Strip-MLP) in between or not at all (their weights fix the grid).

Equal MACs: each mixer's widths (``dims``, multiples of 32 so attention keeps 32-channel heads) are scaled so its
MACs at ``--match-size`` (224) are within ~10 % of the pooling model's; the table gives every model's MACs at each
size beside its latency, so a mixer that could not be matched shows it. All models and all sizes are timed
interleaved in one process (``zoo.eval.profile.benchmark``, the one timer) and the exponent of latency ~ pixels^k is
fitted per mixer (``zoo.eval.bench.scaling_fit``). A size a mixer cannot take (a fixed grid) is skipped with its
reason. Quote figures from a quiet machine only (the load average is printed before and after).

    python -m benchmarks.resolution                                     # metaformer_s12, 64 128 224 384, batch 1
    python -m benchmarks.resolution --mixers pooling attention --sizes 64 224 --batch-size 8 --time 4
"""
from __future__ import annotations

import argparse
import sys

import torch

import zoo
from zoo.eval.bench import scaling_fit, size_problem
from zoo.eval.profile import benchmark, count_macs, load_average, machine

MIXERS = ('pooling', 'attention', 'sepconv', 'identity', 'raft', 'strip')
MULTIPLE = 32          # dims stay multiples of this: attention's heads are 32 channels


def _dims(base: tuple, scale: float) -> tuple:
    return tuple(max(MULTIPLE, round(d * scale / MULTIPLE) * MULTIPLE) for d in base)


def _nominal(base: str, mixer: str, size: int) -> tuple:
    """The geometry's own widths, one per stage (its ``feature_info``)."""
    with torch.device('meta'):
        return tuple(f['num_chs'] for f in zoo.create(base, token_mixer=mixer, img_size=size).feature_info)


def _macs(base: str, mixer: str, dims: tuple, size: int) -> int:
    """MACs of one image at ``size`` (counted on the meta device: nothing allocated)."""
    with torch.device('meta'):
        model = zoo.create(base, token_mixer=mixer, dims=dims, img_size=size)
    return count_macs(model, (3, size, size))


def matched_dims(base: str, mixer: str, target: int, size: int, tolerance: float = 0.1) -> tuple[tuple, int]:
    """The widths that bring ``mixer``'s MACs at ``size`` closest to ``target`` and those MACs: the MLPs dominate, so
    MACs grow about as the square of the width; up to three corrections of the best width so far, then the closest
    of the tried widths (attention at 224 px cannot be matched from above: see docs/runtimes.md)."""
    nominal = _nominal(base, mixer, size)
    tried = {nominal: (1.0, _macs(base, mixer, nominal, size))}     # dims -> (width scale, MACs)
    for _ in range(3):
        scale, macs = min(tried.values(), key=lambda t: abs(t[1] - target))
        if abs(macs - target) <= tolerance * target:
            break
        scale *= (target / macs) ** 0.5
        dims = _dims(nominal, scale)
        if dims in tried:
            break
        tried[dims] = (scale, _macs(base, mixer, dims, size))
    dims, (_, macs) = min(tried.items(), key=lambda kv: abs(kv[1][1] - target))
    return dims, macs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--base', default='metaformer_s12', help='the MetaFormer geometry (default metaformer_s12)')
    p.add_argument('--mixers', nargs='+', default=list(MIXERS), help=f'token mixers (default {" ".join(MIXERS)})')
    p.add_argument('--sizes', nargs='+', type=int, default=[64, 128, 224, 384], help='image sizes (square)')
    p.add_argument('--match-size', type=int, default=224, help='the size at which MACs are matched (default 224)')
    p.add_argument('--batch-size', type=int, default=1)
    p.add_argument('--repeats', type=int, default=20, help='at least this many timed calls each')
    p.add_argument('--warmup', type=int, default=5)
    p.add_argument('--time', type=float, default=2.0, help='seconds of timing per model and size (0: --repeats)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--markdown', action='store_true', help='markdown tables (for docs/runtimes.md)')
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = _macs(args.base, 'pooling', _nominal(args.base, 'pooling', args.match_size), args.match_size)
    models, inputs, macs, widths = {}, {}, {}, {}
    for mixer in args.mixers:
        dims, matched = matched_dims(args.base, mixer, target, args.match_size)
        widths[mixer] = (dims, matched)
        # built at the match size: a mixer whose weights fix the grid (raft, strip) is built for that one
        model = zoo.create(args.base, token_mixer=mixer, dims=dims, img_size=args.match_size).eval()
        for size in args.sizes:
            why = size_problem(model, (3, size, size))
            if why:
                print(f'resolution: {mixer} skipped at {size}x{size}: {why}', file=sys.stderr)
                continue
            key = f'{mixer} @{size}'
            models[key], macs[key] = model, count_macs(model, (3, size, size))
            inputs[key] = torch.randn(args.batch_size, 3, size, size)
    m = machine()
    print(f"CPU: {m['cpu_model']} ({', '.join(m['isa']) or 'no AVX2'}); {torch.get_num_threads()} threads; "
          f'torch {torch.__version__}; batch {args.batch_size}; load average {load_average()} before')
    lat = benchmark(models, inputs=inputs, batch_size=args.batch_size, repeats=args.repeats, warmup=args.warmup,
                    budget_s=args.time * len(models) if args.time else None, max_repeats=500,
                    warmup_s=0.5 if args.time else 0.0)
    bar = '|---' * 6 + '|'
    print('\n| mixer | dims | size | MACs (G) | median ms | IQR ms |' if args.markdown else '')
    if args.markdown:
        print(bar)
    for key, res in lat.items():
        mixer, size = key.rsplit(' @', 1)
        cells = [mixer, '-'.join(map(str, widths[mixer][0])), f'{size}x{size}', f'{macs[key] / 1e9:.3f}',
                 f'{res.median_ms:.2f}', f'{res.iqr_ms:.2f}']
        print('| ' + ' | '.join(cells) + ' |' if args.markdown else '  '.join(cells))
    print(f'\n| mixer | MACs at {args.match_size} (G) | vs pooling | sizes | exponent k | R^2 |' if args.markdown
          else '\nmixer, MACs, exponent k of latency ~ pixels^k, R^2')
    if args.markdown:
        print(bar)
    for mixer in args.mixers:
        keys = [k for k in lat if k.rsplit(' @', 1)[0] == mixer]
        fit = scaling_fit([int(k.rsplit('@', 1)[1]) ** 2 for k in keys], [lat[k].median_ms for k in keys])
        k = '' if fit['exponent'] is None else f"{fit['exponent']:.2f}"
        r2 = '' if fit['r2'] is None else f"{fit['r2']:.3f}"
        matched = widths[mixer][1]
        cells = [mixer, f'{matched / 1e9:.3f}', f'{matched / target:.2f}',
                 ' '.join(k2.rsplit('@', 1)[1] for k2 in keys), k, r2]
        print('| ' + ' | '.join(cells) + ' |' if args.markdown else '  '.join(cells))
    print(f'\nload average {load_average()} after')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
