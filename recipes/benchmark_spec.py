"""A benchmark file, ``benchmarks/<name>.yaml``: groups of entries × seeds under one shipped recipe each.

    name: paper_blocks                  # optional; default the file's stem
    description: ...
    defaults: {seeds: [0, 1, 2], batch_sizes: [1, 16], runtimes: [eager]}   # for every group (optional)
    groups:
      blocks_digits:
        task: classification            # a zoo.tasks name
        dataset: digits                 # the label of the group in the report
        recipe: poolformer/poolformer_tiny_digits_15e     # a shipped recipe (``zoo list --recipes``) or a file
        overrides: {trainer.max_epochs: 4}                # LightningCLI arguments for every entry: --KEY=VALUE
        metric: val/acc1                # default: the task's primary metric
        entries:                        # name -> overrides of this entry (or a list of model names)
          pooling: {model.name: metaformer_tiny, model.model_args: {token_mixer: pooling}}
        seeds: {min: 3, max: 6}         # or a list: exactly those seeds (see below)
        floor: 0.1                      # the metric's value that learned nothing (chance, the noisy input's PSNR)
        batch_sizes: [1, 16]            # latency batch sizes, a subset of {1, 16}
        runtimes: [eager]               # eager, compile, onnxruntime, openvino
        pretrained_from: {group: blocks_shapes, entry: resnet_standard, arg: model.checkpoint}
        # or one pretrained entry per entry, and an arg inside an entry's mapping override:
        # pretrained_from: {group: backbones, entry: {pool: poolformer, conv: resnet},
        #                   arg: model.model_args.backbone_kwargs.checkpoint}
        claims:                         # a paper's claim, decided on the group's runs (benchmark_claims.py)
          - {claim: 'Tune mode keeps accuracy', paper: 'You et al. 2024', metric: val/acc1, compare: '~',
             entries: [tune, eval], margin: 0.01, paired: true}
          - {claim: 'Weighted convolution is more accurate', compare: '>', entries: [weighted, standard],
             effect: 0.10, paired: true}  # effect: the paper's gain in the metric's units
          - {claim: 'PIIP-H beats InternViT at the same FLOPs', not_tested: 'needs pretrained 6B branches'}
    across: {classification: {groups: [blocks_digits, blocks_shapes], reference: resnet_standard}}

A claim: ``compare`` '>' / '<' (entry a higher / lower than b; ``effect`` the paper's gain, > 0, optional) or '~'
(equal within ``margin``, by TOST); ``paired: true`` decides on per-seed differences (a seed fixes the
initialisation, the data order and any pretrained checkpoint across the group's entries), else Welch.
``not_tested: WHY`` states a claim a CPU cannot test, so the report says so instead of testing another one.
``seeds: {min: M, max: N}``: every entry runs seeds 0..M-1; the runner adds one seed at a time (M, M+1, ...) to
the entries of the claims still inconclusive, up to N (``decide.next_seeds``). A list fixes the seeds.
``across``: the groups' runs of every entry as scores relative to the ``reference`` entry of each group.

An override ``KEY: VALUE`` becomes the argument ``--KEY=VALUE`` of ``zoo fit -c RECIPE`` (a mapping or list
VALUE as one flow-style YAML string), so each row of the report is re-run by the command printed beside it.
``pretrained_from``: every job of the group waits for the named entry's run of the same seed (or its first
seed) to finish and gets its last checkpoint as ``arg`` (a seed the sequential rule adds brings the pretraining
job of that seed along, where the pretraining group's cap allows it: give both groups the same ``seeds``).
``entry`` is one entry for the whole group or a mapping naming each entry's own (two backbones, each pretrained).
An ``arg`` below a mapping override (``model.model_args``) is set inside that mapping (``with_override``).
Errors are one line with close matches
(``BenchmarkError``: exit code 2 on the command line).
"""
from __future__ import annotations

import difflib
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

TOP_KEYS = ('name', 'description', 'defaults', 'groups', 'across', 'recheck')
RECHECK_KEYS = ('seeds_from', 'groups')
GROUP_KEYS = ('task', 'dataset', 'recipe', 'overrides', 'metric', 'entries', 'seeds', 'batch_sizes', 'runtimes',
              'pretrained_from', 'claims', 'description', 'floor')
DEFAULT_KEYS = ('seeds', 'batch_sizes', 'runtimes', 'overrides')
CLAIM_KEYS = ('claim', 'title', 'paper', 'metric', 'compare', 'entries', 'margin', 'effect', 'paired', 'not_tested',
              'note')
