"""Overhead of the results database: what recording costs a run, and what a query costs.

    python -m benchmarks.bench_results [--runs 500] [--epochs 10] [--tasks 2] [--db /tmp/bench.db]
    python -m benchmarks.bench_results --pgserver          # the same on a throw-away PostgreSQL (pgserver)

Writes ``--runs`` synthetic runs the way ``ResultsCallback`` does (start, one metrics write per epoch
with three metrics, the final metrics, one latency row, finish) into a fresh store, spread over
``--tasks`` datasets, then times one heartbeat write, ``runs()``, ``latency()``, ``leaderboard()`` and
``aggregate()`` (stratified bootstrap over the tasks) over them. Medians per run / per query are printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--runs', type=int, default=500)
    p.add_argument('--epochs', type=int, default=10)
    p.add_argument('--models', type=int, default=20)
    p.add_argument('--tasks', type=int, default=2, help='datasets the runs are spread over')
    p.add_argument('--db', help='a new SQLite path or URL (default: a temporary file)')
    p.add_argument('--pgserver', action='store_true', help='run against a temporary PostgreSQL server (pgserver)')
    args = p.parse_args(argv)

    import sqlalchemy as sa

    from zoo.eval import results as R

    url = args.db or os.path.join(tempfile.mkdtemp(), 'bench.db')
    if args.pgserver:
        import pgserver
        srv = pgserver.get_server(tempfile.mkdtemp(prefix='zoo-pg-bench-'), cleanup_mode='delete')
        url = srv.get_uri('postgres').replace('postgresql://', 'postgresql+psycopg://', 1)
    t0 = time.perf_counter()
    db = R.ResultsDB(url)
    t_open = time.perf_counter() - t0
    per_run = []
    for i in range(args.runs):
        model, seed = f'model_{i % args.models}', i // (args.models * args.tasks)
        dataset = f'data{(i // args.models) % args.tasks}'
        t = time.perf_counter()
        rid = db.start_run(model, task='classification', dataset=dataset, seed=seed, hparams={'lr': 0.01},
                           block_choices={'token_mixer': 'pooling'}, config={'trainer': {'max_epochs': args.epochs}},
                           env=R.environment(), git_commit=R.git_commit())
        for epoch in range(args.epochs):
            db.log_metrics(rid, {'train/loss': 1.0 / (epoch + 1), 'val/loss': 1.1 / (epoch + 1),
                                 'val/acc1': 0.5 + 0.04 * epoch + 0.001 * (i % 7)}, epoch=epoch)
        db.log_metrics(rid, {'val/acc1': 0.9 + 0.001 * (i % 7), 'val/loss': 0.1}, final=True)
        db.add_latency(model, 1.0 + i % args.models, input_shape=(3, 32, 32), batch_size=1, run_id=rid)
        db.finish_run(rid)
        per_run.append(time.perf_counter() - t)
    writes = args.epochs + 4
    live = db.start_run('heartbeat')
    queries = {}
    for name, fn in (('heartbeat()', lambda: db.heartbeat(live)), ('runs()', lambda: db.runs()),
                     ('latency()', lambda: db.latency()),
                     ('leaderboard()', lambda: R.leaderboard('classification', 'data0', db=db)),
                     ('aggregate()', lambda: R.aggregate(db=db))):
        ts = []
        for _ in range(5 if name != 'heartbeat()' else 50):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        queries[name] = statistics.median(ts)
    size = os.path.getsize(sa.engine.make_url(db.url).database) if db.url.startswith('sqlite') else None
    print(f'store {db.safe_url()}: open + migrate {t_open * 1000:.1f} ms')
    print(f'recording one run ({args.epochs} epochs, {writes} transactions): median '
          f'{statistics.median(per_run) * 1000:.2f} ms, {statistics.median(per_run) / writes * 1000:.2f} ms per write')
    for name, t in queries.items():
        print(f'{name} over {args.runs} runs: median {t * 1000:.1f} ms')
    agg = R.aggregate(db=db)
    print(f'aggregate: {len(agg)} models x {agg.n_tasks.iloc[0]} tasks x {agg.runs_per_task.iloc[0]} runs per task')
    if size:
        print(f'file size: {size / 1e6:.2f} MB ({size / args.runs / 1e3:.1f} kB per run)')


if __name__ == '__main__':
    main()
