"""Run folders: where a run writes, what it records of itself, which checkpoint ``last``/``best`` mean, and
which file a recipe name (``-c detection/poolformer_shapes_det``) means.

Every ``zoo fit|validate|test|predict`` gets a new folder ``<run_root>/<config stem>/<UTC timestamp>/`` holding
the resolved ``config.yaml``, ``checkpoints/``, ``metrics.csv`` and ``run.json``, the run's manifest:

    {"command": "fit", "status": "finished", "started": "...", "ended": "...", "host": "...", "pid": 123,
     "resumed_from": "runs/<stem>/<earlier>/checkpoints/last.ckpt", "error": null, "results_run_id": 7}

``results_run_id`` is the run's row in the results database (absent with ``--db none``): ``zoo publish`` reads
the run's and its seed-repeats' numbers from it.

``status`` is ``running`` while the run lasts (and stays so when it is killed), then ``finished``,
``interrupted`` (Ctrl-C, SIGTERM) or ``failed`` (an exception: bad data, a non-finite loss). A failed run
never becomes what ``--ckpt_path last|best`` resolves to, nor ``<stem>/latest``.

``--ckpt_path last|best|interrupted`` (:func:`resolve_checkpoint`) takes that checkpoint of the newest fit of
the config that did not fail. When that newest fit has none (it was killed before its first epoch ended),
the answer is the checkpoint it had itself resumed from, if any; otherwise it is refused, naming the run
that has none and the run before it that has one: an older run is never taken silently.

A DDP job is one run: its processes share rank 0's folder, whether Lightning, ``torchrun`` or ``srun``
started them (``docs/cluster.md``).

A sweep trial is a fit of its own recipe under a run root of its own, ``<run_root>/sweeps/<study>/trial-<n>/``
(:func:`trial_run_root`), so its folder is ``.../trial-<n>/<config stem>/<timestamp>/``: a trial never moves the
recipe's ``latest`` nor becomes what ``--ckpt_path best`` of the recipe resolves to.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
import shutil
import socket
from datetime import datetime, timezone
from pathlib import Path

RUN_DIR_ENV = 'ZOO_RUN_DIR'  # rank 0's run folder, inherited by the processes DDP launches
MANIFEST = 'run.json'
KEYWORDS = ('last', 'best', 'interrupted')


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec='seconds')


def new_run_dir(root: str | Path, stem: str) -> Path:
    """``root/stem/<UTC timestamp>``, made here; a suffix keeps two runs in one second apart."""
    base = Path(root) / stem
    stamp = datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')
    for i in range(1000):
        path = base / (stamp if i == 0 else f'{stamp}-{i}')
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f'could not create a new run folder under {base}')


def trial_run_root(run_root: str | Path, study_name: str, trial_number: int) -> Path:
    """The run root of one sweep trial: ``<run_root>/sweeps/<study>/trial-<n>`` (see the module docstring)."""
    return Path(run_root) / 'sweeps' / study_name / f'trial-{trial_number}'


def remove_if_empty(made: tuple[Path, ...]) -> None:
    """A run rejected before it started leaves nothing behind: the folders it made (its run folder, and the
    config's folder and the run root if they are new), innermost first. Only empty folders are removed, so
    nothing written is ever lost."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone): keep it and what holds it
            break
    if made and not made[0].exists() and os.environ.get(RUN_DIR_ENV) == str(made[0]):
        os.environ.pop(RUN_DIR_ENV)


# ------------------------------------------------------------------------------------------------ recipe files


CONFIGS = Path(__file__).parent / 'configs'  # the shipped recipes, installed with the package


def shipped_recipes() -> list[str]:
    """The shipped recipes by name: ``<family>/<stem>`` (``detection/poolformer_shapes_det``)."""
    return sorted(str(p.relative_to(CONFIGS).with_suffix('')) for p in CONFIGS.glob('**/*.yaml'))


def find_recipe(value: str) -> Path:
    """A ``-c`` value as a file: a path that exists, else a shipped recipe by its name, from any folder --
    ``detection/poolformer_shapes_det``, ``poolformer_shapes_det`` (when one family has it) or the README's
    ``recipes/configs/detection/poolformer_shapes_det.yaml``. An unknown name lists close matches."""
    path = Path(value)
    if path.is_file():
        return path
    name = value.replace('\\', '/').removesuffix('.yaml').removesuffix('.yml')
    name = name.split('recipes/configs/', 1)[-1]
    names = shipped_recipes()
    if name in names:
        return CONFIGS / f'{name}.yaml'
    by_stem = [n for n in names if n.rsplit('/', 1)[-1] == name]
    if len(by_stem) == 1:
        return CONFIGS / f'{by_stem[0]}.yaml'
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6) or difflib.get_close_matches(
        name, [n.rsplit('/', 1)[-1] for n in names], n=3, cutoff=0.6)
    raise FileNotFoundError(f'config file not found: {value}, and no shipped recipe is named so'
                            + (f"; did you mean {' or '.join(close)}?" if close else '')
                            + ' (`zoo list --recipes` lists them; or pass a YAML file)')