SEED_KEYS = ('min', 'max')
ACROSS_KEYS = ('groups', 'reference')
PRETRAINED_KEYS = ('group', 'entry', 'arg')
RUNTIMES = ('eager', 'compile', 'onnxruntime', 'openvino')
BATCH_SIZES = (1, 16)
COMPARISONS = ('<', '>', '~', '>=')   # '>=': a matches or beats b (non-inferiority within margin)
BENCHMARKS = Path(__file__).resolve().parents[1] / 'benchmarks'   # a checkout's benchmarks/ folder


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used as written: one line saying what was expected."""


@dataclass(frozen=True)
class Claim:
    """A paper's claim on two entries of a group (``entries``: a, b), as the paper states it."""
    claim: str
    metric: str
    compare: str = ''
    entries: tuple[str, ...] = ()
    paper: str = ''
    margin: float | None = None        # '~': the largest difference that still counts as equal
    effect: float | None = None        # '>' / '<': the paper's gain in the metric's units
    paired: bool = False
    not_tested: str = ''               # why a CPU cannot test it (then nothing is compared)
    note: str = ''                     # what the CPU-scale test changes from the paper's conditions
    title: str = ''                    # a few words for the front page's table (default: the claim)


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
    max_seeds: int = 0                 # seeds: {min, max}: the cap of the sequential rule (0: the seeds are fixed)
    floor: float | None = None         # the group metric's value that learned nothing

    @property
    def min_seeds(self) -> int:
        return len(self.seeds)

    def seed_cap(self) -> int:
        return max(self.max_seeds, len(self.seeds))

    def pretrained_entry(self, entry: str) -> str | None:
        """The entry of ``pretrained_from['group']`` whose checkpoint ``entry`` fine-tunes (None: from scratch)."""
        pf = self.pretrained_from
        if pf is None:
            return None
        return pf['entry'][entry] if isinstance(pf['entry'], dict) else pf['entry']


@dataclass(frozen=True)
class Job:
    """One training run: a group's entry at one seed."""
    group: str
    entry: str
    seed: int
    recipe: str
    overrides: dict                    # group overrides, then the entry's
    key: str                           # what the database knows the job by: recipe, overrides and seed

    def argv(self, extra: dict | None = None) -> list[str]:
        """``zoo fit`` arguments; ``extra`` (``{arg: value}``, a pretrained checkpoint) set by ``with_override``."""
        overrides = self.overrides
        for k, v in (extra or {}).items():
            overrides = with_override(overrides, k, v)
        return ['fit', '-c', self.recipe, *override_args(overrides), f'--seed_everything={self.seed}']


@dataclass
class Benchmark:
    name: str
    path: Path
    groups: dict[str, Group]
    description: str = ''
    across: dict = field(default_factory=dict)
    recheck: dict = field(default_factory=dict)   # {'seeds_from': 100, 'groups': [...]}: the stability re-run

    def fresh_seeds(self) -> 'Benchmark':
        """The ``recheck`` groups with their seeds moved to ``seeds_from`` (100, 101, ...): the same claims decided
        again on seeds no verdict has seen (their jobs have other keys, so they never mix with the main runs)."""
        import dataclasses

        if not self.recheck:
            raise BenchmarkError(f'{self.path}: no recheck section (expected recheck: {{seeds_from: 100, groups: '
                                 '[GROUP, ...]}})')
        k = self.recheck['seeds_from']
        keep = {}
        for name in self.recheck['groups']:
            g = self.groups[name]
            keep[name] = dataclasses.replace(g, seeds=tuple(s + k for s in g.seeds))
        return dataclasses.replace(self, groups=keep, across={}, recheck={})

    def jobs(self) -> list[Job]:
        """The first seeds of every entry (the runner adds the sequential rule's further seeds)."""
        return [self.job(g.name, entry, seed) for g in self.groups.values() for entry in g.entries
                for seed in g.seeds]

    def job(self, group: str, entry: str, seed: int) -> Job:
        g = self.groups[group]
        merged = {**g.overrides, **g.entries[entry]}
        return Job(g.name, entry, seed, g.recipe, merged, job_key(g.recipe, merged, seed))

    def possible_jobs(self) -> list[Job]:
        """Every job the file allows: each entry at every seed up to its group's cap."""
        out = []
        for g in self.groups.values():
            seeds = list(g.seeds) + [max(g.seeds) + 1 + i for i in range(g.seed_cap() - len(g.seeds))]
            out += [self.job(g.name, entry, s) for entry in g.entries for s in seeds]
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


