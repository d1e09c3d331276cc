"""The ``zoo`` console script: one entry point for everything a user does.

    zoo list [PATTERN] [--family F] [--task T] [--blocks]
    zoo info NAME                # or timm/NAME
    zoo bench NAME... [--batch-size 1 16] [--img-size 224 [384 ...]] [--device cpu|cuda]
              [--vs timm/NAME|official:FILE.py[:CALLABLE]] [--db URL]
              [--runtime eager,compile,onnxruntime[,openvino]] [--dtype bfloat16]
    zoo bench --db URL [--task T] [--dataset D] [--model PATTERN]      (re-measure the models recorded there)
    zoo export -c CONFIG|NAME [--ckpt_path best|last|PATH] [--weights auto|ema|model] [--random-init [--seed S]]
               [--format onnx|pt2] [--nms]
               [--out PATH]
    zoo profile NAME [--runtime eager[,compile]] [--img-size 224]      (time and MACs per block kind)
    zoo publish -c CONFIG [--ckpt_path best|last|PATH] --out DIR [--force] [--push ORG/NAME] [--license L]
    zoo weights NAME [--verify FILE]     (released checkpoint files: URL, sha256; check a downloaded one)
    zoo results [--task T] [--dataset D] [--model PATTERN] [--metric val/acc1] [--format table|csv|json|markdown]
                [--plot pareto.png] [--aggregate] [--runs] [--data [--only-best]] [--db URL]
    zoo benchmark run|report NAME [--workers N] [--db URL] [--retry-failed] [--no-latency] [--dry-run] [--threads K]
    zoo sweep recipes/sweeps/NAME.py [--n-trials N] [--n-jobs J] [--study-name S] [--db URL] [--trial-args '...']

Training subcommands (``fit``, ``validate``, ``test``, ``predict``) are LightningCLI and load
Lightning only when used; they also take ``--db URL|none`` (the results database) and ``--seeds 0,1,2``
(one run per seed). Their ``--help`` is zoo's summary (no Lightning, instant); ``--help-all`` LightningCLI's.
Every example in these help texts and in README's command-line section runs in tests/test_help_examples.py.
"""
from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import os
import re
import shlex
import sys

from .errors import at_least

# zoo.RUNTIMES, spelled out: the parser is built without importing torch (tests/test_int8.py checks they agree)
RUNTIME_NAMES = ('eager', 'compile', 'onnxruntime', 'openvino', 'onnxruntime-int8', 'openvino-int8', 'auto')

TRAIN_COMMANDS = ('fit', 'validate', 'test', 'predict')
DEMO = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'
EXAMPLES = f"""examples:
  zoo list 'poolformer*'
  zoo info poolformer_s12
  zoo info timm/resnet18
  zoo bench poolformer_s12 --vs timm/poolformer_s12 --batch-size 1 16
  zoo fit -c {DEMO}
  zoo test -c {DEMO} --ckpt_path best
  zoo results --dataset digits --plot pareto.png
  zoo sweep recipes/sweeps/poolformer_digits.py --n-trials 20 --trial-args '--trainer.max_epochs=2'
  zoo benchmark run paper_blocks --workers 2

`zoo COMMAND --help` for the options of a command (`zoo fit --help-all`: every LightningCLI option)."""


def _cmd_list(args) -> int:
    import zoo
    from zoo._console import console
    from rich.table import Table

    if args.recipes:  # the shipped recipes, by the name `zoo fit -c NAME` takes from any folder
        from .runs import CONFIGS, shipped_recipes

        names = [n for n in shipped_recipes() if fnmatch.fnmatch(n, args.pattern)
                 or fnmatch.fnmatch(n.rsplit('/', 1)[-1], args.pattern)]
        print('\n'.join(names) if names else f'no recipe matches {args.pattern!r}')
        print(f'({len(names)} recipes in {CONFIGS}; zoo fit -c NAME)', file=sys.stderr)
        return 0 if names else 1
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
    for col in ('model', 'family', 'task', 'input', 'params (M)', 'GMACs', 'top-1', 'COCO AP', 'ADE mIoU', 'tiny'):
        table.add_column(col, justify='right' if col in ('params (M)', 'GMACs', 'top-1', 'COCO AP', 'ADE mIoU')
                         else 'left')
    for n in names:
        i = zoo.model_info(n)
        table.add_row(n, i.family, i.task, 'x'.join(map(str, i.input_size)),
                      f'{i.params / 1e6:.2f}' if i.params else '', f'{i.macs / 1e9:.2f}' if i.macs else '',
                      f'{i.top1:.1f}' if i.top1 else '', f'{i.coco_ap:.1f}' if i.coco_ap else '',
                      f'{i.ade20k_miou:.1f}' if i.ade20k_miou else '', i.tiny or '')
    console().print(table)
    return 0


def _cmd_info(args) -> int:
    import zoo

    info = _timm_info(args.name[len('timm/'):]) if args.name.startswith('timm/') else zoo.model_info(args.name).as_dict()
    print(json.dumps(info, indent=2, default=str))
    return 0


