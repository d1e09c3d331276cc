"""The ``zoo`` console script: one entry point for everything a user does.

    zoo list [PATTERN] [--family F] [--task T] [--blocks]
    zoo info NAME
    zoo bench NAME... [--batch-size 1 16] [--img-size 224] [--vs timm/NAME]

Training subcommands (``fit``, ``validate``, ``test``, ``predict``) are LightningCLI and load
Lightning only when used.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import sys

TRAIN_COMMANDS = ('fit', 'validate', 'test', 'predict')


def _cmd_list(args) -> int:
    import zoo
    from zoo._console import console
    from rich.table import Table

    if args.blocks:
        table = Table(title='zoo blocks')
        for col in ('kind', 'name', 'layout', 'fixed grid', 'summary'):
            table.add_column(col)
        for rec in zoo.layers.records():
            if fnmatch.fnmatch(rec.name, args.pattern) or fnmatch.fnmatch(f'{rec.kind}/{rec.name}', args.pattern):
                table.add_row(rec.kind, rec.name, rec.layout, 'yes' if rec.fixed_size else '', rec.doc)
        console().print(table)
        return 0
    names = zoo.list_models(args.pattern, family=args.family, task=args.task)
    if not names:
        print(f'no model matches {args.pattern!r}', file=sys.stderr)
        return 1
    table = Table(title=f'zoo models ({len(names)})')
    for col in ('model', 'family', 'task', 'input', 'params (M)', 'GMACs', 'top-1', 'tiny'):
        table.add_column(col, justify='right' if col in ('params (M)', 'GMACs', 'top-1') else 'left')
    for n in names:
        i = zoo.model_info(n)
        table.add_row(n, i.family, i.task, 'x'.join(map(str, i.input_size)),
                      f'{i.params / 1e6:.2f}' if i.params else '', f'{i.macs / 1e9:.2f}' if i.macs else '',
                      f'{i.top1:.1f}' if i.top1 else '', i.tiny or '')
    console().print(table)
    return 0


def _cmd_info(args) -> int:
    import zoo

    print(json.dumps(zoo.model_info(args.name).as_dict(), indent=2, default=str))
    return 0


def _cmd_bench(args) -> int:
    from zoo.eval import bench

    rows = bench.run(args.names, vs=args.vs, batch_sizes=args.batch_size, img_size=args.img_size,
                     repeats=args.repeats, warmup=args.warmup, threads=args.threads, dtype=args.dtype, mode=args.mode,
                     num_classes=args.num_classes)
    bench.print_table(rows)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='zoo', description='zoo: blocks, model families, recipes, results.')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')

    p = sub.add_parser('list', help='list registered models (or blocks with --blocks)')
    p.add_argument('pattern', nargs='?', default='*', help="glob pattern, e.g. 'poolformer*'")
    p.add_argument('--family')
    p.add_argument('--task')
    p.add_argument('--blocks', action='store_true', help='list registered blocks instead of models')
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser('info', help="print a model's registry record")
    p.add_argument('name')
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser('bench', help='params, MACs and CPU latency, optionally against a reference')
    p.add_argument('names', nargs='+', metavar='NAME')
    p.add_argument('--vs', help='reference model, e.g. timm/poolformer_s12 (run interleaved in one process)')
    p.add_argument('--batch-size', type=int, nargs='+', default=[1])
    p.add_argument('--img-size', type=int)
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--threads', type=int, help='torch threads (default: all cores)')
    p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
    p.add_argument('--mode', default='inference', choices=['inference', 'train'])
    p.add_argument('--num-classes', type=int)
    p.add_argument('--json', action='store_true', help='also print the rows as JSON')
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TRAIN_COMMANDS:
        from zoo.recipes.cli import run_lightning_cli
        return run_lightning_cli(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, 'func', None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (KeyError, ValueError, TypeError, FileNotFoundError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f'zoo {args.command}: error: {msg}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