def with_override(overrides: dict, arg: str, value) -> dict:
    """``overrides`` with ``arg`` set to ``value``, as a copy. An ``arg`` below a key that holds a mapping
    (``model.model_args.backbone_kwargs.checkpoint`` under ``model.model_args``) is set inside that mapping, since
    the command line cannot override one key of a mapping argument; else it is one more ``--arg=value``."""
    import copy

    for k in sorted(overrides, key=len, reverse=True):
        if arg.startswith(k + '.') and isinstance(overrides[k], dict):
            out = copy.deepcopy(overrides)
            *path, last = arg[len(k) + 1:].split('.')
            node = out[k]
            for p in path:
                if not isinstance(node.get(p, {}), dict):
                    raise BenchmarkError(f'cannot set {arg}: {k} holds {p}={node[p]!r}, not a mapping')
                node = node.setdefault(p, {})
            node[last] = value
            return out
    return {**overrides, arg: value}


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
            if isinstance(pf['entry'], dict) and set(pf['entry']) != set(g.entries):
                raise BenchmarkError(f'{path}: group {g.name}: pretrained_from entry maps {sorted(pf["entry"])}; '
                                     f'expected one pretrained entry for each of {sorted(g.entries)}')
            for e in (pf['entry'].values() if isinstance(pf['entry'], dict) else [pf['entry']]):
                if e not in groups[pf['group']].entries:
                    raise BenchmarkError(f'{path}: group {g.name}: pretrained_from names entry {e!r}, not in group '
                                         f'{pf["group"]}{_close(str(e), list(groups[pf["group"]].entries))}')
    across = {}
    for label, a in _keys(f'{path}: across', raw.get('across') or {}, list(raw.get('across') or {})).items():
        a = _keys(f'{path}: across {label}', a, ACROSS_KEYS)
        names = a.get('groups') or []
        names = names if isinstance(names, list) else [names]
        if not names or not a.get('reference'):
            raise BenchmarkError(f'{path}: across {label}: expected {{groups: [GROUP, ...], reference: ENTRY}} '
                                 '(scores are relative to the reference entry of each group)')
        for n in names:
            if n not in groups:
                raise BenchmarkError(f'{path}: across {label}: unknown group {n!r}{_close(n, list(groups))}')
            if a['reference'] not in groups[n].entries:
                raise BenchmarkError(f'{path}: across {label}: reference {a["reference"]!r} is not an entry of group '
                                     f'{n}{_close(a["reference"], list(groups[n].entries))}')
        across[label] = {'groups': names, 'reference': str(a['reference'])}
    recheck = raw.get('recheck') or {}
    if recheck:
        recheck = _keys(f'{path}: recheck', recheck, RECHECK_KEYS)
        k, names = recheck.get('seeds_from'), recheck.get('groups') or []
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or not isinstance(names, list) or not names:
            raise BenchmarkError(f'{path}: recheck: expected {{seeds_from: N >= 1, groups: [GROUP, ...]}}; got {recheck!r}')
        for n in names:
            if n not in groups:
                raise BenchmarkError(f'{path}: recheck: unknown group {n!r}{_close(n, list(groups))}')
            if groups[n].pretrained_from and groups[n].pretrained_from['group'] not in names:
                raise BenchmarkError(f'{path}: recheck: group {n} fine-tunes from {groups[n].pretrained_from["group"]}'
                                     ', which must be rechecked too (its fresh seeds give the checkpoints)')
            if min(groups[n].seeds) + k <= max(groups[n].seed_cap() - 1, max(groups[n].seeds)):
                raise BenchmarkError(f'{path}: recheck: seeds_from {k} overlaps group {n}\'s own seeds (up to '
                                     f'{groups[n].seed_cap() - 1}); pick a larger one')
        recheck = {'seeds_from': k, 'groups': [str(n) for n in names]}
    return Benchmark(str(raw.get('name') or path.stem), path, groups, str(raw.get('description') or ''), across,
                     recheck)


def _int_list(where: str, v, allowed=None) -> tuple:
    v = [v] if isinstance(v, (int, str)) else v
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise BenchmarkError(f'{where} must be a non-empty list of integers; got {v!r}')
    for x in v:
        if allowed is not None and x not in allowed:
            raise BenchmarkError(f'{where}: {x} is not one of {", ".join(map(str, allowed))}')
    return tuple(v)


