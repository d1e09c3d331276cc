"""`make demo`: the model table with params, MACs and measured CPU latency of every tiny variant
and PoolFormer-S12."""
from __future__ import annotations

import torch

import zoo
from zoo._console import console
from zoo.eval.profile import benchmark, count_macs, count_params


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


def main() -> None:
    torch.manual_seed(0)
    model_table()
    leaderboard()       # last: `make demo` ends with the leaderboard from the results database


if __name__ == '__main__':
    main()
