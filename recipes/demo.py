"""`make demo`: train the CPU demo recipe end to end (PoolFormer-tiny on scikit-learn's handwritten digits),
print its validation and test accuracy and the trained model's measured CPU latency, then the model table
with params, MACs and latency of every tiny variant and PoolFormer-S12."""
from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import torch

import zoo
from zoo._console import console
from zoo.eval.bench import trust_limits
from zoo.eval.profile import benchmark, count_macs, count_params

DEMO_RECIPE = Path(__file__).resolve().parent / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'


def model_table() -> None:
    from rich.table import Table

    names = zoo.list_models(tiny=True, task='classification') + ['poolformer_s12']
    table = Table(title='zoo models: params, MACs, CPU latency (batch 1, fp32, median of 10)')
    for col in ('model', 'input', 'params (M)', 'MACs (M)', 'latency ms', 'img/s'):
        table.add_column(col, justify='left' if col == 'model' else 'right')
    for name in names:
        info = zoo.model_info(name)
        model = zoo.create(name).eval()
        lat = benchmark({name: model}, input_size=info.input_size, repeats=10)[name]
        table.add_row(name, 'x'.join(map(str, info.input_size)), f"{count_params(model)['params'] / 1e6:.3f}",
                      f'{count_macs(model, info.input_size) / 1e6:.1f}', f'{lat.median_ms:.2f}',
                      f'{lat.throughput:.1f}')
    console().print(table)


def leaderboard() -> None:
    """The leaderboard of every (task, dataset) in the results database ($ZOO_DB or ./zoo-results.db)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from zoo.eval import results

    url = results.resolve_url()
    if url is None or (url.startswith('sqlite') and not Path(make_url(url).database or '').is_file()):
        print('results database: no runs recorded yet (zoo fit -c recipes/configs/... records every run)')
        return
    runs = results.runs(status='finished')
    if runs.empty:
        print(f'results database {url}: no finished runs yet')
        return
    for (task, dataset), g in runs.groupby(['task', 'dataset']):
        metric = 'val/acc1' if 'val/acc1' in g.columns and g['val/acc1'].notna().any() else next(
            (c for c in g.columns if str(c).startswith('val/') and g[c].notna().any()), None)
        if metric is not None:
            board = results.leaderboard(task, dataset, metric)
            print(results.format_board(board, 'table').rstrip() + f'\n  ({task} / {dataset}, {url})')
            unmeasured = board.model[board.latency_ms.isna()].tolist()
            if unmeasured:      # the end-of-fit record follows training: the machine was busy, it is not published
                busy, iqr = trust_limits()
                print(f'  no trusted latency yet for {", ".join(dict.fromkeys(unmeasured))}: a record taken while '
                      f'the machine is busy (1-minute load above {busy:g} per CPU, or IQR above {iqr:g} of the '
                      f'median) is never published; `zoo bench {unmeasured[0]} --db` on a quiet machine records one')


def _last(run: Path, key: str) -> float:
    with open(run / 'metrics.csv') as f:
        values = [float(r[key]) for r in csv.DictReader(f) if r.get(key)]
    if not values:
        raise RuntimeError(f'{run}/metrics.csv has no {key}')
    return values[-1]


def train_demo(recipe: Path = DEMO_RECIPE, extra: list[str] | None = None) -> dict:
    """``zoo fit -c recipe`` then ``zoo test --ckpt_path best``; the accuracies and the trained model's latency."""
    from .cli import run_cli

    common = ['-c', str(recipe), '--trainer.enable_model_summary', 'false', *(extra or [])]
    fit = run_cli(['fit', *common])
    if fit.code != 0:
        raise SystemExit('demo: training failed (see the error above)')
    test = run_cli(['test', *common, '--ckpt_path', 'best'])
    if test.code != 0:
        raise SystemExit('demo: testing failed (see the error above)')
    fit_run, test_run = fit.run_dir, test.run_dir
    best = sorted(fit_run.glob('checkpoints/best-*.ckpt'))[-1]
    args = torch.load(best, map_location='cpu', weights_only=True)['hyper_parameters']  # with the data's sizes
    sizes = {k: args.get(k) for k in ('num_classes', 'in_chans', 'img_size')}
    model = zoo.create_with_optional(args['name'], sizes, **(args.get('model_args') or {}))
    zoo.load_checkpoint(model, best)
    size = (args['in_chans'], args['img_size'], args['img_size'])
    lat = benchmark({args['name']: model.eval()}, input_size=size, repeats=20)[args['name']]
    return dict(run=fit_run, best=best, val_acc1=_last(fit_run, 'val/acc1'), test_acc1=_last(test_run, 'test/acc1'),
                model=args['name'], input=size, params=count_params(model)['params'], latency_ms=lat.median_ms,
                throughput=lat.throughput)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    torch.manual_seed(0)
    # One thread: a 0.2 M-parameter model gains nothing from more, and on a shared machine extra
    # OpenMP threads spin against other processes (100x slower latency under load).
    torch.set_num_threads(int(os.environ.get('ZOO_THREADS', 1)))
    r = train_demo(extra=argv)
    console().print(
        f"\n[bold]demo[/bold]: {r['model']} ({r['params'] / 1e6:.3f} M params) trained on digits "
        f"{'x'.join(map(str, r['input']))}\n"
        f"  validation top-1 {r['val_acc1'] * 100:.1f} %   test top-1 {r['test_acc1'] * 100:.1f} % (best checkpoint)\n"
        f"  CPU latency, batch 1, {torch.get_num_threads()} thread(s): {r['latency_ms']:.2f} ms "
        f"({r['throughput']:.0f} img/s)\n"
        f"  run folder: {r['run']}\n")
    model_table()
    leaderboard()       # last: `make demo` ends with the leaderboard from the results database


if __name__ == '__main__':
    main()
