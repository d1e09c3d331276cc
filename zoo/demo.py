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


def main() -> None:
    torch.manual_seed(0)
    model_table()


if __name__ == '__main__':
    main()
