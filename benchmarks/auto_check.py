"""Is ``zoo.optimize(model, 'auto')`` the fastest? (issue 45, target: within 3 % of the best float32 runtime.)

For each model and batch size, ``auto`` chooses on its own short measurement (``zoo._auto.choose``, no cache);
then the same eager, compile, ONNX Runtime and OpenVINO modules are timed in a second, longer interleaved
measurement (``zoo.eval.profile.benchmark``), and auto's choice is compared with the best of that
second measurement: ``ratio`` = choice's median / best median (1.00 = auto chose the fastest). A choice is only
as good as the timing it rests on, so the second measurement's IQR is printed beside each median.

    python -m benchmarks.auto_check --models poolformer_tiny resnet_tiny --batch-sizes 1 16
"""
from __future__ import annotations

import argparse
import contextlib
import io

import torch

from zoo._auto import CANDIDATES


def check(name: str, batch_size: int, repeats: int, img_size: int | None) -> dict:
    import zoo
    from zoo import tasks
    from zoo._auto import choose
    from zoo.eval.profile import benchmark

    torch.manual_seed(0)
    model = zoo.create(name).eval()
    x = tasks.example_input(model, tasks.input_size(name, img_size=img_size), batch_size)
    built = {}

    def build(rt):  # each runtime built once: auto's measurement and the second one time the same modules
        if rt not in built:
            built[rt] = zoo.optimize(model, rt, x)
        return built[rt]

    with contextlib.redirect_stderr(io.StringIO()):
        chosen = choose(model, x, build, use_cache=False)
    nets = {rt: net for rt, net in built.items() if rt not in chosen.auto['wrong']}
    lat = benchmark(nets, inputs=dict.fromkeys(nets, x), batch_size=batch_size, repeats=repeats, warmup=3)
    medians = {rt: lat[rt].median_ms for rt in nets}
    best = min(medians, key=medians.get)
    return {'model': name, 'batch': batch_size, 'choice': chosen.runtime, 'best': best,
            'ratio': medians[chosen.runtime] / medians[best], 'ms': medians,
            'iqr': {rt: lat[rt].iqr_ms for rt in nets}, 'excluded': {**chosen.auto['failed'], **chosen.auto['wrong']}}


def table(rows: list[dict]) -> str:
    out = ['| model | batch | ' + ' | '.join(f'{rt} ms (IQR)' for rt in CANDIDATES) + ' | auto chose | ratio |',
           '|---|---|' + '---|' * len(CANDIDATES) + '---|---|']
    for r in rows:
        cells = [f'{r["ms"][rt]:.3f} ({r["iqr"][rt]:.3f})' if rt in r['ms'] else 'n/a' for rt in CANDIDATES]
        out.append(f'| {r["model"]} | {r["batch"]} | ' + ' | '.join(cells) +
                   f' | {r["choice"]} | {r["ratio"]:.3f} |')
    within = sum(r['ratio'] <= 1.03 for r in rows)
    out.append(f'\nwithin 3 % of the best: {within} of {len(rows)}')
    return '\n'.join(out)


def cli(argv=None) -> int:
    from zoo.eval.profile import load_average, machine

    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--models', nargs='+', required=True)
    p.add_argument('--batch-sizes', nargs='+', type=int, default=[1, 16])
    p.add_argument('--img-size', type=int)
    p.add_argument('--repeats', type=int, default=30)
    p.add_argument('--threads', type=int)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f'CPU: {machine()["cpu_model"]}, {torch.get_num_threads()} threads, load {load_average()}', flush=True)
    rows = [check(m, b, args.repeats, args.img_size) for m in args.models for b in args.batch_sizes]
    print(table(rows))
    print(f'load after: {load_average()}')
    return 0


if __name__ == '__main__':
    raise SystemExit(cli())