def _group(path: Path, name: str, g: dict, defaults: dict) -> Group:
    from zoo import tasks

    where = f'{path}: group {name}'
    for k in ('task', 'recipe', 'entries'):
        if not g.get(k):
            raise BenchmarkError(f'{where}: missing {k!r}')
    if g['task'] not in tasks.names():
        raise BenchmarkError(f'{where}: unknown task {g["task"]!r}{_close(g["task"], tasks.names())}')
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
    metric = g.get('metric') or tasks.get(g['task']).metric
    pf = g.get('pretrained_from')
    if pf is not None:
        pf = {'arg': 'model.checkpoint', **_keys(f'{where}: pretrained_from', pf, PRETRAINED_KEYS)}
        if not pf.get('group') or not pf.get('entry'):
            raise BenchmarkError(f'{where}: pretrained_from needs group and entry')
    claims = tuple(_claim(f'{where}: claim {i + 1}', c, entries, metric) for i, c in enumerate(g.get('claims') or []))
    seeds, max_seeds = _seeds(f'{where}: seeds', g.get('seeds', defaults.get('seeds', [0])))
    floor = g.get('floor')
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float))):
        raise BenchmarkError(f'{where}: floor must be a number (the metric at chance, or the noisy input\'s); '
                             f'got {floor!r}')
    return Group(name, g['task'], str(g.get('dataset') or ''), str(g['recipe']), overrides, entries, seeds,
                 _int_list(f'{where}: batch_sizes', g.get('batch_sizes', defaults.get('batch_sizes', [1])),
                           BATCH_SIZES),
                 tuple(runtimes), str(metric), pf, claims, str(g.get('description') or ''), max_seeds,
                 None if floor is None else float(floor))


def _seeds(where: str, v) -> tuple[tuple[int, ...], int]:
    """A list (those seeds, fixed) or ``{min: M, max: N}`` (seeds 0..M-1, the sequential rule up to N)."""
    if not isinstance(v, dict):
        return _int_list(where, v), 0
    v = _keys(where, v, SEED_KEYS)
    lo, hi = v.get('min'), v.get('max')
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or not 2 <= lo <= hi:
        raise BenchmarkError(f'{where}: expected {{min: M, max: N}} with 2 <= M <= N; got {v!r}')
    return tuple(range(lo)), hi


def _number(where: str, c: dict, key: str) -> float | None:
    v = c.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise BenchmarkError(f"{where}: {key} must be a number > 0 in the metric's units; got {v!r}")
    return float(v)


def _claim(where: str, c, entries: dict, metric: str) -> Claim:
    c = _keys(where, c, CLAIM_KEYS)
    if 'claim' not in c:
        raise BenchmarkError(f'{where}: missing {"claim"!r} (the claim as the paper states it)')
    common = dict(claim=str(c['claim']), metric=str(c.get('metric') or metric), paper=str(c.get('paper') or ''),
                  note=str(c.get('note') or ''), title=str(c.get('title') or ''))
    if c.get('not_tested'):
        extra = [k for k in ('compare', 'entries', 'margin', 'effect', 'paired') if k in c]
        if extra:
            raise BenchmarkError(f'{where}: a claim marked not_tested compares nothing; remove {", ".join(extra)}')
        return Claim(**common, not_tested=str(c['not_tested']))
    for k in ('compare', 'entries'):
        if k not in c:
            raise BenchmarkError(f'{where}: missing {k!r} (or not_tested: WHY for a claim a CPU cannot test)')
    if c['compare'] not in COMPARISONS:
        raise BenchmarkError(f'{where}: compare {c["compare"]!r} is not one of < > ~ >=')
    pair = c['entries']
    if not isinstance(pair, list) or len(pair) != 2:
        raise BenchmarkError(f'{where}: entries must name two entries of the group')
    for e in pair:
        if e not in entries:
            raise BenchmarkError(f'{where}: unknown entry {e!r}{_close(e, list(entries))}')
    margin, effect = _number(where, c, 'margin'), _number(where, c, 'effect')
    if c['compare'] in ('~', '>=') and margin is None:
        raise BenchmarkError(f"{where}: a {c['compare']!r} claim needs margin: the largest difference that still "
                             "counts as equal, in the metric's units")
    if c['compare'] in ('<', '>') and margin is not None:
        raise BenchmarkError(f"{where}: margin is for equality claims ('~'); a {c['compare']!r} claim takes effect "
                             "(the paper's gain)")
    if c['compare'] in ('~', '>=') and effect is not None:
        raise BenchmarkError(f"{where}: effect is for '>' and '<' claims; a {c['compare']!r} claim takes margin")
    paired = c.get('paired', False)
    if not isinstance(paired, bool):
        raise BenchmarkError(f'{where}: paired must be true or false; got {paired!r}')
    return Claim(**common, compare=c['compare'], entries=tuple(pair), margin=margin, effect=effect, paired=paired)


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
        argv = job.argv()        # without the pretrained checkpoint: it exists only once the dependency has run
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