def _timm_info(name: str) -> dict:
    """What ``zoo info`` says of a timm model (``zoo.create('timm/NAME')``): its parameters, counted on the
    ``meta`` device (nothing allocated, nothing downloaded), and timm's default ``pretrained_cfg``."""
    import timm
    import torch

    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
        raise KeyError(f'timm has no model {name!r}' + (f"; did you mean {', '.join('timm/' + c for c in close)}?"
                                                        if close else "; `timm.list_models('PATTERN')` lists them"))
    with torch.device('meta'):
        model = timm.create_model(name)
    cfg = timm.models.get_pretrained_cfg(name)
    return {'name': f'timm/{name}', 'source': 'timm', 'timm_version': timm.__version__,
            'class': f'{type(model).__module__}.{type(model).__name__}',
            'params': sum(p.numel() for p in model.parameters()),
            'num_features': getattr(model, 'num_features', None),
            'pretrained_tags': timm.list_pretrained(f'{name}.*'),
            'pretrained_cfg': cfg.to_dict() if cfg is not None else None}


def _cmd_bench(args) -> int:
    from ..eval import bench
    from ..eval.profile import load_average

    load_start = load_average()  # before this command compiles or exports anything (that counts in the load too)

    timing = dict(repeats=args.repeats, warmup=args.warmup, threads=args.threads, budget_s=args.time,
                  max_repeats=args.max_repeats)
    failures = []          # re-measuring a database records what failed beside what was measured
    if args.names:
        if args.task or args.dataset or args.model:
            raise ValueError('--task/--dataset/--model choose the recorded models to re-measure; '
                             'they do not combine with model names')
        rows = bench.run(args.names, vs=args.vs, batch_sizes=args.batch_size, img_size=args.img_size,
                         dtype=args.dtype, mode=args.mode, num_classes=args.num_classes,
                         runtimes=bench.parse_runtimes(args.runtime), device=args.device, **timing)
    elif args.db:
        from zoo.eval.results import resolve_url
        if resolve_url(args.db) is None:
            raise ValueError('--db none records nothing; give the database whose models to re-measure')
        if (args.vs or args.img_size or args.num_classes or args.dtype != 'float32' or args.mode != 'inference'
                or args.device != 'cpu'):
            raise ValueError('re-measuring a database uses each run\'s own network and input (float32, inference, '
                             'CPU; --runtime and --batch-size choose where and at which batch sizes); '
                             '--vs/--img-size/--num-classes/--dtype/--mode/--device need model names')
        rows = bench.remeasure(args.db, task=args.task, dataset=args.dataset, model=args.model, failures=failures,
                               batch_sizes=tuple(args.batch_size), runtimes=bench.parse_runtimes(args.runtime),
                               **timing)
    else:
        raise ValueError('name the models to measure (zoo bench poolformer_tiny), or give --db URL to '
                         're-measure every model recorded there')
    for r in rows:
        r['load_1m_start'] = load_start
    bench.print_table(rows)
    fits = bench.scaling_rows(rows)
    if fits:
        bench.print_scaling(fits)
    warning = bench.noise_warning(rows)
    if warning:
        print(warning, file=sys.stderr)
    if args.json:
        print(json.dumps(rows if not fits else {'rows': rows, 'scaling': fits}, indent=2, default=str))
    if args.db:
        from zoo.eval.results import resolve_url
        if resolve_url(args.db) is not None:
            n = bench.record(rows, db=args.db, failures=failures)
            print(f'{n} latency rows written to {resolve_url(args.db)}', file=sys.stderr)
    return 0


def _cmd_profile(args) -> int:
    import torch

    import zoo
    from zoo import tasks

    from ..eval import bench, breakdown
    from ..eval.profile import benchmark, example_input

    runtimes = bench.parse_runtimes(args.runtime)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = zoo.create(args.name).eval()
    x = example_input(model, tasks.input_size(args.name, img_size=args.img_size), args.batch_size)
    if args.int8:
        if len(runtimes) > 1:
            raise ValueError('--int8 times onnxruntime float32 against int8 itself; it takes no --runtime')
        rows = breakdown.int8_sensitivity(model, x, [x], repeats=args.repeats, warmup=args.warmup)
        print(f'zoo profile {args.name} --int8 ({"x".join(map(str, x.shape))}, onnxruntime-int8 one block kind at '
              f'a time, random weights calibrated on the timed input: speed, not accuracy; '
              f'benchmarks/int8_blocks.py --ckpt measures a trained run)')
        print(breakdown.int8_table([(args.name, rows)]))
        return 0
    result = breakdown.profile_kinds(model, x, repeats=args.repeats, warmup=args.warmup)
    totals = {}
    if len(runtimes) > 1:        # other runtimes: their total only, interleaved with eager under the one timer
        nets = {rt: zoo.optimize(model, rt, x, calibration=[x] if rt.endswith('-int8') else None) for rt in runtimes}
        lat = benchmark(nets, inputs=dict.fromkeys(nets, x), batch_size=args.batch_size, repeats=args.repeats,
                        warmup=args.warmup)
        totals = {rt: lat[rt].median_ms for rt in runtimes}
    breakdown.print_table(args.name, result, tuple(x.shape), totals)
    if args.json:
        print(json.dumps({**result, 'model': args.name, 'input_shape': list(x.shape), 'runtimes': totals}, indent=2))
    return 0


def _cmd_export(args) -> int:
    from .export import export_command

    return export_command(args)


def _cmd_publish(args) -> int:
    from .publish import publish_command

    return publish_command(args)


def _cmd_weights(args) -> int:
    from .publish import weights_command

    return weights_command(args)


