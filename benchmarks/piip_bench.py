"""PIIP benchmarks (issue 18): the deformable cross-attention core and the PIIP models, on the CPU.

    python -m benchmarks.piip_bench deform            # batched grid_sample core vs one grid_sample per head
    python -m benchmarks.piip_bench models            # params, MACs, latency: piip_tsb vs ViT-B and its branches,
                                                       # piip_tiny vs its single-branch baseline
    python -m benchmarks.piip_bench models --macs-only
    python -m benchmarks.piip_bench compare --db docs/measurements/piip_compare.db [--measure]
                                                       # the CPU-scale comparison runs side by side: accuracy / mAP
                                                       # over seeds, params, MACs, latency (--measure: time now)

MACs: ``zoo.eval.profile.count_macs`` (torch's FlopCounterMode: linears, convs, attention matmuls) plus the
bilinear sampling, which the counter does not see: 5 MACs per sampled channel (4 corner products and the
attention weight), i.e. 5 * Nq * P * int(D * ratio) per deformable attention (the official get_flops.py adds
5 * N * K * D).

Timings are interleaved (``zoo.eval.profile.benchmark``); run on a quiet machine, the numbers of a shared
one are noise. No Lightning, no training.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.layers.deform_attn import DeformCrossAttention, deform_attn_core

from zoo.eval.profile import benchmark, count_macs, count_params


def per_head_core(value, value_grid, locations, weights):
    """The same computation with one grid_sample call per head (the layout of a naive port), for comparison."""
    b, _, m, dh = value.shape
    h, w = value_grid
    outs = []
    for head in range(m):
        v = rearrange(value[:, :, head], 'b (h w) d -> b d h w', h=h, w=w)
        s = F.grid_sample(v, 2 * locations[:, :, head] - 1, mode='bilinear', padding_mode='zeros',
                          align_corners=False)  # (B, Dh, Nq, P)
        outs.append((s * weights[:, None, :, head]).sum(-1))  # (B, Dh, Nq)
    return rearrange(torch.stack(outs, 1), 'b m d q -> b q (m d)')


class _Deform(nn.Module):
    """One interaction direction of PIIP-TSB (query grid -> value grid) as a model taking the query tokens."""

    def __init__(self, dim, qgrid, vgrid, core):
        super().__init__()
        self.attn, self.qgrid, self.vgrid, self.core = DeformCrossAttention(dim), qgrid, vgrid, core
        self.register_buffer('value', torch.randn(1, vgrid[0] * vgrid[1], dim))

    def forward(self, q):
        a = self.attn
        loc, wgt = a.sampling(q, self.qgrid, self.vgrid)
        v = rearrange(a.value_proj(self.value.expand(q.shape[0], -1, -1)), 'b n (m d) -> b n m d', m=a.num_heads)
        return a.output_proj(self.core(v, self.vgrid, loc, wgt))


def bench_deform(repeats: int, threads: int | None) -> None:
    # PIIP-TSB 368/192/128: T (23x23 grid, 192) <-> S (12x12, 384) and S <-> B (8x8, 768)
    cases = [('T<-S', 192, (23, 23), (12, 12)), ('S<-T', 384, (12, 12), (23, 23)), ('B<-S', 768, (8, 8), (12, 12))]
    for name, dim, qg, vg in cases:
        torch.manual_seed(0)
        batched = _Deform(dim, qg, vg, deform_attn_core)
        looped = _Deform(dim, qg, vg, per_head_core)
        looped.load_state_dict(batched.state_dict())
        x = torch.randn(8, qg[0] * qg[1], dim)
        with torch.no_grad():
            diff = (batched(x) - looped(x)).abs().max().item()
        res = benchmark({'batched': batched, 'per_head': looped}, input_size=tuple(x.shape[1:]), batch_size=8,
                        repeats=repeats, threads=threads, inputs={'batched': x, 'per_head': x})
        b, p = res['batched'].median_ms, res['per_head'].median_ms
        print(f'{name:5s} dim {dim:3d} {qg}->{vg} batch 8: batched {b:.2f} ms, per-head {p:.2f} ms '
              f'(x{p / b:.2f}); max |diff| {diff:.1e}')


def deform_sampling_macs(model) -> int:
    """MACs of the bilinear sampling of every deformable attention in a PIIP model (see the module docstring)."""
    from zoo.layers.piip import InteractionBlock
    grids = [(s // model.patch_size,) * 2 for s in model.img_sizes]
    total = 0
    for block in model.interactions:
        assert isinstance(block, InteractionBlock)
        for i in range(block.num_branches - 1):
            unit = block.unit(i)
            for inj, g in ((unit.branch2to1_injector, grids[i]), (unit.branch1to2_injector, grids[i + 1])):
                a = inj.attn
                total += 5 * g[0] * g[1] * a.num_points * a.value_dim
    return total


def _macs(model, size) -> int:
    macs = count_macs(model, (3, size, size))
    return macs + (deform_sampling_macs(model) if hasattr(model, 'interactions') else 0)


def _single_branch_baseline(piip_model, num_classes=1000):
    """A standalone ViT of the PIIP model's widest branch at the largest resolution (same depth and style)."""
    from timm.models.vision_transformer import VisionTransformer
    b = piip_model.branches[0]
    return VisionTransformer(img_size=piip_model.img_sizes[-1], patch_size=piip_model.patch_size,
                             num_classes=num_classes, embed_dim=piip_model.embed_dims[0], depth=len(b.blocks),
                             num_heads=b.blocks[0].attn.num_heads, no_embed_class=b.no_embed_class,
                             init_values=1.0 if b.no_embed_class else None)


