"""A benchmark file, ``benchmarks/<name>.yaml``: groups of entries × seeds under one shipped recipe each.

    name: paper_blocks                  # optional; default the file's stem
    description: ...
    defaults: {seeds: [0, 1, 2], batch_sizes: [1, 16], runtimes: [eager]}   # for every group (optional)
    groups:
      blocks_digits:
        task: classification            # zoo._registry.TASKS
        dataset: digits                 # the label of the group in the report
        recipe: poolformer/poolformer_tiny_digits_15e     # a shipped recipe (``zoo list --recipes``) or a file
        overrides: {trainer.max_epochs: 4}                # LightningCLI arguments for every entry: --KEY=VALUE
        metric: val/acc1                # default: the task's primary metric
        entries:                        # name -> overrides of this entry (or a list of model names)
          pooling: {model.name: metaformer_tiny, model.model_args: {token_mixer: pooling}}
        seeds: [0, 1, 2]
        batch_sizes: [1, 16]            # latency batch sizes, a subset of {1, 16}
        runtimes: [eager]               # eager, compile, onnxruntime, openvino
        pretrained_from: {group: blocks_shapes, entry: resnet_standard, arg: model.checkpoint}
        claims:                         # a paper's claim, checked on the group's runs (benchmark_report.py)
          - {claim: 'Tune mode keeps accuracy', paper: 'You et al. 2024', metric: val/acc1, compare: '~',
             entries: [tune, eval], tolerance: 0.01}
    across: {classification: [blocks_digits, blocks_shapes]}   # IQM over these groups (report)

An override ``KEY: VALUE`` becomes the argument ``--KEY=VALUE`` of ``zoo fit -c RECIPE`` (a mapping or list
VALUE as one flow-style YAML string), so each row of the report is re-run by the command printed beside it.
``pretrained_from``: every job of the group waits for the named entry's run of the same seed (or its first
seed) to finish and gets its last checkpoint as ``arg``. Errors are one line with close matches
(``BenchmarkError``: exit code 2 on the command line).
"""
from __future__ import annotations

import difflib
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

TOP_KEYS = ('name', 'description', 'defaults', 'groups', 'across')
GROUP_KEYS = ('task', 'dataset', 'recipe', 'overrides', 'metric', 'entries', 'seeds', 'batch_sizes', 'runtimes',
              'pretrained_from', 'claims', 'description')
DEFAULT_KEYS = ('seeds', 'batch_sizes', 'runtimes', 'overrides')
CLAIM_KEYS = ('claim', 'paper', 'metric', 'compare', 'entries', 'tolerance')
PRETRAINED_KEYS = ('group', 'entry', 'arg')
RUNTIMES = ('eager', 'compile', 'onnxruntime', 'openvino')
BATCH_SIZES = (1, 16)
COMPARISONS = ('<', '>', '~')
BENCHMARKS = Path(__file__).resolve().parents[1] / 'benchmarks'   # a checkout's benchmarks/ folder


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used as written: one line saying what was expected."""


@dataclass(frozen=True)
class Claim:
    claim: str
    metric: str
    compare: str
    entries: tuple[str, str]
    paper: str = ''
    tolerance: float = 0.01


@dataclass(frozen=True)
class Group:
    name: str
    task: str
    dataset: str
    recipe: str
    overrides: dict
    entries: dict                      # entry name -> overrides
    seeds: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    runtimes: tuple[str, ...]
    metric: str
    pretrained_from: dict | None = None
    claims: tuple[Claim, ...] = ()
    description: str = ''


@dataclass(frozen=True)
class Job:
    """One training run: a group's entry at one seed."""
    group: str
    entry: str
    seed: int
    recipe: str
    overrides: dict                    # group overrides, then the entry's
    key: str                           # what the database knows the job by: recipe, overrides and seed

    def argv(self) -> list[str]:
        return ['fit', '-c', self.recipe, *override_args(self.overrides), f'--seed_everything={self.seed}']


@dataclass
class Benchmark:
    name: str
    path: Path
    groups: dict[str, Group]
    description: str = ''
    across: dict = field(default_factory=dict)

    def jobs(self) -> list[Job]:
        out = []
        for g in self.groups.values():
            for entry, over in g.entries.items():
                merged = {**g.overrides, **over}
                for seed in g.seeds:
                    out.append(Job(g.name, entry, seed, g.recipe, merged, job_key(g.recipe, merged, seed)))
        return out

    def model_of(self, job: Job) -> str:
        """The model a job trains: its ``model.name`` override, else the recipe's."""
        return str(job.overrides.get('model.name') or recipe_model(job.recipe))


def override_args(overrides: dict) -> list[str]:
    """``{'trainer.max_epochs': 4, 'model.model_args': {'token_mixer': 'raft'}}`` ->
    ``['--trainer.max_epochs=4', "--model.model_args={token_mixer: raft}"]``."""
    import yaml

    out = []
    for k, v in overrides.items():
        if isinstance(v, (dict, list)):
            v = yaml.safe_dump(v, default_flow_style=True, sort_keys=False, width=2**31 - 1).strip()  # one line
        elif isinstance(v, bool):
            v = 'true' if v else 'false'
        elif v is None:
            v = 'null'
        out.append(f'--{k}={v}')
    return out