def _cmd_results(args) -> int:
    from zoo.eval import results

    store = results.open_db(args.db, create=False)      # reading must not leave an empty database behind
    if args.aggregate:
        if args.plot:
            raise ValueError('--plot draws the leaderboard; it does not combine with --aggregate')
        from zoo import tasks

        metric = args.metric or tasks.get(args.task or 'classification').metric
        agg = results.aggregate(metric, db=store, model=args.model, task=args.task, dataset=args.dataset)
        print(results.format_aggregate(agg, args.format))
        if agg.empty:
            print(f'zoo results: no finished run has a final {metric!r}', file=sys.stderr)
        elif (agg.note != '').any():
            print('zoo results: some models have too few runs per task for an interval (see note)', file=sys.stderr)
        return 0
    if args.data:     # results.data(): one row per run, every column LEMUR's api.data gives and latency per runtime
        df = results.data(db=store, task=args.task, dataset=args.dataset, model=args.model,
                          only_best=args.only_best, cpu=args.cpu)
        print(df.to_string(max_colwidth=40) if args.format == 'table' else
              df.to_csv(index=False) if args.format == 'csv' else df.to_json(orient='records', indent=2, default_handler=str)
              if args.format == 'json' else df.to_markdown(index=False))
        return 0
    if args.runs:
        store.check_filters(task=args.task, dataset=args.dataset, model=args.model)
        df = results.runs(db=store, model=args.model, task=args.task, dataset=args.dataset)
        print(df.to_string(max_colwidth=40) if args.format == 'table' else
              df.to_csv(index=False) if args.format == 'csv' else df.to_json(orient='records', indent=2, default_handler=str)
              if args.format == 'json' else df.to_markdown(index=False))
        return 0
    # one leaderboard per task (or the one --task), each by its task's primary metric unless --metric says
    boards = results.leaderboards(args.task, args.dataset, args.metric, db=store, model=args.model,
                                  threads=args.threads, runtime=args.runtime, cpu=args.cpu, device=args.device)
    if not boards:
        print('(no finished runs)' + (' matching the filters' if args.model or args.dataset else ''))
        return 0
    if args.format in ('csv', 'json') and len(boards) > 1:      # one table with a task column
        import pandas as pd
        both = pd.concat([b.assign(task=t) for t, b in boards.items()], ignore_index=True)
        print(both.to_csv(index=False) if args.format == 'csv' else both.to_json(orient='records', indent=2))
    else:
        for task, board in boards.items():
            if len(boards) > 1 and args.format in ('table', 'markdown'):
                print(f'\n{task} ({board.attrs["metric"]})')
            print(results.format_board(board, args.format))
    missing = [t for t, b in boards.items() if b['latency_ms'].isna().all()]
    if missing:  # say how to fill the column rather than leave it blank without a word
        from zoo.eval.results.schema import DEFAULT_PATH
        db = shlex.quote(str(args.db or os.environ.get('ZOO_DB') or DEFAULT_PATH))
        print(f'zoo results: no {args.runtime} latency recorded for the {", ".join(missing)} runs'
              f'{" on a CPU matching " + repr(args.cpu) if args.cpu else ""}; measure their networks with '
              f'`zoo bench --db {db} --runtime {args.runtime}`', file=sys.stderr)
    mixed = [t for t, b in boards.items() if b['latency_threads'].dropna().nunique() > 1]
    if mixed:  # each row shows its most trusted record; say that they were not all taken at one thread count
        print(f'zoo results: the {", ".join(mixed)} latencies were taken at different thread counts (see "latency '
              'from"); compare at one with --threads N, or re-time them with `zoo bench --db ... --threads N`',
              file=sys.stderr)
    if args.plot:
        from pathlib import Path

        for task, board in boards.items():
            datasets = board.dataset.drop_duplicates().tolist() or [None]
            for dataset in datasets:      # one plot per task and dataset: a front across datasets means nothing
                one = board if len(datasets) == 1 else board[board.dataset == dataset]
                tags = [task] * (len(boards) > 1) + [re.sub(r'[^\w.-]+', '-', str(dataset))] * (len(datasets) > 1)
                path = Path(args.plot)   # pareto.png -> pareto_detection.png, pareto_segmentation_voc.png
                path = path.with_name('_'.join([path.stem, *tags]) + path.suffix)
                results.plot_pareto(one, path)
                print(f'Pareto plot written to {path}', file=sys.stderr)
    return 0


def _cmd_sweep(args) -> int:
    from zoo.recipes.sweep import failure_summary, run_sweep

    study = run_sweep(args.file, n_trials=args.n_trials, n_jobs=args.n_jobs, db=args.db, study_name=args.study_name,
                      timeout=args.timeout, extra_args=shlex.split(args.trial_args), seed=args.seed)
    failed = failure_summary(study, args.db)
    if failed:  # the input was fine (exit 2 is for that); the trials were not
        print(f'zoo sweep: error: {failed}', file=sys.stderr)
        return 1
    return 0


def _seed_list(value: str) -> list[int]:
    try:
        seeds = [int(s) for s in value.split(',') if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f'expects comma-separated integers, e.g. 0,1,2; got {value!r}')
    return seeds


