"""Checkpoints a run can always be resumed from, exactly.

- ``last.ckpt``: the end of the most recent epoch, rewritten every epoch (Lightning's ``save_last`` on the
  monitored checkpoint only rewrites it when the best improves, so it could lag many epochs behind).
- ``best-epoch<E>-step<S>.ckpt``: the best on the system's monitor.
- ``interrupted.ckpt``: where a run stopped on Ctrl-C (SIGINT) or an exception, mid-epoch.
- :class:`EpochSeed` reseeds Python, NumPy and torch at every epoch start from (run seed, epoch), and the
  image loaders shuffle by (seed, epoch), so a run resumed from ``last.ckpt`` computes the same weights as
  an uninterrupted one. A SIGKILL loses at most the epoch in progress.

``--ckpt_path last`` takes ``last.ckpt`` of the newest run that has one (or, for a run stopped during its
first epoch, its ``interrupted.ckpt``); ``--ckpt_path interrupted`` takes the mid-epoch one, which Lightning
resumes by restarting that epoch's data from its start, so it is not exact.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

from zoo._factory import safe_torch_load, load_failure

KEYWORDS = ('last', 'best', 'interrupted')


def _checkpoint_class():
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Checkpoint(ModelCheckpoint):
        """ModelCheckpoint with its ``state_key`` computed once: Lightning names every hook call by it,
        and ModelCheckpoint rebuilds it from its settings each time (about 0.3 ms per training step)."""

        @property
        def state_key(self) -> str:
            if '_zoo_state_key' not in self.__dict__:
                self.__dict__['_zoo_state_key'] = super().state_key
            return self.__dict__['_zoo_state_key']

    return Checkpoint


class EpochSeed(Callback):
    """Reseed Python, NumPy and torch at each training epoch's start from ``(seed, epoch)``.

    Dropout, drop-path and augmentation then draw the same numbers in epoch ``e`` whether the run went
    through ``e`` without a break or was resumed at its start. The seed is the run's ``seed_everything``;
    without one, nothing is reseeded (such a run is not reproducible anyway).
    """

    def __init__(self):
        self.seed: int | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        seed = os.environ.get('PL_GLOBAL_SEED')
        self.seed = int(seed) if seed is not None else None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.seed is None:
            return
        s = (self.seed * 1_000_003 + trainer.current_epoch) % 2**32
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


def _interrupted_class():
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    class Interrupted(OnExceptionCheckpoint):
        """``interrupted.ckpt`` on Ctrl-C or an exception, unless no step was taken (nothing to keep)."""

        def on_exception(self, trainer, pl_module, exception) -> None:
            if trainer.global_step > 0:
                super().on_exception(trainer, pl_module, exception)

    return Interrupted


def checkpoint_callbacks(ckpt_dir: str | None, monitor: str, mode: str) -> list[Callback]:
    """Best on ``monitor``, ``last.ckpt`` at every epoch end, ``interrupted.ckpt`` on an exception."""
    Checkpoint = _checkpoint_class()
    callbacks = [
        Checkpoint(dirpath=ckpt_dir, filename='best-epoch{epoch}-step{step}', auto_insert_metric_name=False,
                   monitor=monitor, mode=mode, save_top_k=1),
        # No monitor and top-1 under a fixed name: overwritten at every epoch end.
        Checkpoint(dirpath=ckpt_dir, filename='last', monitor=None, save_top_k=1, enable_version_counter=False),
        EpochSeed(),
    ]
    if ckpt_dir is not None:
        callbacks.append(_interrupted_class()(dirpath=ckpt_dir, filename='interrupted'))
    return callbacks


def run_checkpoints(run: Path, which: str) -> list[Path]:
    """The checkpoints of one run folder that ``--ckpt_path which`` may take, preferred first."""
    ckpts = run / 'checkpoints'
    if which == 'best':
        found = sorted(ckpts.glob('best-*.ckpt'))[-1:]
    elif which == 'last':
        found = [ckpts / 'last.ckpt', ckpts / 'interrupted.ckpt']
    else:
        found = [ckpts / 'interrupted.ckpt']
    return [c for c in found if c.is_file()]


def find_checkpoint(root: str | Path, stem: str, which: str) -> Path:
    """The ``which`` checkpoint of the newest run of ``stem`` that has one."""
    base = Path(root) / stem
    runs = sorted((p for p in base.glob('*') if p.is_dir() and not p.is_symlink()), reverse=True) if base.is_dir() else []
    for run in runs:
        found = run_checkpoints(run, which)
        if found:
            return found[0]
    raise FileNotFoundError(f"--ckpt_path {which}: no run of {stem!r} with a {which} checkpoint under {base} "
                            f"(runs are written by `zoo fit -c <config>`; pass a checkpoint file instead)")


def has_checkpoints(run: Path) -> bool:
    return any((run / 'checkpoints').glob('*.ckpt'))


def read_hparams(path: str | Path) -> dict:
    """The ``hyper_parameters`` of a Lightning checkpoint; a file that is not one is a one-line error."""
    try:
        ckpt = safe_torch_load(path)
    except Exception as e:  # truncated files, pickles of arbitrary objects, non-checkpoints
        raise ValueError(f'--ckpt_path {path} is not a readable Lightning checkpoint ({load_failure(e)}); '
                         f'expected a .ckpt written by `zoo fit`') from None
    if not isinstance(ckpt, dict) or 'state_dict' not in ckpt:
        raise ValueError(f'--ckpt_path {path} is not a Lightning checkpoint (no state_dict); to start from plain '
                         f'weights use --model.checkpoint instead')
    return dict(ckpt.get('hyper_parameters') or {})


def check_checkpoint_fits(path: str | Path, model_name: str | None, class_path: str | None) -> None:
    """Refuse a checkpoint of another model: Lightning would otherwise rebuild the model from the
    checkpoint's hyper-parameters and silently run that one under this config's name."""
    hp = read_hparams(path)
    theirs = hp.get('name')
    if model_name and theirs and theirs != model_name:
        raise ValueError(f'--ckpt_path {path} holds a {theirs} model but the config builds {model_name}; '
                         f'pass a checkpoint of {model_name} or --model.name {theirs}')
    their_class = hp.get('_class_path')
    if class_path and their_class and their_class.rsplit('.', 1)[-1] != class_path.rsplit('.', 1)[-1]:
        raise ValueError(f'--ckpt_path {path} was written by {their_class} but the config uses {class_path}')