def job_key(recipe: str, overrides: dict, seed: int) -> str:
    blob = json.dumps({'recipe': recipe, 'overrides': overrides, 'seed': seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def recipe_model(recipe: str) -> str | None:
    """``model.init_args.name`` of a shipped recipe (or recipe file)."""
    import yaml

    from .runs import find_recipe

    cfg = yaml.safe_load(find_recipe(recipe).read_text()) or {}
    return ((cfg.get('model') or {}).get('init_args') or {}).get('name')


def _close(value, choices) -> str:
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=3, cutoff=0.5)
    return f"; did you mean {' or '.join(close)}?" if close else f" (expected one of: {', '.join(map(str, choices))})"


def _keys(where: str, d, allowed) -> dict:
    if not isinstance(d, dict):
        raise BenchmarkError(f'{where} must be a mapping; got {type(d).__name__}')
    for k in d:
        if k not in allowed:
            raise BenchmarkError(f'{where}: unknown key {k!r}{_close(k, allowed)}')
    return d


def find_benchmark(name: str) -> Path:
    """``NAME`` as a file: a path that exists, else ``benchmarks/NAME.yaml`` below the working directory, else in
    this checkout's ``benchmarks/``. An unknown name lists close matches."""
    p = Path(name)
    if p.is_file():
        return p
    for root in (Path.cwd() / 'benchmarks', BENCHMARKS):
        for suffix in ('.yaml', '.yml'):
            if (root / f'{name}{suffix}').is_file():
                return root / f'{name}{suffix}'
    known = sorted({q.stem for root in (Path.cwd() / 'benchmarks', BENCHMARKS) if root.is_dir()
                    for q in root.glob('*.y*ml')})
    raise BenchmarkError(f'no benchmark {name!r} (looked for benchmarks/{name}.yaml)'
                         + (_close(name, known) if known else '; write benchmarks/NAME.yaml'))


def load(name: str) -> Benchmark:
    """Read and check the structure of a benchmark file (names are checked against the registry by ``check``)."""
    import yaml

    path = find_benchmark(name)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, 'problem_mark', None)
        where = f' (line {mark.line + 1})' if mark is not None else ''
        raise BenchmarkError(f'{path} is not valid YAML{where}: {getattr(e, "problem", e)}') from None
    raw = _keys(str(path), raw or {}, TOP_KEYS)
    defaults = _keys(f'{path}: defaults', raw.get('defaults') or {}, DEFAULT_KEYS)
    groups_raw = raw.get('groups')
    if not groups_raw:
        raise BenchmarkError(f'{path}: no groups (expected groups: {{NAME: {{task, recipe, entries, ...}}}})')
    groups = {}
    for gname, g in _keys(f'{path}: groups', groups_raw, list(groups_raw)).items():
        groups[gname] = _group(path, gname, _keys(f'{path}: group {gname}', g, GROUP_KEYS), defaults)
    for g in groups.values():
        pf = g.pretrained_from
        if pf is not None:
            if pf['group'] not in groups:
                raise BenchmarkError(f'{path}: group {g.name}: pretrained_from names group {pf["group"]!r}'
                                     f'{_close(pf["group"], list(groups))}')
            if pf['entry'] not in groups[pf['group']].entries:
                raise BenchmarkError(f'{path}: group {g.name}: pretrained_from names entry {pf["entry"]!r}, not in '
                                     f'group {pf["group"]}{_close(pf["entry"], list(groups[pf["group"]].entries))}')
    across = raw.get('across') or {}
    for label, names in _keys(f'{path}: across', across, list(across)).items():
        for n in names if isinstance(names, list) else [names]:
            if n not in groups:
                raise BenchmarkError(f'{path}: across {label}: unknown group {n!r}{_close(n, list(groups))}')
    return Benchmark(str(raw.get('name') or path.stem), path, groups, str(raw.get('description') or ''), across)


def _int_list(where: str, v, allowed=None) -> tuple:
    v = [v] if isinstance(v, (int, str)) else v
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise BenchmarkError(f'{where} must be a non-empty list of integers; got {v!r}')
    for x in v:
        if allowed is not None and x not in allowed:
            raise BenchmarkError(f'{where}: {x} is not one of {", ".join(map(str, allowed))}')
    return tuple(v)