_TRAIN_WHAT = {
    'fit': 'Train a recipe: a Lightning system and DataModule from a YAML config (LightningCLI).',
    'validate': 'Evaluate a checkpoint on the validation split.',
    'test': 'Evaluate a checkpoint on the test split.',
    'predict': 'Predictions of a checkpoint on the test split, or with --images DIR on a folder of new images, written '
               'to the run folder: per task a table (classification), boxes drawn (detection), masks (segmentation).',
}
_TRAIN_EXAMPLES = {
    'fit': [f'zoo fit -c {DEMO}',
            f"zoo fit -c {DEMO} --model.name metaformer_tiny --model.model_args '{{token_mixer: attention}}' "
            '--trainer.max_epochs 3',
            f'zoo fit -c {DEMO} --seeds 0,1,2 --db results.db',
            f'zoo fit -c {DEMO} --ckpt_path last'],
    'validate': [f'zoo validate -c {DEMO} --ckpt_path best'],
    'test': [f'zoo test -c {DEMO} --ckpt_path best',
             f'zoo test -c {DEMO} --ckpt_path best --corruptions gaussian_noise,fog --severities 1,3,5'],
    'predict': [f'zoo predict -c {DEMO} --ckpt_path best'],
}


def train_help(command: str) -> str:
    """``zoo fit|validate|test|predict --help``: the options a zoo user needs, without loading Lightning.
    LightningCLI's full list (every Trainer argument, ~480 lines, several seconds) is ``--help-all``."""
    ckpt = ('resume from a checkpoint: last (where the last epoch ended), interrupted, best, or a file'
            if command == 'fit' else 'the checkpoint to evaluate: best, last, interrupted (newest run of this '
            'config) or a file')
    options = [
        ('-c, --config FILE|NAME', 'a recipe file, or a shipped recipe by name from any folder, e.g. '
                                   'detection/poolformer_shapes_det (`zoo list --recipes`); repeat to layer configs'),
        ('--ckpt_path WHICH', ckpt),
        ('--seeds 0,1,2', 'one run per seed, recorded as repeats of one configuration'),
        ('--compile', 'torch.compile the network inside the system (--model.compile true)'),
        ('--runtime RUNTIME', 'zoo test: evaluate the network in eager, compile, onnxruntime or openvino '
                              '(zoo.optimize; recorded as the run\'s runtime)'),
        ('--corruptions [NAMES]', 'zoo test: also test corrupted copies of the test split (ImageNet-C style; all, a '
                                  'group such as noise, or gaussian_noise,fog,...), docs/robustness.md'),
        ('--severities 1,3,5', 'zoo test --corruptions: the severities (default 1,2,3,4,5)'),
        ('--corruptions-reference RUN', 'zoo test --corruptions: a run id or recipe in the results database whose '
                                        'corruption errors normalise test_c/mce'),
        ('--images DIR', 'zoo predict: predict the image files in DIR and its sub-folders (any size; no labels) '
                         'instead of the test split, each prepared as the recipe prepares a test image'),
        ('--seed_everything N', 'the seed of a single run'),
        ('--db PATH|URL|none', "results database of the run (default $ZOO_DB or ./zoo-results.db; 'none': "
                               'do not record)'),
        ('--run_root DIR', 'runs are written to DIR/<config stem>/<timestamp>/ (default $ZOO_RUNS or ./runs)'),
        ('--model.name NAME', 'the model to build (`zoo list`); --model.model_args \'{token_mixer: attention}\' '
                              'passes arguments to it'),
        ('--model.ARG VALUE', 'any argument of the system (lr, optimizer, ...); --data.ARG: of the DataModule'),
        ('--trainer.ARG VALUE', 'any Lightning Trainer argument: max_epochs, fast_dev_run, limit_train_batches, ...'),
        ('--print_config', 'print the resolved config (every argument with its value) and exit'),
        ('--help-all', 'every option with its description (LightningCLI; loads Lightning, slower)'),
    ]
    width = max(len(o) for o, _ in options) + 2
    lines = [f'usage: zoo {command} -c CONFIG [OPTIONS]', '', _TRAIN_WHAT[command],
             'Each run writes <run_root>/<config stem>/<timestamp>/ (resolved config.yaml, checkpoints/, metrics.csv)'
             ' and a row in the results database.', '', 'options:']
    lines += [f'  {o.ljust(width)}{what}' for o, what in options]
    lines += ['', 'examples:'] + [f'  {e}' for e in _TRAIN_EXAMPLES[command]]
    return '\n'.join(lines)


def train_parser(command: str) -> argparse.ArgumentParser:
    """The options ``zoo`` itself handles before LightningCLI: ``--seeds`` (one run per seed, recorded as
    repeats of one configuration). ``--db`` is LightningCLI's own argument (see ``ZooCLI``)."""
    p = ZooArgumentParser(prog=f'zoo {command}', add_help=False, allow_abbrev=False)
    p.add_argument('--seeds', type=_seed_list)
    p.add_argument('--compile', action='store_true')
    p.add_argument('--runtime')
    p.add_argument('--images')
    p.add_argument('--corruptions', nargs='?', const='all')
    p.add_argument('--severities')
    p.add_argument('--corruptions-reference')
    return p


class ZooArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block) that names close matches of an unknown option."""

    def error(self, message: str):
        unknown = message.split('unrecognized arguments: ', 1)
        if len(unknown) == 2:
            option = unknown[1].split()[0].split('=', 1)[0]
            names = [o for a in self._actions for o in a.option_strings]
            close = difflib.get_close_matches(option, names, n=3, cutoff=0.6)
            message = (f'unknown option {option}' if option.startswith('-') else f'unexpected argument {option!r}') \
                + (f"; did you mean {' or '.join(close)}?" if close else '')
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            what, value = choice.group(1), choice.group(2)
            choices = re.findall(r"'([^']*)'", choice.group(3)) or choice.group(3).split(', ')
            # a choice the value begins (--runtime onnx -> onnxruntime) is as close as difflib's matches
            close = [c for c in choices if value and c.startswith(value)] or \
                difflib.get_close_matches(value, choices, n=3, cutoff=0.6)
            message = ((f'unknown command {value!r}' if what == 'COMMAND' else f'{what} {value!r} is not one of '
                        f"{', '.join(choices)}") + (f"; did you mean {' or '.join(close)}?" if close else ''))
        self.exit(2, f'{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n')


def build_parser() -> argparse.ArgumentParser:
    from zoo import __version__

    parser = ZooArgumentParser(prog='zoo', description='zoo: blocks, model families, recipes, results.',
                               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    parser.add_argument('--version', action='version', version=f'zoo {__version__}', help="print zoo's version and exit")
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    # The training commands are LightningCLI (main() hands them over before this parser runs); listed here so
    # that `zoo --help` shows every command.
    for command, what in (('fit', 'train a recipe: zoo fit -c recipes/configs/<family>/<name>.yaml'),
                          ('validate', "validate a checkpoint (--ckpt_path last|best|<file>)"),
                          ('test', 'test a checkpoint on the test split'),
                          ('predict', 'predictions of a checkpoint, written to the run folder')):
        sub.add_parser(command, help=what, add_help=False)

    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser('list', help='list registered models (or blocks with --blocks)', formatter_class=raw,
                       epilog="examples:\n  zoo list 'poolformer*'\n  zoo list --task detection\n  zoo list --blocks\n"
                              "  zoo list --recipes 'detection/*'")
    p.add_argument('pattern', nargs='?', default='*', help="glob pattern, e.g. 'poolformer*' (default: all)")
    p.add_argument('--family', help='only this family, e.g. metaformer')
    from zoo import tasks  # light: the task registry imports neither torch nor Lightning

    p.add_argument('--task', help=f'only this task: {", ".join(tasks.names())}')
    p.add_argument('--blocks', action='store_true', help='list registered blocks instead of models')
    p.add_argument('--recipes', action='store_true',
                   help='list the shipped recipes by the name `zoo fit -c NAME` takes (from any folder)')
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser('info', help="print a model's registry record (or a timm model's, as timm/NAME)",
                       formatter_class=raw, epilog='examples:\n  zoo info poolformer_s12\n  zoo info timm/resnet18')
    p.add_argument('name', help='a model name (`zoo list`), e.g. poolformer_s12, or timm/NAME, e.g. timm/resnet18')
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser('bench', help='params, MACs and CPU latency (median, IQR); --db without names re-measures '
                                     'the models of a results database',
                       description='Measure models with a controlled protocol (warm-up, at least --repeats timed '
                                   'calls and more while --time lasts, median and IQR, load average recorded). '
                                   'zoo bench --db URL with no names re-measures every network of that database '
                                   '(filter with --task/--dataset/--model; --runtime and --batch-size as for names) '
                                   'in one process and writes the rows: run it on a quiet machine to refresh the '
                                   'leaderboard\'s latency (`zoo results --runtime R` shows runtime R\'s).')
    p.add_argument('names', nargs='*', metavar='NAME',
                   help='registered models (or timm/NAME); none with --db: the models recorded in that database')
    p.add_argument('--vs', help='reference model, run interleaved in one process: timm/NAME, a zoo NAME, or '
                   'official:FILE.py[:CALLABLE] (your copy of the official code, given our weights; RaftMLP, Strip-MLP)')
    p.add_argument('--runtime', default='eager', metavar='eager,compile,onnxruntime[,openvino,...]',
                   help='runtimes to time, comma-separated (zoo.optimize: also onnxruntime-int8, openvino-int8, '
                        'calibrated on the random timed input, and auto); each runtime of each model runs '
                        'interleaved with the others, with its max |Δ| against eager and its compile or export time '
                        '(default eager)')
    p.add_argument('--batch-size', type=at_least(1), nargs='+', default=[1], help='batch sizes to time (default 1)')
    p.add_argument('--img-size', type=at_least(1), nargs='+',
                   help='image height and width (default: the model\'s input size); several sizes (64 128 224 384) are '
                        'timed interleaved, one row each, with the fitted exponent of latency ~ pixels^k per model; '
                        'a size a model cannot take (a fixed input size, below its minimum) is skipped with the reason')
    p.add_argument('--device', default='cpu', metavar='cpu|cuda[:N]',
                   help='where to time: cpu (default) or cuda (CUDA events, peak GPU memory, GPU name, driver and '
                        'clocks in each row; eager and compile)')
    p.add_argument('--repeats', type=at_least(1), default=20,
                   help='at least this many timed calls per model (default 20)')
    p.add_argument('--time', type=at_least(0, float), default=2.0, metavar='SECONDS',
                   help='time budget per model: keep timing while it lasts, up to --max-repeats (default 2; '
                        '0: exactly --repeats calls)')
    p.add_argument('--max-repeats', type=at_least(1), default=500, help='at most this many timed calls (default 500)')
    p.add_argument('--warmup', type=at_least(0), default=5, help='untimed calls before timing (default 5, and 0.5 s)')
    p.add_argument('--threads', type=at_least(1), help='torch threads (default: all cores)')
    p.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16', 'float16'],
                   help='float32, or bfloat16 / float16 under autocast (eager and compile)')
    p.add_argument('--mode', default='inference', choices=['inference', 'train'],
                   help='inference (forward under inference_mode) or train (forward + backward)')
    p.add_argument('--num-classes', type=at_least(0), help='classifier head size (default: the model\'s)')
    p.add_argument('--json', action='store_true', help='also print the rows as JSON')
    p.add_argument('--db', help='write the rows to this results database (path or SQLAlchemy URL); without '
                                'names: re-measure the models recorded there')
    p.add_argument('--task', help='with --db and no names: only runs of this task')
    p.add_argument('--dataset', help='with --db and no names: only runs on this dataset')
    p.add_argument('--model', help="with --db and no names: only these models (glob, e.g. 'poolformer*')")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser('export', help='write a model (or a recipe\'s trained checkpoint) as ONNX or torch.export '
                                      '.pt2, with a JSON card beside it', formatter_class=raw,
                       epilog=f'examples:\n  zoo export -c {DEMO} --ckpt_path best --out digits.onnx\n'
                              f'  zoo export -c {DEMO} --ckpt_path last --format pt2\n'
                              '  zoo export resnet_tiny --random-init --seed 0 --out resnet_tiny.onnx\n'
                              '  zoo export resnet_tiny --random-init --dynamic-size --out resnet_tiny_any_size.onnx\n\n'
                              'With -c CONFIG the newest run of that recipe gives the checkpoint (--ckpt_path best|last'
                              '|interrupted, as zoo test) and the card records that run\'s config, class names and '
                              'preprocessing; --nms puts a detector\'s decode and NMS in the graph. A NAME needs its '
                              'weights (--ckpt_path FILE) or --random-init.')
    p.add_argument('name', nargs='?', help='a registered model (`zoo list`), or give -c CONFIG')
    p.add_argument('-c', '--config', help='a recipe (file or shipped name): export its run\'s checkpoint')
    p.add_argument('--ckpt_path', help='best, last or interrupted (the newest run of -c CONFIG; default best with -c), '
                                       'or a file (a zoo fit .ckpt, or weights for NAME)')
    p.add_argument('--weights', default='auto', choices=['auto', 'ema', 'model'],
                   help='which weights of the checkpoint: auto (the evaluated ones: the EMA when the run kept one, '
                        'else the raw model; default), ema, or model (raw); the card records the one taken')
    p.add_argument('--format', default='onnx', choices=['onnx', 'pt2'],
                   help='onnx (torch.onnx.export, dynamo, dynamic batch) or pt2 (torch.export) (default onnx)')
    p.add_argument('--nms', action='store_true', help='detectors: decode and NMS inside the graph (a deployable file)')
    p.add_argument('--dynamic-size', action='store_true',
                   help='dynamic height and width too (multiples of the model\'s stride; the card says which): one '
                        'file for every resolution; refused in one line for a model with a fixed input size')
    p.add_argument('--int8', action='store_true',
                   help="ONNX Runtime int8 (QDQ) graph, calibrated on the recipe's training images (needs -c CONFIG)")
    p.add_argument('--random-init', action='store_true',
                   help='export NAME with random weights (no checkpoint), seeded: torch.manual_seed(SEED); '
                        'zoo.create(NAME) rebuilds them (the card records the seed)')
    p.add_argument('--seed', type=at_least(0), help='the seed of --random-init (default 0)')
    p.add_argument('--out', help='the file to write (default ./<recipe or model>.onnx|.pt2); the card is <file>.json')
    p.add_argument('--img-size', type=at_least(1), help="traced image size (default: the run's or the model's)")
    p.add_argument('--run_root', help='where -c CONFIG runs are (default $ZOO_RUNS or ./runs)')
    p.add_argument('--overwrite', action='store_true', help='replace an existing file and card')
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser('publish', help="a recipe's trained run as a Hugging Face model folder (config.json, "
                                       'model.safetensors, model card, eval_results.yaml); --push uploads it',
                       formatter_class=raw,
                       epilog=f'examples:\n  zoo publish -c {DEMO} --ckpt_path best --out poolformer_tiny_digits\n\n'
                              'The card\'s numbers come from the results database (--db): the run\'s and its '
                              'seed-repeats\' metric with a 95 % interval, params, MACs, latency per runtime. Load the '
                              "folder with zoo.create('local-dir:DIR'), or after --push ORG/NAME with "
                              "zoo.create('hf-hub:ORG/NAME') (docs/sharing.md).")
    p.add_argument('-c', '--config', help='a recipe (file or shipped name): publish its run\'s checkpoint')
    p.add_argument('--ckpt_path', help='best, last or interrupted (the newest run of -c CONFIG; default best), or a '
                                       'zoo fit .ckpt file')
    p.add_argument('--out', help='the folder to write (refused when it exists and is not empty, unless --force)')
    p.add_argument('--force', action='store_true', help='replace a non-empty --out folder')
    p.add_argument('--push', metavar='ORG/NAME',
                   help='upload the folder to this Hugging Face model repository (needs HF_TOKEN or `hf auth login`)')
    p.add_argument('--license', default='apache-2.0', help="the card's license (default apache-2.0, zoo's own)")
    p.add_argument('--db', help='results database of the run (default $ZOO_DB or ./zoo-results.db)')
    p.add_argument('--run_root', help='where -c CONFIG runs are (default $ZOO_RUNS or ./runs)')
    p.set_defaults(func=_cmd_publish)

    p = sub.add_parser('weights', help='where the released checkpoint files of a model are (URL, sha256 when '
                                       'known); --verify checks a downloaded file', formatter_class=raw,
                       epilog='examples:\n  zoo weights poolformer_s12\n\nWith --verify FILE the file\'s sha256 is '
                              'compared with the released one (when a source states it) and the file is loaded into '
                              'the model (strict, official keys remapped) before OK is printed.')
    p.add_argument('name', help='a registered model with released weights, e.g. poolformer_s12')
    p.add_argument('--verify', metavar='FILE', help='a downloaded checkpoint to check')
    p.set_defaults(func=_cmd_weights)

    p = sub.add_parser('profile', help='time and MACs per block kind (token mixer, channel mixer, norm, stem, ...)',
                       formatter_class=raw,
                       description='Where a model\'s time and MACs go: each block kind\'s own share of one forward '
                                   '(eager, module hooks; warm-up calls not counted), and with --runtime the total '
                                   'of other runtimes beside eager\'s.',
                       epilog='examples:\n  zoo profile tnt_tiny\n  zoo profile resnet_tiny --img-size 64\n'
                              '  zoo profile resnet_tiny --runtime eager,onnxruntime\n'
                              '  zoo profile poolformer_tiny --int8 --batch-size 16')
    p.add_argument('name', help='a registered model (`zoo list`)')
    p.add_argument('--runtime', default='eager', metavar='eager[,compile,onnxruntime,openvino]',
                   help='per-kind split in eager; other runtimes (comma-separated) add their total (default eager)')
    p.add_argument('--img-size', type=at_least(1), help="image height and width (default: the model's input size)")
    p.add_argument('--batch-size', type=at_least(1), default=1, help='batch size (default 1)')
    p.add_argument('--repeats', type=at_least(1), default=10, help='timed forwards, averaged (default 10)')
    p.add_argument('--warmup', type=at_least(0), default=3, help='forwards before timing, not counted (default 3)')
    p.add_argument('--threads', type=at_least(1), help='torch threads (default: all cores)')
    p.add_argument('--json', action='store_true', help='also print the rows as JSON')
    p.add_argument('--int8', action='store_true',
                   help='onnxruntime-int8 with one block kind quantized at a time: speed-up and output change per '
                        'kind against the float32 graph')
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser('results', help='leaderboards from the results database, one per task (best per model, '
                                       'model arguments and dataset, interval over seeds, latency with its spread)')
    p.add_argument('--task', help='only runs of this task, e.g. classification')
    p.add_argument('--dataset', help='only runs on this dataset, e.g. digits (a folder dataset: ade20k:NAME@DIGEST, '
                                     'as the board\'s dataset column shows)')
    p.add_argument('--model', help="glob pattern, e.g. 'poolformer*'")
    p.add_argument('--metric', help="final metric to rank by (default: the task's own: val/acc1 for classification, "
                                    'val/map for detection, val/acc for language modelling, val/psnr for denoising, '
                                    'val/miou for segmentation)')
    p.add_argument('--format', default='table', choices=['table', 'csv', 'json', 'markdown'], help='output format')
    p.add_argument('--plot', metavar='PNG', help='also draw metric vs latency with the Pareto front to this file')
    p.add_argument('--threads', type=at_least(1),
                   help='use latency records taken at this many threads (default: the count most models have)')
    p.add_argument('--runtime', default='eager', choices=RUNTIME_NAMES,
                   help='use latency records of this runtime (default eager)')
    p.add_argument('--cpu', metavar='SUBSTRING',
                   help='use latency records of the CPU whose model name contains this (default: the CPU most '
                        'records were taken on; one board never mixes CPUs; with --data: only that CPU\'s latency)')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'],
                   help='use latency records of this device (default cpu; with cuda, --cpu matches the GPU\'s name '
                        'and one board never mixes GPUs)')
    p.add_argument('--runs', action='store_true', help='list the runs instead of the leaderboard')
    p.add_argument('--data', action='store_true',
                   help='one row per run with every column of zoo.eval.results.data() (metrics, per-epoch time, '
                        'architecture statistics, latency per runtime and CPU); --format csv|json to export')
    p.add_argument('--only-best', action='store_true', help='with --data: the best run per model and model arguments')
    p.add_argument('--aggregate', action='store_true',
                   help='compare models over all their tasks/datasets and seeds: IQM and mean with stratified '
                        'bootstrap 95%% intervals (Agarwal et al. 2021)')
    p.add_argument('--db', help='results database path or SQLAlchemy URL (default $ZOO_DB or ./zoo-results.db); '
                                'it must exist')
    p.set_defaults(func=_cmd_results)

    p = sub.add_parser('sweep', help='an Optuna sweep from recipes/sweeps/NAME.py, stored in the results database',
                       formatter_class=raw, epilog=(
                           'examples:\n  zoo sweep recipes/sweeps/poolformer_digits.py --n-trials 20\n'
                           "  zoo sweep poolformer_digits --n-trials 20 --trial-args "
                           "'--trainer.max_epochs=2'\n\nThe same command resumes a stopped sweep. Trials write "
                           'their runs to <run_root>/sweeps/<study>/trial-<n>/, never into the recipe\'s own runs.'))
    p.add_argument('file', help='a shipped sweep by name (poolformer_digits, from any folder) or a search-space '
                                'file, e.g. recipes/sweeps/poolformer_digits.py')
    p.add_argument('--n-trials', type=int, default=None, metavar='N',
                   help="trials the study should hold (default: the file's N_TRIALS); the same command resumes")
    p.add_argument('--n-jobs', type=int, default=1, metavar='J', help='parallel worker processes on the study')
    p.add_argument('--seed', type=int, help="sampler seed (default: the sweep file's SEED, else random)")
    p.add_argument('--study-name', metavar='NAME', help='default: the file name; the same name resumes the study')
    p.add_argument('--timeout', type=at_least(0, float), metavar='SECONDS',
                   help='stop starting trials after this many seconds')
    p.add_argument('--db', help='results database path or SQLAlchemy URL (default $ZOO_DB or ./zoo-results.db)')
    p.add_argument('--trial-args', default='', metavar='ARGS',
                   help="extra LightningCLI arguments for every trial, one string: '--trainer.max_epochs=2'")
    p.set_defaults(func=_cmd_sweep)

    from .benchmark import add_parser
    add_parser(sub)
    return parser


def _join_trial_args(argv: list[str]) -> list[str]:
    """``--trial-args '--trainer.max_epochs=2'``: argparse would take the value for an option of its own."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == '--trial-args':
            out[i:i + 2] = [f'--trial-args={out[i + 1]}']
            break
    return out


