"""Benchmarks for the Canon language models (issue 7), interleaved in one process, medians and ratios.

1. Chunked GLA / SSD scans against their token-by-token references at T = 512: max difference and speed-up.
2. Training (forward + backward) and generation tokens per second for each family with and without
   Canon-ABCD (``zoo.eval.profile.benchmark`` for training; greedy ``generate`` for generation: cached
   (KV cache / recurrent state + Canon windows, one token per step) and uncached (re-runs the prefix at
   every step), interleaved).

    python -m benchmarks.canon_bench --out docs/measurements/canon_bench.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.eval.profile import benchmark, interleave
from zoo.layers.sequence_mixers import gla_chunked, gla_recurrent, ssd_chunked, ssd_recurrent


def interleaved(fns: dict, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call (``zoo.eval.profile.interleave``)."""
    return {k: statistics.median(v) / 1e3 for k, v in interleave(fns, repeats, warmup).items()}


@torch.no_grad()
def scans(t: int, repeats: int) -> list[dict]:
    torch.manual_seed(0)
    b, h, dk, dv = 2, 4, 32, 64
    q, k, v = torch.randn(b, h, t, dk) * dk ** -0.5, torch.randn(b, h, t, dk), torch.randn(b, h, t, dv)
    log_a = F.logsigmoid(torch.randn(b, h, t, dk) + 2) / 16 * 16 / 4
    x, dt = torch.randn(b, t, h, dv), F.softplus(torch.randn(b, t, h) - 2)
    a, bm, cm = -torch.rand(h) * 4 - 0.5, torch.randn(b, t, 64), torch.randn(b, t, 64)
    rows = []
    for name, ref, fast in (('gla', lambda: gla_recurrent(q, k, v, log_a), lambda: gla_chunked(q, k, v, log_a, 32)),
                            ('ssd', lambda: ssd_recurrent(x, dt, a, bm, cm), lambda: ssd_chunked(x, dt, a, bm, cm, 64))):
        diff = (ref()[0] - fast()[0]).abs().max().item()
        med = interleaved({'recurrent': ref, 'chunked': fast}, repeats)
        rows.append(dict(scan=name, T=t, batch=b, heads=h, max_abs_diff=diff, recurrent_ms=1000 * med['recurrent'],
                         chunked_ms=1000 * med['chunked'], speedup=med['recurrent'] / med['chunked']))
    return rows


def throughput(depth: int, dim: int, t: int, batch: int, gen_tokens: int, repeats: int, prompt_len: int = 16) -> list[dict]:
    rows = []
    families = {'llama': ('llama_tiny', {}), 'gla': ('gla_tiny', {}),
                'mamba2': ('mamba2_tiny', dict(mixer_kwargs=dict(head_dim=32, d_state=32, chunk_size=64)))}
    models, inputs = {}, {}
    x = torch.randint(0, 64, (batch, t))
    for fam, (name, extra) in families.items():
        for canon in ('', 'ABCD'):
            torch.manual_seed(0)
            heads = {'llama': dim // 32, 'gla': max(1, dim // 64)}.get(fam)
            kw = dict(dim=dim, depth=depth, canon=canon, **extra)
            if heads:
                kw['num_heads'] = heads
            key = f'{fam}{"+ABCD" if canon else ""}'
            models[key], inputs[key] = zoo.create(name, **kw), x
    train = benchmark(models, batch_size=batch, inputs=inputs, mode='train', repeats=repeats, warmup=1)
    prompt = x[:1, :prompt_len]
    fns = {}
    for k, m in models.items():
        m.eval()
        fns[k] = lambda m=m: m.generate(prompt, gen_tokens)
        fns[k + ' uncached'] = lambda m=m: m.generate(prompt, gen_tokens, use_cache=False)
    gen = interleaved(fns, max(2, repeats // 3))
    for key, lat in train.items():
        rows.append(dict(model=key, depth=depth, dim=dim, T=t, batch=batch,
                         params=sum(p.numel() for p in models[key].parameters()),
                         train_tokens_per_s=batch * t / (lat.median_ms / 1000), train_ms=lat.median_ms,
                         prompt=prompt_len, generated=gen_tokens, generate_tokens_per_s=gen_tokens / gen[key],
                         generate_uncached_tokens_per_s=gen_tokens / gen[key + ' uncached']))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--T', type=int, default=512)
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--prompt', type=int, default=64, help='generation: prompt tokens')
    p.add_argument('--gen', type=int, default=64, help='generation: new tokens (greedy)')
    p.add_argument('--scans-only', action='store_true', help='only the chunked-scan comparison')
    p.add_argument('--out', type=Path, default=None)
    p.add_argument('--smoke', action='store_true',
                   help='toy sizes (T=64, one 1-layer d32 model per family, 1 repeat; overrides --T, --repeats, '
                        '--prompt, --gen): checks that it runs, its figures mean nothing')
    args = p.parse_args(argv)
    lm_sizes, lm_t, lm_batch = ((2, 64), (4, 256)), 256, 8
    if args.smoke:
        args.T, args.repeats, args.prompt, args.gen = 64, 1, 4, 4
        lm_sizes, lm_t, lm_batch = ((1, 32),), 32, 2
    torch.set_num_threads(args.threads)
    res = {'threads': args.threads, 'torch': torch.__version__, 'load_before': os.getloadavg(),
           'scans': scans(args.T, args.repeats), 'lm': []}
    for r in res['scans']:
        print(f"{r['scan']}: T={r['T']} max|diff|={r['max_abs_diff']:.2e} recurrent {r['recurrent_ms']:.1f} ms "
              f"chunked {r['chunked_ms']:.1f} ms  x{r['speedup']:.1f}", flush=True)
    for depth, dim in () if args.scans_only else lm_sizes:
        rows = throughput(depth, dim, lm_t, lm_batch, args.gen, args.repeats, args.prompt)
        res['lm'] += rows
        for r in rows:
            print(f"{r['model']:12s} {depth}L d{dim}: train {r['train_tokens_per_s']:8.0f} tok/s  "
                  f"generate {r['generate_tokens_per_s']:6.1f} tok/s (uncached {r['generate_uncached_tokens_per_s']:6.1f})",
                  flush=True)
    res['load_after'] = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {res['load_before']}, after {res['load_after']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.exists():
            raise FileExistsError(f'{args.out} exists; choose another --out (results are never overwritten)')
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
