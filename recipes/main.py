"""The ``zoo`` console script: one entry point for everything a user does.

    zoo list [PATTERN] [--family F] [--task T] [--blocks]
    zoo info NAME
    zoo bench NAME... [--batch-size 1 16] [--img-size 224] [--vs timm/NAME|official:FILE.py[:CALLABLE]] [--db URL]
    zoo results [--task T] [--dataset D] [--model PATTERN] [--metric val/acc1] [--format table|csv|json|markdown]
                [--plot pareto.png] [--aggregate] [--runs] [--db URL]
    zoo sweep recipes/sweeps/NAME.py [--n-trials N] [--n-jobs J] [--study-name S] [--db URL] [--trial-args '...']

Training subcommands (``fit``, ``validate``, ``test``, ``predict``) are LightningCLI and load
Lightning only when used; they also take ``--db URL|none`` (the results database) and ``--seeds 0,1,2``
(one run per seed).
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
    from ..eval import bench

    rows = bench.run(args.names, vs=args.vs, batch_sizes=args.batch_size, img_size=args.img_size,
                     repeats=args.repeats, warmup=args.warmup, threads=args.threads, dtype=args.dtype, mode=args.mode,
                     num_classes=args.num_classes)
    bench.print_table(rows)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    if args.db:
        from zoo.eval.results import resolve_url
        if resolve_url(args.db) is not None:
            n = bench.record(rows, db=args.db)
            print(f'{n} latency rows written to {resolve_url(args.db)}', file=sys.stderr)
    return 0


def _cmd_results(args) -> int:
    from zoo.eval import results

    board = None
    if args.aggregate:
        if args.plot:
            raise ValueError('--plot draws the leaderboard; it does not combine with --aggregate')
        agg = results.aggregate(args.metric, db=args.db, model=args.model, task=args.task, dataset=args.dataset)
        print(results.format_aggregate(agg, args.format))
        if agg.empty:
            print(f'zoo results: no finished run has a final {args.metric!r}', file=sys.stderr)
        elif (agg.note != '').any():
            print('zoo results: some models have too few runs per task for an interval (see note)', file=sys.stderr)
        return 0
    if args.runs:
        df = results.runs(db=args.db, model=args.model, task=args.task, dataset=args.dataset)
        print(df.to_string(max_colwidth=40) if args.format == 'table' else
              df.to_csv(index=False) if args.format == 'csv' else df.to_json(orient='records', indent=2, default_handler=str)
              if args.format == 'json' else df.to_markdown(index=False))
    else:
        board = results.leaderboard(args.task, args.dataset, args.metric, db=args.db, model=args.model)
        print(results.format_board(board, args.format))
    if args.plot:
        if board is None:
            board = results.leaderboard(args.task, args.dataset, args.metric, db=args.db, model=args.model)
        results.plot_pareto(board, args.plot)
        print(f'Pareto plot written to {args.plot}', file=sys.stderr)
    return 0


def _cmd_sweep(args) -> int:
    import shlex

    from zoo.recipes.sweep import run_sweep

    run_sweep(args.file, n_trials=args.n_trials, n_jobs=args.n_jobs, db=args.db, study_name=args.study_name,
              timeout=args.timeout, extra_args=shlex.split(args.trial_args), seed=args.seed)
    return 0


def _seed_list(value: str) -> list[int]:
    try:
        seeds = [int(s) for s in value.split(',') if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f'expects comma-separated integers, e.g. 0,1,2; got {value!r}')
    return seeds


def train_parser(command: str) -> argparse.ArgumentParser:
    """The options ``zoo`` itself handles before LightningCLI: ``--seeds`` (one run per seed, recorded as
    repeats of one configuration). ``--db`` is LightningCLI's own argument (see ``ZooCLI``)."""
    p = argparse.ArgumentParser(prog=f'zoo {command}', add_help=False, allow_abbrev=False)
    p.add_argument('--seeds', type=_seed_list)
    return p


