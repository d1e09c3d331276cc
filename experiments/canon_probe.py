"""CPU reproduction of the Canon probes (Physics of Language Models: Part 4.1, arXiv 2512.17351):

- token copy (paper Figure 5): 1-layer d=16 RoPE with and without Canon-ABCD, and the 2-layer control;
- Depo1-mini (single-token names, small N, K=4): NoPE, RoPE, NoPE+Canon, RoPE+Canon.

A plain training loop with the recipe's pieces (``zoo.recipes.lm``: AdamW 0.9/0.98, eps 1e-6, warm-up then
cosine to 10 %, answer-only loss; ``zoo.datasets``: the same seeded windows for every architecture).
Each run appends one JSON line to ``--out`` (so an interrupted sweep keeps its finished runs); ``--table``
prints mean and 95 % t-interval over seeds as markdown, one group per (task, size, model, optimiser setting).
``--cache DIR`` generates a seed's training windows once and keeps them as tensors, so the variants of that
seed (possibly in other processes) train on the identical data without paying the Python generator again.

    python -m experiments.canon_probe copy --N 32 --steps 3000 --seeds 0 1 2
    python -m experiments.canon_probe depo --N 16 --K 4 --dim 64 --batch 16 --steps 1000 --seeds 0 --cache /tmp/probe
    python -m experiments.canon_probe --table docs/measurements/canon_probe.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import zoo
from zoo.datasets.synthetic import make_task
from zoo.datasets.synthetic_data import SyntheticWindows
from zoo.eval.results import t_interval
from zoo.recipes import optim
from zoo.recipes.lm import answer_accuracy

VARIANTS = {
    'copy': {'1L RoPE': dict(depth=1), '1L RoPE+Canon': dict(depth=1, canon='ABCD'),
             '2L RoPE': dict(depth=2)},
    'depo': {'NoPE': dict(rope_dim=0), 'RoPE': dict(), 'NoPE+Canon': dict(rope_dim=0, canon='ABCD'),
             'RoPE+Canon': dict(canon='ABCD')},
}


def cached_windows(ds: SyntheticWindows, cache: Path) -> dict[str, torch.Tensor]:
    """Every window of ``ds`` stacked into (size, T) int16 tensors, stored under ``cache`` on first use.

    The file name holds everything that determines the windows (task and its sizes, context, seed, count);
    it is written to a temporary name and renamed, so a concurrent reader never sees half a file.
    """
    t = ds.task
    key = f"{t.name}_N{t.N}_K{getattr(t, 'K', 0)}_ctx{ds.context}_seed{ds.seed}_n{ds.size}.pt"
    path = cache / key
    if path.exists():
        return torch.load(path)
    cache.mkdir(parents=True, exist_ok=True)
    items = [ds[i] for i in range(ds.size)]
    # token ids, answer ids and tags are small: int16 keeps a 20k-window cache at ~40 MB
    data = {k: torch.stack([it[k] for it in items]).to(torch.int16) for k in items[0]}   # (size, T) each
    tmp = path.with_suffix(f'.{os.getpid()}.tmp')
    torch.save(data, tmp)
    tmp.rename(path)
    return data


def train_batches(train: SyntheticWindows, batch: int, cache: Path | None):
    """Batches of consecutive windows in index order: from the cache if given, else generated on the fly."""
    if cache is None:
        yield from torch.utils.data.DataLoader(train, batch_size=batch, shuffle=False)
        return
    data = cached_windows(train, cache)
    for i in range(0, train.size, batch):
        yield {k: v[i:i + batch].long() for k, v in data.items()}


def run(task_name: str, variant: str, model_args: dict, seed: int, args) -> dict:
    task = make_task('copy', N=args.N) if task_name == 'copy' else make_task('depo1_mini', N=args.N, K=args.K)
    ctx = 2 * args.N + 2 if task_name == 'copy' else args.context
    train = SyntheticWindows(task, ctx, args.steps * args.batch, seed=1000 + seed)
    eval_k = tuple(args.eval_k) if args.eval_k else (args.K, max(1, args.K // 2))
    evalk = {} if task_name == 'copy' else {'k': eval_k}
    val = SyntheticWindows(task, ctx, args.eval_windows, seed=10_000 + seed, hardest=True, task_kwargs=evalk)
    torch.manual_seed(seed)
    base = dict(dim=args.dim, num_heads=args.heads) if task_name == 'copy' else dict(dim=args.dim, depth=args.depth,
                                                                                         num_heads=args.heads)
    model = zoo.create('llama_tiny', vocab_size=task.vocab_size, **{**base, **model_args})
    opt = torch.optim.AdamW(optim.param_groups(model, 0.03), lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    sched = optim.scheduler(opt, args.steps, args.warmup, floor=0.1)
    loader = train_batches(train, args.batch, args.cache)
    load0, t0, curve = os.getloadavg()[0], time.perf_counter(), []
    model.train()
    for step, batch in enumerate(loader):
        logits = model(batch['input'])
        sel = batch['answer'] >= 0
        loss = F.cross_entropy(logits[sel], batch['target'][sel])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append((step + 1, round(loss.item(), 4), evaluate(model, val, args)))
            print(f'  {variant} seed={seed} step {step + 1}: loss {curve[-1][1]} {curve[-1][2]} '
                  f'({time.perf_counter() - t0:.0f} s)', flush=True)
            model.train()
    res = dict(task=task_name, N=args.N, K=args.K if task_name != 'copy' else None, variant=variant,
               model_args={**base, **model_args}, seed=seed, steps=args.steps, batch=args.batch, lr=args.lr,
               warmup=args.warmup, context=ctx, eval_windows=args.eval_windows, threads=args.threads,
               params=sum(p.numel() for p in model.parameters()),
               seconds=round(time.perf_counter() - t0, 1), load=[round(load0, 2), round(os.getloadavg()[0], 2)],
               curve=curve, final=curve[-1][2])
    return res


@torch.no_grad()
def evaluate(model, val, args) -> dict:
    """Copy: token accuracy and whole-sequence exact match; Depo: exact-answer accuracy at k = K and K/2."""
    model.eval()
    oks, tags, toks = [], [], []
    for batch in torch.utils.data.DataLoader(val, batch_size=args.batch):
        ok, tag, tok = answer_accuracy(model(batch['input']), batch)
        oks.append(ok); tags.append(tag); toks.append(tok)  # noqa: E702
    ok, tag, tok = torch.cat(oks), torch.cat(tags), torch.cat(toks)
    out = {'token_acc': round(tok.float().mean().item(), 4)}
    for k in sorted(set(tag.tolist())):
        if k:
            out[f'acc_k{k}'] = round(ok[tag == k].float().mean().item(), 4)
    return out


def setting(r: dict) -> str:
    """Short label of a run's model size and optimiser setting: runs differing in any of them never share a row."""
    m = r['model_args']
    ctx = r.get('context', 2 * r['N'] + 2 if r['task'] == 'copy' else 256)    # early records lack it: the defaults
    return f"{m.get('depth', 1)}L d{m['dim']} h{m['num_heads']} T{ctx} B{r['batch']} lr{r['lr']:g}"


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups = {}
    for r in rows:
        groups.setdefault((r['task'], r['N'], r['K'], r['steps'], setting(r), r['variant']), []).append(r)
    lines = ['| task | N | K | steps | setting | model | params | seeds | metric | mean | 95 % CI | per seed |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|']
    order = sorted(groups, key=lambda g: (g[0], g[1], g[3], g[4]))         # stable: variants keep run order
    for (task, n, k, steps, conf, variant) in order:
        rs = groups[(task, n, k, steps, conf, variant)]
        for metric in sorted(rs[0]['final'], key=lambda m: (m != 'token_acc', m)):
            vals = [100 * r['final'][metric] for r in rs]
            mean, half = t_interval(vals)
            lines.append(f'| {task} | {n} | {k or ""} | {steps} | {conf} | {variant} | {rs[0]["params"]:,} | '
                         f'{",".join(str(r["seed"]) for r in rs)} | {metric} | {mean:.1f} | {"±%.1f" % half if len(vals) > 1 else "–"} | '
                         f'{" / ".join(f"{v:.1f}" for v in vals)} |')
    return '\n'.join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('task', nargs='?', choices=['copy', 'depo'])
    p.add_argument('--N', type=int, default=32)
    p.add_argument('--K', type=int, default=4)
    p.add_argument('--dim', type=int, default=16)
    p.add_argument('--heads', type=int, default=2)
    p.add_argument('--depth', type=int, default=2, help='Depo only (copy uses the 1L/2L variants)')
    p.add_argument('--context', type=int, default=256, help='Depo window length')
    p.add_argument('--steps', type=int, default=3000)
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--lr', type=float, default=2e-3)
    p.add_argument('--warmup', type=int, default=300)
    p.add_argument('--eval-every', type=int, default=500)
    p.add_argument('--eval-windows', type=int, default=128)
    p.add_argument('--eval-k', type=int, nargs='+', default=None,
                   help='Depo: hop counts of the held-out queries (default: K and K/2); accuracy is reported per k')
    p.add_argument('--cache', type=Path, default=None, help='keep each seed\'s training windows here (see above)')
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--variants', nargs='+', default=None)
    p.add_argument('--out', type=Path, default=Path('docs/measurements/canon_probe.jsonl'))
    p.add_argument('--table', type=Path, default=None, help='print the markdown table of a results file')
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return
    if args.task is None:
        p.error('give a task (copy or depo) or --table FILE')
    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    variants = VARIANTS[args.task]
    for seed in args.seeds:                      # seeds outermost: every variant sees the same data per seed
        for name in (args.variants or variants):
            res = run(args.task, name, variants[name], seed, args)
            with args.out.open('a') as f:        # append: never overwrite finished runs
                f.write(json.dumps(res) + '\n')
            print(f"{args.task} N={args.N} {name} seed={seed}: {res['final']} ({res['seconds']} s)", flush=True)


if __name__ == '__main__':
    main()
