"""``zoo publish -c CONFIG [--ckpt_path best|last|FILE] --out DIR [--force] [--push ORG/NAME]`` and ``zoo weights NAME
[--verify FILE]``.

``zoo publish`` writes a trained run as a Hugging Face model folder in timm's layout (``zoo/_hub.py``):
``config.json`` (the ``zoo.create`` name and arguments, timm's ``pretrained_cfg`` with the run's input size, mean,
std and label names), ``model.safetensors`` (the evaluated weights, ``zoo.read_weights(ckpt, 'auto')``: the EMA
when the run kept one), ``README.md`` (a model card from the results database: the run's and its seed-repeats'
primary metric with a Student-t 95 % interval, params, MACs, latency per runtime and the CPU it was taken on, the
training command and dataset) and ``eval_results.yaml`` (the Hub's ``model-index``). The checkpoint is found as
``zoo export`` finds it (``recipes/export.py``). The folder is written to a temporary folder beside DIR and renamed:
it appears whole or not at all; a non-empty DIR is replaced only with ``--force``. ``--push ORG/NAME`` uploads it
with ``huggingface_hub.HfApi().upload_folder`` (a token is needed: ``HF_TOKEN`` or ``hf auth login``).

Read back with ``zoo.create('local-dir:DIR')`` or ``zoo.create('hf-hub:ORG/NAME')`` (docs/sharing.md).

``zoo weights NAME`` prints the released checkpoint files the registry records for NAME (``ModelInfo.weights``:
URL, sha256 where a source states one, else "hash unknown"); ``--verify FILE`` checks a downloaded file's sha256
(when known) and that it loads into ``zoo.create(NAME)`` (strict, through the family's ``remap_checkpoint``).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import zoo

from . import runs
from .distill import file_sha256
from .export import _checkpoint, _class_names, _data_module, _floats, _from_lightning, _recipe, _run_config, _task

# The Hub's task and metric vocabulary (huggingface.co/tasks, the model-index metric types) for zoo's tasks and
# primary metrics; a metric not listed keeps its own name.
HUB_TASKS = {'classification': 'image-classification', 'detection': 'object-detection',
             'segmentation': 'image-segmentation', 'language_modeling': 'text-generation',
             'denoising': 'image-to-image'}
HUB_METRICS = {'acc1': 'accuracy', 'acc5': 'accuracy', 'acc': 'accuracy', 'map': 'mAP', 'map50': 'mAP',
               'miou': 'mean_iou', 'psnr': 'psnr'}
CARD_NOTE = ('The Hub\'s model-index format has no field for an interval or a number of seeds, so both are written '
             'in each metric\'s name.')


# ------------------------------------------------------------------------------------------------- zoo publish
def publish_command(args) -> int:
    """The ``zoo publish`` subcommand (``recipes/main.py`` parses the arguments)."""
    token = _hub_token() if args.push else None     # first: a push that cannot happen costs nothing
    if args.push and len([p for p in args.push.split('/') if p]) != 2:
        raise ValueError(f'--push {args.push}: expected ORG/NAME, a Hugging Face model repository')
    if not args.config and not args.ckpt_path:
        raise ValueError('give -c CONFIG (a recipe whose run to publish) or --ckpt_path FILE (a zoo fit .ckpt)')
    if args.out is None and not args.push:
        raise ValueError('give --out DIR (the folder to write) or --push ORG/NAME')
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise ValueError(f'{out} exists and is not empty; nothing was written (pass --force to replace it, or '
                         '--out another folder)')
    run_root = args.run_root or os.environ.get('ZOO_RUNS', 'runs')
    recipe, cfg, stem = None, None, None
    if args.config:
        recipe, cfg = _recipe(args.config)
        stem = recipe.stem
    ckpt = _checkpoint(args.ckpt_path or 'best', stem, run_root)
    if ckpt.suffix != '.ckpt':
        raise ValueError(f'--ckpt_path {ckpt}: zoo publish takes a zoo fit checkpoint (.ckpt), which names its '
                         'model, arguments and data; for bare weights use zoo.create(NAME, checkpoint=FILE)')
    init = dict((cfg or {}).get('model', {}).get('init_args') or {})
    net, created = _from_lightning(ckpt, init.get('name'), (cfg or {}).get('model', {}).get('class_path'))
    net.eval()
    name, task = created['name'], _task(created['name'])
    run_dir = ckpt.parent.parent if ckpt.parent.name == 'checkpoints' else None
    run_config_file, run_cfg = _run_config(ckpt)
    dm = _data_module(run_cfg if run_cfg is not None else cfg)
    kw = created['kwargs']
    size = zoo.tasks.input_size(net, img_size=kw.get('img_size'), in_chans=kw.get('in_chans'), task=task)
    labels = _class_names(dm) if dm is not None else None
    config = zoo.folder_config(
        net, name, net.zoo_args, input_size=size if len(size) == 3 else None,
        mean=_floats(getattr(dm, 'mean', None)), std=_floats(getattr(dm, 'std', None)), label_names=labels,
        zoo_version=zoo.__version__, task=task, weights=created['weights'])

    run_id = runs.read_manifest(run_dir).get('results_run_id') if run_dir is not None else None
    numbers = _db_numbers(args.db, run_id, task)
    if numbers is None:
        print(f'zoo publish: warning: no results-database row for {run_dir or ckpt} '
              f'({"the run recorded none (--db none)" if run_id is None else f"run {run_id} is not in the database"}'
              '); the card has no measured numbers', file=sys.stderr)
    repo = args.push or (out.name if out is not None else name)
    model_index = _model_index(repo, name, task, numbers)
    card = _card(repo, name, created, task, numbers, model_index, recipe=recipe, config_file=run_config_file,
                 license=args.license, labels=labels)

    target = out if out is not None else Path(tempfile.mkdtemp(prefix='zoo-publish-'))
    _write_folder(target, net, config, card, model_index, replace=out is not None)
    if out is not None:
        print(f'zoo publish: wrote {out}/ (config.json, model.safetensors, README.md, eval_results.yaml; '
              f'{created["weights"]} weights)')
    try:
        if args.push:
            _push(target, args.push, token, name)
    finally:
        if out is None:
            shutil.rmtree(target, ignore_errors=True)
    return 0


def _hub_token() -> str:
    """The Hugging Face token (``HF_TOKEN`` or the one ``hf auth login`` stored), or a one-line error."""
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise ValueError('--push needs a Hugging Face token: set HF_TOKEN or run `hf auth login` (nothing was '
                         'written or uploaded)')
    return token


def _push(folder: Path, repo_id: str, token: str, name: str) -> None:
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type='model', exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type='model',
                      commit_message=f'zoo publish: {name}')
    print(f'zoo publish: uploaded to https://huggingface.co/{repo_id} '
          f"(zoo.create('hf-hub:{repo_id}') loads it)")


def _write_folder(out: Path, net, config: dict, card: str, model_index: dict, replace: bool) -> None:
    """Everything written into a temporary folder beside ``out``, then renamed onto it: a reader (or a crash)
    never sees half a folder; a replaced folder is removed only after the new one is in place."""
    import yaml

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))
    try:
        zoo.save_folder(net, tmp, config)
        (tmp / 'README.md').write_text(card)
        (tmp / 'eval_results.yaml').write_text(yaml.safe_dump(model_index, sort_keys=False))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's folder (and safetensors' file) are private: the user's usual modes
        for f in tmp.iterdir():
            f.chmod(0o666 & ~umask)
        old = None
        if out.exists():
            if not replace:
                shutil.rmtree(out)    # our own temporary folder (no --out)
            else:
                old = Path(tempfile.mkdtemp(prefix=f'.{out.name}.old.', dir=out.parent))
                os.replace(out, old / out.name)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _db_numbers(db: str | None, run_id: int | None, task: str) -> dict | None:
    """The run's row of ``zoo.eval.results.data()`` and its seed-repeats' primary metric (finished runs of the same
    configuration key and dataset): their mean and Student-t 95 % interval (``stats.t_interval``, from
    ``MIN_SEEDS_FOR_INTERVAL`` seeds on, as the leaderboard), or None without a row."""
    from zoo.eval import results

    if run_id is None or results.resolve_url(db) is None:
        return None
    try:
        store = results.open_db(db, create=False)
    except results.ResultsDBError:
        return None
    df = results.data(db=store, status=None)
    mine = df[df.run_id == int(run_id)]
    if mine.empty:
        return None
    row = mine.iloc[0].to_dict()
    reps = df[(df.config_key == row['config_key']) & (df.dataset == row['dataset']) & (df.status == 'finished')
              & df.final.notna()].sort_values('seed')
    values = reps.final.astype(float).tolist()
    n = len(values)
    mean, half = results.t_interval(values) if n else (float('nan'), float('nan'))
    interval = (mean - half, mean + half) if n >= results.MIN_SEEDS_FOR_INTERVAL else None
    runtimes = sorted({c[len('latency_'):-len('_ms')] for c in df.columns
                       if c.startswith('latency_') and c.endswith('_ms') and '_b16' not in c and '_iqr' not in c})
    latency = {rt: {'batch_1_ms': _num(row.get(f'latency_{rt}_ms')), 'iqr_ms': _num(row.get(f'latency_{rt}_iqr_ms')),
                    'batch_16_ms': _num(row.get(f'latency_{rt}_b16_ms'))} for rt in runtimes}
    latency = {rt: v for rt, v in latency.items() if v['batch_1_ms'] is not None or v['batch_16_ms'] is not None}
    return {'run_id': int(run_id), 'metric': row['metric'] or zoo.tasks.get(task).metric, 'final': _num(row['final']),
            'seed': _int(row['seed']), 'dataset': row['dataset'], 'recipe': row['recipe'],
            'params': _int(row['params']), 'macs': _int(row['macs']), 'input_shape': row['input_shape'], 'max_epochs': row['max_epochs'],
            'seeds': [None if s != s else int(s) for s in reps.seed.tolist()], 'values': values, 'n_seeds': n,
            'mean': mean if n else None, 'interval': interval, 'latency': latency,
            'latency_cpu': row['latency_cpu'], 'latency_threads': row['latency_threads'],
            'run_ids': [int(i) for i in reps.run_id]}


def _num(v) -> float | None:
    return None if v is None or v != v else float(v)


def _int(v) -> int | None:
    return None if v is None or v != v else int(v)


def _interval_text(numbers: dict) -> str:
    n = numbers['n_seeds']
    if numbers['interval'] is None:
        return f'{n} seed{"s" * (n != 1)}, too few for an interval (from {_min_seeds()} on)'
    lo, hi = numbers['interval']
    return f'{n} seeds, 95 % Student-t interval of the mean [{lo:.4f}, {hi:.4f}]'


def _min_seeds() -> int:
    from zoo.eval import results
    return results.MIN_SEEDS_FOR_INTERVAL


def _model_index(repo: str, name: str, task: str, numbers: dict | None) -> dict:
    """The Hub's ``model-index`` (the format of a model card's metadata): one result, the primary metric over the
    run's seed-repeats; the interval and seed count in the metric's name (the format has no field for them)."""
    metrics = []
    if numbers is not None and numbers['mean'] is not None:
        leaf = numbers['metric'].rsplit('/', 1)[-1]
        metrics.append({'type': HUB_METRICS.get(leaf, leaf), 'value': float(numbers['mean']),
                        'name': f'{numbers["metric"]}, mean of {_interval_text(numbers)}'})
    dataset = (numbers or {}).get('dataset') or 'unknown'
    return {'model-index': [{'name': repo, 'results': [{
        'task': {'type': HUB_TASKS.get(task, task)},
        'dataset': {'name': dataset, 'type': dataset},
        'metrics': metrics}]}]}


def _card(repo: str, name: str, created: dict, task: str, numbers: dict | None, model_index: dict, *,
          recipe, config_file, license: str, labels) -> str:
    """README.md: YAML front matter (``library_name: zoo``, tags, license, model-index), then what the weights are,
    how to load them, the measured numbers and how they were trained."""
    import yaml

    info = zoo.model_info(name)
    args = ', '.join(f'{k}={v!r}' for k, v in created['kwargs'].items())
    front = {'library_name': 'zoo', 'license': license,
             'tags': [t for t in ('zoo', HUB_TASKS.get(task, task), info.family, (numbers or {}).get('dataset')) if t],
             **model_index}
    lines = ['---', yaml.safe_dump(front, sort_keys=False).strip(), '---', '',
             f'# {repo}', '',
             f'`{name}` ({info.family}; {info.paper or "zoo model"}) trained with zoo'
             + (f' on `{numbers["dataset"]}`' if numbers else '') + '.'
             + (f' Official code: {info.repo}.' if info.repo else ''), '',
             '## Use', '', '```python', 'import zoo', '',
             f"model = zoo.create('hf-hub:{repo}')   # or zoo.create('local-dir:PATH/TO/THIS/FOLDER')",
             'model.pretrained_cfg   # input_size, mean, std' + (', label_names' if labels else ''), '```', '',
             f'`config.json` rebuilds the network: `zoo.create({name!r}{", " + args if args else ""})`; '
             f'`model.safetensors` holds the {"EMA" if created["weights"] == "ema" else "raw (no EMA was kept)"} '
             f'weights, the ones the run evaluated (epoch {created.get("epoch")}, step {created.get("global_step")}).',
             '']
    lines += ['## Results', '']
    if numbers is None:
        lines += ['No results-database row was found for this run; nothing measured is reported.', '']
    else:
        m = numbers['metric']
        lines += ['From the zoo results database (`zoo results --runs`), run '
                  f'{numbers["run_id"]} and its seed-repeats (runs {", ".join(map(str, numbers["run_ids"]))}).', '',
                  '| what | value |', '|---|---|',
                  f'| {m}, this run (seed {numbers["seed"]}) | {_fmt(numbers["final"])} |',
                  f'| {m}, mean over seeds | {_fmt(numbers["mean"])} |',
                  f'| interval | {_interval_text(numbers)} |',
                  f'| per seed ({", ".join(map(str, numbers["seeds"]))}) | '
                  f'{", ".join(_fmt(v) for v in numbers["values"])} |',
                  f'| params | {numbers["params"] if numbers["params"] is not None else "not recorded"} |',
                  f'| MACs | {numbers["macs"] if numbers["macs"] is not None else "not recorded"}'
                  + (f' at {numbers["input_shape"]} |' if numbers['input_shape'] else ' |'), '']
        if numbers['latency']:
            lines += [f'Latency (median of the most trusted record per runtime, float32 inference) on '
                      f'{numbers["latency_cpu"]}, {numbers["latency_threads"]} thread(s):', '',
                      '| runtime | batch 1 (ms) | IQR (ms) | batch 16 (ms) |', '|---|---|---|---|']
            lines += [f'| {rt} | {_fmt(v["batch_1_ms"], 3)} | {_fmt(v["iqr_ms"], 3)} | {_fmt(v["batch_16_ms"], 3)} |'
                      for rt, v in numbers['latency'].items()]
            lines.append('')
        else:
            lines += ['No trusted latency was recorded for this run (`zoo bench --db DB` measures it).', '']
        lines += [CARD_NOTE, '']
    lines += ['## Training', '']
    recipe_text = (numbers or {}).get('recipe') or (str(recipe) if recipe else None)
    seed = (numbers or {}).get('seed')
    if recipe_text:
        lines += ['```bash', f'zoo fit -c {recipe_text}' + (f' --seed_everything {seed}' if seed is not None else ''),
                  '```', '']
    if numbers and numbers.get('max_epochs') is not None:
        lines += [f'Budget: {numbers["max_epochs"]} epoch(s).', '']
    if config_file:
        lines += [f'The run\'s resolved config was `{config_file}`.', '']
    if labels:
        lines += [f'Labels ({len(labels)}): {", ".join(labels)}.', '']
    lines += [f'Written by `zoo publish` (zoo {zoo.__version__}).', '']
    return '\n'.join(lines)


def _fmt(v, digits: int = 4) -> str:
    return 'n/a' if v is None or v != v else f'{v:.{digits}f}'


# ------------------------------------------------------------------------------------------------- zoo weights
def weights_command(args) -> int:
    """``zoo weights NAME [--verify FILE]``: the released files of NAME, or a check of a downloaded one."""
    info = zoo.model_info(args.name)       # an unknown name: the registry's one-line error with close matches
    if not info.weights:
        having = [n for n in zoo.list_models() if zoo.model_info(n).weights]
        raise ValueError(f'the registry records no released checkpoint for {args.name}'
                         + (f' (models with some: {", ".join(having)})' if having else ''))
    if not args.verify:
        for w in info.weights:
            print(f'{args.name}\t{w.url}\t{"sha256 " + w.sha256 if w.sha256 else "hash unknown"}'
                  + (f'\t({w.source})' if w.source else ''))
        return 0
    path = Path(args.verify)
    if not path.is_file():
        raise FileNotFoundError(f'--verify {path}: no such file')
    known = {w.sha256 for w in info.weights if w.sha256}
    digest = file_sha256(path, hex_chars=None)
    if known and digest not in known:
        raise ValueError(f'{path}: sha256 {digest} is not the released file\'s ({", ".join(sorted(known))})')
    try:
        zoo.create(args.name, checkpoint=str(path))   # strict, through the family's remap_checkpoint
    except (ValueError, KeyError, FileNotFoundError) as e:
        first = str(e.args[0] if isinstance(e, KeyError) and e.args else e).splitlines()
        raise ValueError(f'{path} does not load into {args.name}: ' + ' '.join(s.strip() for s in first[:3])) from None
    print(f'{path}: OK, loads into {args.name}' + (' (sha256 matches)' if known else
                                                    f' (hash unknown; sha256 {digest})'))
    return 0