def build_parser() -> argparse.ArgumentParser:
    from zoo import __version__

    parser = argparse.ArgumentParser(prog='zoo', description='zoo: blocks, model families, recipes, results.',
                                     epilog='`zoo COMMAND --help` for the options of a command.')
    parser.add_argument('--version', action='version', version=f'zoo {__version__}')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    # The training commands are LightningCLI (main() hands them over before this parser runs); listed here so
    # that `zoo --help` shows every command.
    for command, what in (('fit', 'train a recipe: zoo fit -c recipes/configs/<family>/<name>.yaml'),
                          ('validate', "validate a checkpoint (--ckpt_path last|best|<file>)"),
                          ('test', 'test a checkpoint on the test split'),
                          ('predict', 'predictions of a checkpoint, written to the run folder')):
        sub.add_parser(command, help=what, add_help=False)

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
    p.add_argument('--vs', help='reference model, run interleaved in one process: timm/NAME, a zoo NAME, or '
                   'official:FILE.py[:CALLABLE] (your copy of the official code, given our weights; RaftMLP, Strip-MLP)')
    p.add_argument('--batch-size', type=int, nargs='+', default=[1])
    p.add_argument('--img-size', type=int)
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--threads', type=int, help='torch threads (default: all cores)')
    p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16'])
    p.add_argument('--mode', default='inference', choices=['inference', 'train'])
    p.add_argument('--num-classes', type=int)
    p.add_argument('--json', action='store_true', help='also print the rows as JSON')
    p.add_argument('--db', help='also write the rows to this results database (path or SQLAlchemy URL)')
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser('results', help='leaderboard from the results database (best per model, CI over seeds)')
    p.add_argument('--task')
    p.add_argument('--dataset')
    p.add_argument('--model', help="glob pattern, e.g. 'poolformer*'")
    p.add_argument('--metric', default='val/acc1', help='final metric to rank by (default val/acc1)')
    p.add_argument('--format', default='table', choices=['table', 'csv', 'json', 'markdown'])
    p.add_argument('--plot', metavar='PNG', help='also draw metric vs latency with the Pareto front to this file')
    p.add_argument('--runs', action='store_true', help='list the runs instead of the leaderboard')
    p.add_argument('--aggregate', action='store_true',
                   help='compare models over all their tasks/datasets and seeds: IQM and mean with stratified '
                        'bootstrap 95%% intervals (Agarwal et al. 2021)')
    p.add_argument('--db', help='results database path or SQLAlchemy URL (default $ZOO_DB or ./zoo-results.db)')
    p.set_defaults(func=_cmd_results)

    p = sub.add_parser('sweep', help='an Optuna sweep from recipes/sweeps/NAME.py, stored in the results database')
    p.add_argument('file', help='a search-space file, e.g. recipes/sweeps/poolformer_digits.py')
    p.add_argument('--n-trials', type=int, default=None,
                   help="trials the study should hold (default: the file's N_TRIALS); the same command resumes")
    p.add_argument('--n-jobs', type=int, default=1, help='parallel worker processes on the study')
    p.add_argument('--seed', type=int, help="sampler seed (default: the sweep file's SEED, else random)")
    p.add_argument('--study-name', help='default: the file name; the same name resumes the study')
    p.add_argument('--timeout', type=float, help='stop starting trials after this many seconds')
    p.add_argument('--db', help='results database path or SQLAlchemy URL (default $ZOO_DB or ./zoo-results.db)')
    p.add_argument('--trial-args', default='', metavar='ARGS',
                   help="extra LightningCLI arguments for every trial, one string: '--trainer.max_epochs=2'")
    p.set_defaults(func=_cmd_sweep)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TRAIN_COMMANDS:
        from .cli import run_lightning_cli
        ns, rest = train_parser(argv[0]).parse_known_args(argv[1:])
        if ns.seeds is None:
            return run_lightning_cli([argv[0], *rest])
        codes = [run_lightning_cli([argv[0], *rest, f'--seed_everything={seed}']) for seed in ns.seeds]
        return next((c for c in codes if c), 0)
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