def _load() -> float:
    """The 1-minute load average (what else ran on the machine while we timed)."""
    return os.getloadavg()[0] if hasattr(os, 'getloadavg') else float('nan')


def time_group(rows, repeats: int, threads: int | None, warmup: int = 3) -> dict:
    """Time ``rows`` = [(label, model, input side), ...] interleaved (A, B, C, A, B, C, ...), each at batch 1
    on its own input size. Returns {label: Latency} and the load averages before and after, under 'load'."""
    load0 = _load()
    res = benchmark({name: m for name, m, _ in rows}, input_size=(3, rows[0][2], rows[0][2]), repeats=repeats,
                    warmup=warmup, threads=threads, inputs={name: torch.randn(1, 3, s, s) for name, _, s in rows})
    return {**res, 'load': (load0, _load())}


def _print_ratios(rows, macs, res) -> None:
    """One line per model: median and IQR, and its latency and MACs ratios to the group's first row."""
    ref = rows[0][0]
    load0, load1 = res['load']
    print(f'  load average {load0:.2f} before, {load1:.2f} after; {res[ref].threads} thread(s), '
          f'{len(res[ref].times_ms)} interleaved repeats, batch 1')
    for name, _, _ in rows:
        lat = res[name]
        print(f'{name:44s} median {lat.median_ms:9.2f} ms (IQR {lat.iqr_ms:7.2f})  '
              f'latency x{lat.median_ms / res[ref].median_ms:5.2f}'
              f'  MACs x{macs[name] / macs[ref]:5.2f}  (vs {ref.strip()})')


def bench_models(repeats: int, threads: int | None, macs_only: bool = False, out: str | None = None) -> None:
    """The Targets table of issue 18: piip_tsb against timm's ViT-B at 224 and against its own branches;
    piip_tiny against its single-branch baseline (the widest branch at the largest resolution)."""
    import zoo
    tsb = zoo.create('piip_tsb').eval()
    tiny = zoo.create('piip_tiny').eval()
    groups = [
        [('timm/vit_base_patch16_224 @224', zoo.create('timm/vit_base_patch16_224').eval(), 224),
         ('piip_tsb 368/192/128', tsb, 368),
         *[(f'  its branch{i + 1} alone @{s}', b, s) for i, (b, s) in enumerate(zip(tsb.branches, tsb.img_sizes))]],
        [('single-branch baseline (widest @64)', _single_branch_baseline(tiny).eval(), 64),
         ('piip_tiny 64/48/32', tiny, 64)],
    ]
    macs = {}
    print(f'{"model":44s} {"params":>12s} {"GMACs":>8s}')
    for rows in groups:
        for name, m, s in rows:
            macs[name] = _macs(m, s)
            print(f'{name:44s} {count_params(m)["params"]:12,d} {macs[name] / 1e9:8.3f}')
    if macs_only:
        return
    records = []
    for rows in groups:
        print()
        res = time_group(rows, repeats, threads)
        _print_ratios(rows, macs, res)
        records += [dict(res[n].as_dict(), model=n, macs=macs[n], vs=rows[0][0], load_before=res['load'][0],
                         load_after=res['load'][1]) for n, _, _ in rows]
    if out:
        with open(out, 'w') as f:
            json.dump(records, f, indent=1)
        print(f'\nwritten to {out}')