def main(argv: list[str] | None = None) -> int:
    """``zoo ARGS``: the command's exit code. Output piped into a reader that stops early (``zoo list | head``)
    ends quietly, as Python's documentation recommends for SIGPIPE: stdout is pointed at devnull, so the
    interpreter's last flush does not fail again, and the exit code is 1."""
    try:
        code = _command(argv)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _corruptions(command: str, ns):
    """``zoo test --corruptions [NAMES] --severities S --corruptions-reference RUN``, checked before anything runs
    (``recipes.cli.Corruptions``), or None without ``--corruptions``."""
    if ns.corruptions is None:
        if ns.severities is not None or ns.corruptions_reference is not None:
            raise ValueError('--severities and --corruptions-reference go with --corruptions')
        return None
    if command != 'test':
        raise ValueError(f'--corruptions is for zoo test (accuracy on corrupted copies of the test split); '
                         f'zoo {command} uses the clean data')
    from zoo.datasets.corruptions import parse_corruptions, parse_severities

    from .cli import Corruptions
    return Corruptions(parse_corruptions(ns.corruptions), parse_severities(ns.severities), ns.corruptions_reference)


def _command(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TRAIN_COMMANDS:
        if '--help-all' in argv:  # LightningCLI's own, complete help
            argv = [a if a != '--help-all' else '--help' for a in argv]
        elif '-h' in argv or '--help' in argv:
            print(train_help(argv[0]))
            return 0
        from .cli import run_lightning_cli
        ns, rest = train_parser(argv[0]).parse_known_args(argv[1:])
        if ns.compile:                          # zoo fit --compile: the system compiles its network
            rest.append('--model.compile=true')
        if ns.runtime:                          # zoo test --runtime onnxruntime: the system evaluates it there
            from zoo._runtime import check_runtime
            if argv[0] != 'test':
                print(f'zoo {argv[0]}: error: --runtime is for zoo test (the network evaluated in that runtime); '
                      'zoo fit trains eagerly or with --compile', file=sys.stderr)
                return 2
            try:
                check_runtime(ns.runtime, '--runtime {runtime!r} is not one of {runtimes}')
            except ValueError as e:
                print(f'zoo test: error: {e}', file=sys.stderr)
                return 2
            rest.append(f'--model.runtime={ns.runtime}')
        if ns.images is not None and argv[0] != 'predict':
            print(f'zoo {argv[0]}: error: --images is for zoo predict (a folder of new images to predict); '
                  f'zoo {argv[0]} uses the recipe\'s data', file=sys.stderr)
            return 2
        try:
            corruptions = _corruptions(argv[0], ns)
        except ValueError as e:
            print(f'zoo {argv[0]}: error: {e}', file=sys.stderr)
            return 2
        if ns.seeds is None:
            return run_lightning_cli([argv[0], *rest], images=ns.images, corruptions=corruptions)
        codes = [run_lightning_cli([argv[0], *rest, f'--seed_everything={seed}'], images=ns.images,
                                   corruptions=corruptions) for seed in ns.seeds]
        return next((c for c in codes if c), 0)
    parser = build_parser()
    args, unknown = parser.parse_known_args(_join_trial_args(argv))
    if unknown:  # reported by the command's own parser: its name, its options as close matches
        sub = parser._subparsers._group_actions[0].choices.get(args.command, parser) if args.command else parser
        sub.error(f"unrecognized arguments: {' '.join(unknown)}")
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
