"""Produce the data snapshot the comparison notebooks read (``notebooks/data/``).

The notebooks run in the test suite without a database or a network, so each one reads a small CSV
export shipped beside it, or the user's own results database when ``ZOO_DB`` is set. This script makes
that export *for real*: it trains every registered token mixer in the MetaFormer-tiny skeleton on the
digits recipe (``zoo fit ... --seeds``), times all of them interleaved in one process (batch 1 and 64,
1 thread; ``eval.profile.benchmark``), records both in a results database and exports the tables.

    python -m experiments.notebook_data                      # train + latency + export
    python -m experiments.notebook_data --latency-only       # re-time on a quiet machine
    python -m experiments.notebook_data --mixers pooling,attention --seeds 0

Training is seed-major (seed 0 of every mixer, then seed 1, ...), so an interrupted run still covers
every mixer; a (mixer, seed) already finished in the database is skipped, so re-running resumes.
The 1-minute load average is recorded beside every latency row: timings taken while the machine is
busy are not performance figures, and the notebook prints the load it was measured under.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / 'notebooks' / 'data'
CONFIG = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
MODEL = 'metaformer_tiny'
IN_CHANS, NUM_CLASSES, IMG = 1, 10, 32  # digits: 1x32x32, 10 classes

RUN_COLUMNS = ['id', 'model', 'token_mixer', 'block_choices', 'dataset', 'seed', 'status', 'max_epochs', 'params',
               'macs', 'wall_s', 'config_key', 'arch_fingerprint', 'git_commit', 'val/acc1', 'val/loss']
EPOCH_METRICS = ['val/acc1', 'val/loss', 'train/loss']


def mixers(selected: str | None) -> list[str]:
    import zoo

    every = zoo.layers.list_layers('token_mixer')
    if not selected:
        return every
    wanted = [m.strip() for m in selected.split(',') if m.strip()]
    unknown = [m for m in wanted if m not in every]
    if unknown:
        raise ValueError(f'unknown token mixer(s) {unknown}; registered: {", ".join(every)}')
    return wanted


def _finished(db: str) -> set[tuple[str, int]]:
    """(mixer, seed) pairs of this recipe already finished in ``db``."""
    from zoo.eval import results

    df = results.runs(db=db, model=MODEL, dataset='digits', status='finished')
    done = set()
    for choices, seed in zip(df.get('block_choices', []), df.get('seed', [])):
        c = json.loads(choices) if isinstance(choices, str) else (choices or {})
        done.add((c.get('token_mixer'), int(seed)))
    return done


def train(db: str, names: list[str], seeds: list[int], run_root: str) -> None:
    env = {**os.environ, 'ZOO_RECORD_LATENCY': '0',  # latency comes from the interleaved benchmark below
           'OMP_NUM_THREADS': os.environ.get('OMP_NUM_THREADS', '1')}
    for seed in seeds:
        done = _finished(db)
        for mixer in names:
            if (mixer, seed) in done:
                print(f'[skip] {mixer} seed {seed}: finished in {db}', flush=True)
                continue
            cmd = [sys.executable, '-m', 'zoo.recipes.main', 'fit', '-c', CONFIG, '--db', db, '--seeds', str(seed),
                   '--model.name', MODEL, '--model.model_args', f'{{token_mixer: {mixer}}}',
                   '--run_root', run_root, '--trainer.enable_progress_bar', 'false']
            t0 = time.time()
            print(f'[fit] {mixer} seed {seed}', flush=True)
            rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
            print(f'[fit] {mixer} seed {seed}: exit {rc}, {time.time() - t0:.0f} s', flush=True)


def latency(db: str, names: list[str], out: Path = DATA, batch_sizes=(1, 64), threads: int = 1,
            repeats: int = 50) -> None:
    """Every mixer's network, interleaved in one process, so machine noise hits them alike."""
    import torch

    import zoo
    from zoo.eval import bench, profile

    torch.manual_seed(0)
    nets = {m: zoo.create(MODEL, num_classes=NUM_CLASSES, in_chans=IN_CHANS, token_mixer=m).eval() for m in names}
    size = (IN_CHANS, IMG, IMG)
    static = {m: {**profile.count_params(n), 'macs': profile.count_macs(n, size),
                  'arch_fingerprint': profile.fingerprint(n)} for m, n in nets.items()}
    rows, loads = [], {}
    for bs in batch_sizes:
        load_before = os.getloadavg()[0]
        lat = profile.benchmark(nets, input_size=size, batch_size=bs, warmup=5, repeats=repeats, threads=threads)
        load_after = os.getloadavg()[0]
        loads[str(bs)] = [round(load_before, 2), round(load_after, 2)]
        for m, res in lat.items():
            # one model name for every mixer: the fingerprint ties each row to the runs of that mixer
            rows.append({**static[m], **res.as_dict(), 'model': MODEL})
        print(f'[latency] batch {bs}: load {load_before:.1f} -> {load_after:.1f} on {os.cpu_count()} cores', flush=True)
    bench.record(rows, db=db)
    # the load is not a column of the database; keep it beside the export
    meta = {'measured_at': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), 'host': platform.node(),
            'cpu_count': os.cpu_count(), 'threads': threads, 'repeats': repeats,
            'loadavg_1m_before_after': loads, 'torch': torch.__version__}
    out.mkdir(parents=True, exist_ok=True)
    (out / 'mixers_latency_meta.json').write_text(json.dumps(meta, indent=1) + '\n')