# ------------------------------------------------------------------------------------ the comparison runs
COMPARE_METRICS = {'classification': ('val/acc1',), 'detection': ('val/map50', 'val/map')}


def _network_of_run(run):
    """The network a recorded run trained, rebuilt from its hyper-parameters (random weights), and its input side."""
    import zoo
    hp = run.hparams
    net = zoo.create(hp['name'], num_classes=hp.get('num_classes'), in_chans=hp.get('in_chans'),
                     **(hp.get('model_args') or {})).eval()
    return net, int(run.config['data']['init_args']['img_size'])


def _task_of_run(run) -> str | None:
    """The task of a run that did not record one (a timm model has no registry record), from its metrics."""
    for task, metrics in COMPARE_METRICS.items():
        if any(m in run and run[m] == run[m] for m in metrics):     # x == x: not NaN
            return task
    return None


def _piip_of(net):
    """The PIIP model inside a network (itself, or a detector's backbone), else None."""
    for m in (net, getattr(net, 'backbone', None)):
        if m is not None and hasattr(m, 'interactions'):
            return m
    return None


def compare_table(db: str, measure: bool = False, repeats: int = 30, threads: int | None = 1,
                  warmup: int = 3) -> list[dict]:
    """The side-by-side table of the CPU-scale comparison (issue 18 item 5) from the results database ``db``:
    per task and configuration (the recipe file), the seeds' final metrics (mean and 95 % Student-t half-width,
    and each value), parameters, MACs (the runs' counter MACs plus PIIP's bilinear sampling; for a detector also
    its backbone's alone, where the compared models differ) and batch-1 CPU latency, with ratios to the
    single-branch baseline of the same task.

    Latency comes from rows this function wrote (``measure=True``: every network is rebuilt from its runs'
    hyper-parameters and timed interleaved with the others of its task; ``run_id`` empty, keyed by the
    architecture fingerprint), never from the end-of-training timings the runs recorded (taken while training
    on a shared machine)."""
    import pandas as pd

    from zoo.eval.profile import fingerprint
    from zoo.eval.results import open_db, t_interval

    store = open_db(db)
    runs = store.runs(status='finished', stage='fit')
    if runs.empty:
        raise ValueError(f'no finished fit runs in {db}')
    runs['task'] = runs.task.fillna(runs.apply(_task_of_run, axis=1))  # timm models carry no task in the registry
    rows = []
    for (task, dataset, recipe, key), g in runs.groupby(['task', 'dataset', 'recipe', 'config_key'], sort=False,
                                                        dropna=False):
        net, side = _network_of_run(g.iloc[0])
        piip = _piip_of(net)
        counter_macs = g.macs.dropna()
        row = dict(task=task, dataset=dataset, config=os.path.basename(str(recipe)).removesuffix('.yaml'),
                   model=g.model.iloc[0], branches=len(piip.branches) if piip is not None else 1, side=side,
                   epochs=int(g.max_epochs.iloc[0]), seeds=sorted(int(s) for s in g.seed),
                   params=count_params(net)['params'],
                   macs=(int(counter_macs.iloc[0]) if len(counter_macs) else count_macs(net, (3, side, side)))
                   + (deform_sampling_macs(piip) if piip is not None else 0),
                   fingerprint=fingerprint(net), net=net)
        backbone = getattr(net, 'backbone', None)    # a detector: its backbone alone, where the models differ
        row['backbone_macs'] = (row['macs'] if backbone is None else count_macs(backbone, (3, side, side))
                                + (deform_sampling_macs(piip) if piip is not None else 0))
        for metric in COMPARE_METRICS.get(task, ()):
            if metric in g:
                vals = g.sort_values('seed')[metric].astype(float).tolist()
                mean, half = t_interval(vals)
                row[metric] = dict(values=vals, mean=mean, half=half)
        rows.append(row)
    for task, group in pd.DataFrame(rows).groupby('task', sort=False):
        idx = list(group.index)
        if measure:
            named = [(rows[i]['config'], rows[i]['net'], rows[i]['side']) for i in idx]
            res = time_group(named, repeats, threads, warmup)
            for i in idx:
                lat = res[rows[i]['config']]
                store.add_latency_record(dict(lat.as_dict(), model=rows[i]['model']), params=rows[i]['params'],
                                         macs=rows[i]['macs'], arch_fingerprint=rows[i]['fingerprint'])
                rows[i]['load'] = res['load']
        lat_rows = store.latency()
        for i in idx:
            mine = lat_rows[(lat_rows.arch_fingerprint == rows[i]['fingerprint']) & lat_rows.run_id.isna()
                            & (lat_rows.batch_size == 1)] if not lat_rows.empty else lat_rows
            if len(mine):
                last = mine.sort_values('measured_at').iloc[-1]
                rows[i].update(latency_ms=float(last.median_ms), iqr_ms=float(last.iqr_ms),
                               threads=int(last.threads), measured_at=str(last.measured_at)[:16])
        base = next((i for i in idx if rows[i]['branches'] == 1), idx[0])
        for i in idx:
            rows[i]['macs_ratio'] = rows[i]['macs'] / rows[base]['macs']
            rows[i]['backbone_macs_ratio'] = rows[i]['backbone_macs'] / rows[base]['backbone_macs']
            if 'latency_ms' in rows[i] and 'latency_ms' in rows[base]:
                rows[i]['latency_ratio'] = rows[i]['latency_ms'] / rows[base]['latency_ms']
    for r in rows:
        del r['net']
    return rows