def resolve_configs(argv: list[str]) -> list[str]:
    """``argv`` with every ``-c``/``--config`` value that names a shipped recipe replaced by its file."""
    out, i = list(argv), 0
    while i < len(out):
        arg = out[i]
        if arg in ('-c', '--config') and i + 1 < len(out):
            if not out[i + 1].lstrip().startswith(('{', '[')):  # inline YAML is LightningCLI's own
                out[i + 1] = str(find_recipe(out[i + 1]))
            i += 2
            continue
        if arg.startswith('--config='):
            out[i] = '--config=' + str(find_recipe(arg.split('=', 1)[1]))
        i += 1
    return out


# ------------------------------------------------------------------------------------------------ the manifest


def read_manifest(run: Path) -> dict:
    """``run.json`` of a run folder; {} for a folder without one (written before manifests existed)."""
    try:
        return json.loads((Path(run) / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def write_manifest(run: Path, **fields) -> dict:
    """Update ``run.json`` with ``fields`` (written whole to a temporary file, then renamed: never half)."""
    manifest = {**read_manifest(run), **fields}
    tmp = Path(run) / f'.{MANIFEST}.tmp'
    tmp.write_text(json.dumps(manifest, indent=1, default=str) + '\n')
    tmp.replace(Path(run) / MANIFEST)
    return manifest


def start_manifest(run: Path, command: str, resumed_from: str | None) -> None:
    write_manifest(run, command=command, status='running', started=_now(), host=socket.gethostname(),
                   pid=os.getpid(), resumed_from=resumed_from, error=None)


def finish_manifest(run: Path, exception: BaseException | None) -> str:
    """Record how the run ended: ``finished``, ``interrupted`` (Ctrl-C, which Lightning turns into
    ``SystemExit``, or SIGTERM) or ``failed`` (any other exception). Returns the status."""
    if exception is None:
        status, error = 'finished', None
    elif isinstance(exception, (KeyboardInterrupt, SystemExit)):
        status, error = 'interrupted', type(exception).__name__
    else:
        status, error = 'failed', f'{type(exception).__name__}: {exception}'[:2000]
    write_manifest(run, status=status, ended=_now(), error=error)
    return status


def wrote_nothing(run: Path) -> bool:
    """The run folder holds nothing but its manifest (and empty folders): the run stopped before it wrote."""
    return all(p.name == MANIFEST or p.is_dir() for p in Path(run).rglob('*'))


def drop_manifest(run: Path) -> None:
    (Path(run) / MANIFEST).unlink(missing_ok=True)
    for folder in sorted((p for p in Path(run).rglob('*') if p.is_dir()), reverse=True):
        folder.rmdir()  # empty (wrote_nothing): the logger's and checkpoints' folders


def discard_run(run: Path) -> None:
    """Empty the folder of a run rejected as bad input before its first training step: all it wrote is about
    itself (manifest, resolved config, the loggers' files) and it has no checkpoint, so nothing a user saved is
    lost. The empty folder goes with the folders the run made (:func:`remove_if_empty`)."""
    if has_checkpoints(run):
        raise RuntimeError(f'{run} holds checkpoints; a run that saved one is never discarded')
    for child in Path(run).iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def point_latest(run_dir: Path) -> None:
    """Point ``<run_root>/<stem>/latest`` at ``run_dir``: called for fits that wrote checkpoints and did not
    fail, so ``latest/checkpoints/last.ckpt`` (which configs name) survives evaluation runs and failed fits."""
    link = run_dir.parent / 'latest'
    try:
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(run_dir.name, target_is_directory=True)
    except OSError:  # file systems without symlinks: the timestamped folders are enough
        pass


# ------------------------------------------------------------------------------------------------ checkpoints


def has_checkpoints(run: Path) -> bool:
    return any((Path(run) / 'checkpoints').glob('*.ckpt'))


def run_checkpoints(run: Path, which: str) -> list[Path]:
    """The checkpoints of one run folder that ``--ckpt_path which`` may take, preferred first."""
    ckpts = Path(run) / 'checkpoints'
    if which == 'best':
        found = sorted(ckpts.glob('best-*.ckpt'), key=lambda p: p.stat().st_mtime)[-1:]
    elif which == 'last':
        found = [ckpts / 'last.ckpt', ckpts / 'interrupted.ckpt']
    else:
        found = [ckpts / 'interrupted.ckpt']
    return [c for c in found if c.is_file()]


def fit_runs(root: str | Path, stem: str) -> list[Path]:
    """The fit runs of ``stem``, newest first: folders whose manifest says ``fit`` (or, written before
    manifests existed, that hold checkpoints)."""
    base = Path(root) / stem
    if not base.is_dir():
        return []
    runs = sorted((p for p in base.iterdir() if p.is_dir() and not p.is_symlink()), reverse=True)
    return [r for r in runs if read_manifest(r).get('command', 'fit' if has_checkpoints(r) else None) == 'fit']


def _show(path: Path) -> str:
    p = os.path.abspath(path)
    return os.path.relpath(p) if p.startswith(os.getcwd() + os.sep) else str(path)


def resolve_checkpoint(root: str | Path, stem: str, which: str) -> Path:
    """The ``which`` checkpoint (``last``, ``best``, ``interrupted``) of the newest fit of ``stem`` that did not
    fail; see the module docstring for a newest fit without one. Errors are one line naming the runs."""
    base = Path(root) / stem
    runs = fit_runs(root, stem)
    usable = [r for r in runs if read_manifest(r).get('status') != 'failed']
    failed = len(runs) - len(usable)
    if not usable:
        raise FileNotFoundError(
            f'--ckpt_path {which}: no run of {stem!r} under {_show(base)} to take it from'
            + (f' ({failed} failed run(s) are never resumed or evaluated)' if failed else '')
            + ' (runs are written by `zoo fit -c <config>`; or pass a checkpoint file)')
    newest = usable[0]
    found = run_checkpoints(newest, which)
    origin = read_manifest(newest).get('resumed_from')
    if which == 'last' and origin and Path(origin).is_file() and not (newest / 'checkpoints' / 'last.ckpt').is_file():
        return Path(origin)  # stopped before its first epoch ended: where it started from (exact, unlike mid-epoch)
    if found:
        return found[0]
    older = next(((r, c[0]) for r in usable[1:] if (c := run_checkpoints(r, which))), None)
    reason = 'it never validated' if which == 'best' and has_checkpoints(newest) else \
        'it stopped before its first epoch ended'
    raise FileNotFoundError(
        f'--ckpt_path {which}: the newest run of {stem!r}, {_show(newest)}, has no {which} checkpoint ({reason}); '
        + (f'the run before it, {_show(older[0])}, has one: pass --ckpt_path {_show(older[1])} to use it'
           if older else 'no earlier run has one either'))


# ------------------------------------------------------------------------------------------------ DDP launches


def external_launch():
    """Lightning's cluster environment when ``torchrun`` or ``srun`` started this process as one of several,
    else None. Such processes start together, so none can inherit rank 0's run folder through the
    environment (as the processes Lightning launches itself do); ``shared_run_dir`` sends it to them.
    TorchElastic is checked before SLURM, as Lightning does (torchrun may run inside a SLURM job)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    for env_type in (TorchElasticEnvironment, SLURMEnvironment):
        if env_type.detect():
            env = env_type()
            return env if env.world_size() > 1 else None
    return None


def shared_run_dir(env, make, backend: str) -> Path:
    """Global rank 0 calls ``make()`` for a new run folder; every rank returns its path.

    The path travels by ``broadcast_object_list`` over the process group, which is set up here from
    Lightning's cluster environment (the address, port and ranks torchrun or SLURM give) with the backend
    Lightning would choose, and which Lightning's DDP strategy then reuses (it skips its own set-up when one
    exists). A folder name derived from the launch instead (``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``) would
    not be new for every run: torchrun's default run id is ``none``, a requeued SLURM job keeps its id, and
    ``--seeds`` runs several fits in one launch."""
    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    if not dist.is_initialized():  # as Lightning's DDP strategy would set it up (it skips this when it exists)
        os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'] = env.main_address, str(env.main_port)
        dist.init_process_group(backend, rank=env.global_rank(), world_size=env.world_size(),
                                timeout=default_pg_timeout)
    path = [str(make()) if env.global_rank() == 0 else None]
    # A Python object goes over gloo (CPU memory); NCCL would need each rank's CUDA device chosen first.
    dist.broadcast_object_list(path, src=0, group=None if dist.get_backend() == 'gloo' else _gloo_group())
    return Path(path[0])


def check_world_size(cfg, env) -> None:
    """Refuse a launch whose process count the trainer does not expect. With ``devices: 1`` (every recipe's
    default) Lightning would not use DDP at all: each process would train alone, all as rank 0."""
    trainer = cfg.get('trainer') or {}
    devices, nodes = trainer.get('devices', 'auto'), trainer.get('num_nodes', 1)
    if str(devices).isdigit() and str(nodes).isdigit() and int(devices) * int(nodes) != env.world_size():
        launcher = 'torchrun' if type(env).__name__ == 'TorchElasticEnvironment' else 'SLURM'
        raise ValueError(f'{launcher} started {env.world_size()} processes but the trainer expects '
                         f'devices x num_nodes = {devices} x {nodes}; pass --trainer.devices <processes per node> '
                         f'and --trainer.num_nodes <nodes>')


@functools.cache
def _gloo_group():
    """One gloo group beside an NCCL default group, made once per process (every rank must make it)."""
    import torch.distributed as dist

    return dist.new_group(backend='gloo')


def pg_backend(cfg) -> str:
    """The process-group backend Lightning's DDP strategy would pick: the config's
    ``--trainer.strategy.process_group_backend``, else NCCL on CUDA devices and gloo otherwise."""
    import torch

    trainer = cfg.get('trainer') or {}
    strategy = trainer.get('strategy')
    init_args = strategy.get('init_args') if hasattr(strategy, 'get') else None
    backend = (init_args.as_dict() if hasattr(init_args, 'as_dict') else dict(init_args or {})).get(
        'process_group_backend')
    if backend:
        return backend
    accelerator = str(trainer.get('accelerator') or 'auto')
    return 'nccl' if accelerator in ('auto', 'gpu', 'cuda') and torch.cuda.is_available() else 'gloo'