def _group(path: Path, name: str, g: dict, defaults: dict) -> Group:
    from zoo._registry import PRIMARY_METRIC, TASKS

    where = f'{path}: group {name}'
    for k in ('task', 'recipe', 'entries'):
        if not g.get(k):
            raise BenchmarkError(f'{where}: missing {k!r}')
    if g['task'] not in TASKS:
        raise BenchmarkError(f'{where}: unknown task {g["task"]!r}{_close(g["task"], TASKS)}')
    entries = g['entries']
    if isinstance(entries, list):             # a list of model names
        entries = {str(m): {'model.name': m} for m in entries}
    if not isinstance(entries, dict):
        raise BenchmarkError(f'{where}: entries must map names to overrides (or list model names)')
    entries = {str(k): dict(v or {}) for k, v in entries.items()}
    for e, over in entries.items():
        if not isinstance(over, dict):
            raise BenchmarkError(f'{where}: entry {e} must be a mapping of overrides')
    overrides = {**(defaults.get('overrides') or {}), **(g.get('overrides') or {})}
    runtimes = g.get('runtimes', defaults.get('runtimes', ['eager']))
    runtimes = [runtimes] if isinstance(runtimes, str) else list(runtimes)
    for r in runtimes:
        if r not in RUNTIMES:
            raise BenchmarkError(f'{where}: unknown runtime {r!r}{_close(r, RUNTIMES)}')
    metric = g.get('metric') or PRIMARY_METRIC.get(g['task'])
    pf = g.get('pretrained_from')
    if pf is not None:
        pf = {'arg': 'model.checkpoint', **_keys(f'{where}: pretrained_from', pf, PRETRAINED_KEYS)}
        if not pf.get('group') or not pf.get('entry'):
            raise BenchmarkError(f'{where}: pretrained_from needs group and entry')
    claims = []
    for i, c in enumerate(g.get('claims') or []):
        c = _keys(f'{where}: claim {i + 1}', c, CLAIM_KEYS)
        for k in ('claim', 'compare', 'entries'):
            if k not in c:
                raise BenchmarkError(f'{where}: claim {i + 1}: missing {k!r}')
        if c['compare'] not in COMPARISONS:
            raise BenchmarkError(f'{where}: claim {i + 1}: compare {c["compare"]!r} is not one of < > ~')
        pair = c['entries']
        if not isinstance(pair, list) or len(pair) != 2:
            raise BenchmarkError(f'{where}: claim {i + 1}: entries must name two entries of the group')
        for e in pair:
            if e not in entries:
                raise BenchmarkError(f'{where}: claim {i + 1}: unknown entry {e!r}{_close(e, list(entries))}')
        claims.append(Claim(str(c['claim']), str(c.get('metric') or metric), c['compare'], tuple(pair),
                            str(c.get('paper') or ''), float(c.get('tolerance', 0.01))))
    return Group(name, g['task'], str(g.get('dataset') or ''), str(g['recipe']), overrides, entries,
                 _int_list(f'{where}: seeds', g.get('seeds', defaults.get('seeds', [0]))),
                 _int_list(f'{where}: batch_sizes', g.get('batch_sizes', defaults.get('batch_sizes', [1])),
                           BATCH_SIZES),
                 tuple(runtimes), str(metric), pf, tuple(claims), str(g.get('description') or ''))


def check(bench: Benchmark, say=print) -> int:
    """Check every name of the file against the shipped recipes, the model registry and each system's arguments:
    each distinct (recipe, overrides) is parsed by ``zoo fit ... --print_config`` in this process (nothing is
    built or trained). Returns the number of jobs; raises ``BenchmarkError`` on the first bad entry."""
    from .cli import check_arguments
    from .runs import find_recipe

    for g in bench.groups.values():
        try:
            find_recipe(g.recipe)
        except FileNotFoundError as e:
            raise BenchmarkError(f'{bench.path}: group {g.name}: {e}') from None
    seen = set()
    for job in bench.jobs():
        if (job.recipe, json.dumps(job.overrides, sort_keys=True, default=str)) in seen:
            continue
        seen.add((job.recipe, json.dumps(job.overrides, sort_keys=True, default=str)))
        argv = job.argv()
        if bench.groups[job.group].pretrained_from:      # the checkpoint exists only once the dependency has run
            argv = [a for a in argv if not a.startswith(f'--{bench.groups[job.group].pretrained_from["arg"]}=')]
        try:
            check_arguments(argv)
        except Exception as e:      # the CLI's own one-line error (close matches included)
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise BenchmarkError(f'{bench.path}: group {job.group}, entry {job.entry}: {msg}') from None
        _check_model(bench, job)
        say(f'ok  {job.group}/{job.entry}: zoo fit -c {job.recipe} '
            + ' '.join(shlex.quote(a) for a in override_args(job.overrides)))
    return len(bench.jobs())


def _check_model(bench: Benchmark, job: Job) -> None:
    """The entry's model with its ``model_args`` builds (on the ``meta`` device: nothing is allocated), so a
    misspelt block name fails here rather than after the runs before it."""
    import yaml

    import torch

    import zoo

    from .runs import find_recipe

    cfg = yaml.safe_load(find_recipe(job.recipe).read_text()) or {}
    init = ((cfg.get('model') or {}).get('init_args') or {})
    name = job.overrides.get('model.name', init.get('name'))
    args = job.overrides.get('model.model_args', init.get('model_args')) or {}
    if isinstance(args, str):
        args = yaml.safe_load(args) or {}
    if not name or str(name).startswith('timm/'):
        return
    try:
        with torch.device('meta'):
            zoo.create(str(name), **dict(args))
    except (KeyError, ValueError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise BenchmarkError(f'{bench.path}: group {job.group}, entry {job.entry}: {msg}') from None
    except Exception:           # a model that cannot be built on meta is checked by the run itself
        pass