def format_compare(rows, db: str) -> str:
    """A Markdown table of ``compare_table``'s rows."""
    def metric(r, m):
        if m not in r:
            return ''
        v = r[m]
        return (f"{100 * v['mean']:.1f} ± {100 * v['half']:.1f} "
                f"({', '.join(f'{100 * x:.1f}' for x in v['values'])})")

    lines = ['| task | config | branches | px | epochs | seeds | metric: mean ± 95 % t half-width (each seed) '
             '| params | MMACs | MACs x | backbone MMACs (x) | latency ms (IQR) | latency x |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        ms = ' / '.join(f'{m.split("/")[-1]} {metric(r, m)}' for m in COMPARE_METRICS.get(r['task'], ()) if m in r)
        lat = (f"{r['latency_ms']:.2f} ({r['iqr_ms']:.2f}; {r['threads']} thr, {r['measured_at']})"
               if 'latency_ms' in r else 'to be measured')
        ratio = f"{r['latency_ratio']:.2f}" if 'latency_ratio' in r else ''
        lines.append(f"| {r['task']} / {r['dataset']} | {r['config']} | {r['branches']} | {r['side']} | {r['epochs']} "
                     f"| {','.join(map(str, r['seeds']))} | {ms} | {r['params'] / 1e6:.3f} M | {r['macs'] / 1e6:.1f} "
                     f"| {r['macs_ratio']:.2f} | {r['backbone_macs'] / 1e6:.1f} ({r['backbone_macs_ratio']:.2f}) "
                     f"| {lat} | {ratio} |")
    loads = sorted({r['load'] for r in rows if 'load' in r})
    if loads:
        lines.append('\nload average while timing (before, after): ' + '; '.join(f'{a:.2f}, {b:.2f}' for a, b in loads))
    if any('latency_ms' not in r for r in rows):
        lines.append(f'\nlatency to be measured on a quiet machine: python -m benchmarks.piip_bench compare --db {db} '
                     '--measure')
    return '\n'.join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('what', choices=['deform', 'models', 'compare'])
    ap.add_argument('--repeats', type=int, default=None, help='timed rounds (default: deform/models 20, compare 30)')
    ap.add_argument('--threads', type=int, default=None, help='torch threads (default: all; compare: 1)')
    ap.add_argument('--macs-only', action='store_true', help='models: parameters and MACs, no timing')
    ap.add_argument('--out', help='models: also write the timings (with the load averages) to this JSON file')
    ap.add_argument('--db', help='compare: the results database of the comparison runs')
    ap.add_argument('--measure', action='store_true',
                    help='compare: time every network of the table now and store the timings in the database')
    args = ap.parse_args(argv)
    if args.what == 'deform':
        bench_deform(args.repeats or 20, args.threads)
    elif args.what == 'models':
        bench_models(args.repeats or 20, args.threads, args.macs_only, args.out)
    else:
        if not args.db:
            ap.error('compare needs --db PATH (the results database of the comparison runs)')
        if not os.path.exists(args.db) and '://' not in args.db:
            ap.error(f'compare: no database at {args.db}')
        try:
            rows = compare_table(args.db, args.measure, args.repeats or 30,
                                 1 if args.threads is None else args.threads)
        except ValueError as e:
            print(f'piip_bench compare: error: {e}', file=sys.stderr)
            return 2
        print(format_compare(rows, args.db))
    return 0


if __name__ == '__main__':
    sys.exit(main())