def export(db: str, out: Path = DATA) -> None:
    """Runs, per-epoch metrics and latency of the mixer study as CSV under notebooks/data/."""
    from zoo.eval import results

    out.mkdir(parents=True, exist_ok=True)
    runs = results.runs(db=db, model=MODEL, dataset='digits')
    lat = results.latency(db=db, model=MODEL)
    keep = ['model', 'arch_fingerprint', 'batch_size', 'threads', 'dtype', 'median_ms', 'iqr_ms', 'min_ms',
            'throughput', 'repeats', 'params', 'macs', 'torch_version', 'host', 'measured_at']
    lat[[c for c in keep if c in lat.columns]].to_csv(out / 'mixers_latency.csv', index=False)
    if runs.empty:
        # e.g. --latency-only on a machine without the training database: the shipped runs stay as they are
        # (the latency rows join them by architecture fingerprint)
        print(f'[export] {len(lat)} latency rows -> {out}; no {MODEL} runs in {db}: the runs CSVs are kept')
        return
    choices = [json.loads(c) if isinstance(c, str) else (c or {}) for c in runs.block_choices]
    runs['token_mixer'] = [c.get('token_mixer') for c in choices]
    runs['block_choices'] = [json.dumps(c, sort_keys=True) for c in choices]
    runs = runs[[c for c in RUN_COLUMNS if c in runs.columns]]
    runs.to_csv(out / 'mixers_runs.csv', index=False)
    per_epoch = results.metrics(db=db)
    per_epoch = per_epoch[per_epoch.run_id.isin(runs.id) & ~per_epoch.final.astype(bool)
                          & per_epoch.name.isin(EPOCH_METRICS)]
    per_epoch[['run_id', 'name', 'epoch', 'value']].to_csv(out / 'mixers_epochs.csv', index=False)
    print(f'[export] {len(runs)} runs, {len(per_epoch)} epoch rows, {len(lat)} latency rows -> {out}')


def export_conv(out: Path = DATA) -> None:
    """The convolution-block measurements already under docs/measurements/ as tidy CSV.

    They come from ``python -m experiments.denoising_compare --seeds 0 1 2 --steps {40,150} --out
    docs/measurements/dncnn_compare[_150].md`` and ``python -m benchmarks.convbn_bench --batch 32 --size 224
    --repeats 5`` (quiet machine: ``convbn_bench_quiet.txt``; under load: ``convbn_bench.txt``)."""
    import re

    import pandas as pd

    res = ROOT / 'docs' / 'measurements'
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in sorted(res.glob('dncnn_compare*.md')):
        text = path.read_text()
        steps = int(re.search(r'(\d+) steps x', text).group(1))
        for conv, per_seed in re.findall(r'^\| (standard|weighted) \|.*\| ([\d., ]+) \|$', text, re.M):
            for seed, psnr in enumerate(float(v) for v in per_seed.split(',')):
                rows.append({'source': path.name, 'steps': steps, 'conv': conv, 'seed': seed, 'psnr_db': psnr})
    pd.DataFrame(rows).to_csv(out / 'conv_dncnn.csv', index=False)
    rows = []
    for path, machine in ((res / 'convbn_bench_quiet.txt', 'quiet'), (res / 'convbn_bench.txt', 'under load')):
        header = path.read_text().splitlines()[0]
        for line in path.read_text().splitlines()[2:]:
            f = line.split()
            if len(f) == 8:
                rows.append({'machine': machine, 'mode': f[0], 'saved_mib': float(f[1]), 'step_s': float(f[3]),
                             'max_abs_diff': float(f[7]), 'setting': header})
    rss = {}
    for line in (res / 'convbn_rss.txt').read_text().splitlines():
        mode, rec = line.split(' ', 1)
        rss[mode] = json.loads(rec.replace("'", '"'))
    df = pd.DataFrame(rows)
    df['peak_rss_growth_mib'] = [rss.get(m, {}).get('step_mib') for m in df['mode']]
    df.to_csv(out / 'conv_convbn.csv', index=False)
    print(f'[export] conv: {len(df)} ConvBN rows, DnCNN from {len(list(res.glob("dncnn_compare*.md")))} files')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], prog='notebook_data')
    p.add_argument('--db', default=str(ROOT / 'runs' / 'notebook_data.db'),
                   help='results database the runs and latency rows go to (path or SQLAlchemy URL)')
    p.add_argument('--mixers', help='comma-separated token mixers (default: every registered one)')
    p.add_argument('--seeds', default='0,1,2')
    p.add_argument('--run-root', default=str(ROOT / 'runs' / 'notebook_data'))
    p.add_argument('--latency-only', action='store_true', help='only re-time the networks and re-export')
    p.add_argument('--no-latency', action='store_true', help='train and export, do not time')
    p.add_argument('--export-only', action='store_true', help='only write notebooks/data/ from --db')
    p.add_argument('--conv-only', action='store_true', help='only export the docs/measurements/ conv measurements')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--repeats', type=int, default=50, help='timed repeats per network and batch size')
    p.add_argument('--out', type=Path, default=DATA, help='where the CSV snapshot goes (default: notebooks/data)')
    a = p.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(',') if s.strip()]
    except ValueError:
        p.error(f'--seeds expects comma-separated integers, e.g. 0,1,2; got {a.seeds!r}')
    if a.conv_only:
        export_conv(a.out)
        return 0
    try:
        names = mixers(a.mixers)
    except ValueError as e:
        p.error(str(e))
    if not (a.latency_only or a.export_only):
        train(a.db, names, seeds, a.run_root)
    if not (a.no_latency or a.export_only):
        latency(a.db, names, a.out, threads=a.threads, repeats=a.repeats)
    export(a.db, a.out)
    export_conv(a.out)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
