"""Checkpoints a run can always be resumed from, exactly.

- ``last.ckpt``: the end of the most recent epoch, rewritten every epoch (Lightning's ``save_last`` on the
  monitored checkpoint only rewrites it when the best improves, so it could lag many epochs behind).
- ``best-epoch<E>-step<S>.ckpt``: the best on the system's monitor.
- ``interrupted.ckpt``: where a run stopped on Ctrl-C (SIGINT) or an exception, mid-epoch.
- :class:`EpochSeed` reseeds Python, NumPy and torch at every epoch start from (run seed, epoch), and the
  image loaders shuffle by (seed, epoch), so a run resumed from ``last.ckpt`` computes the same weights as
  an uninterrupted one. A SIGKILL loses at most the epoch in progress.

``last.ckpt`` is written at the end of every training epoch, after that epoch's validation if it has one,
whatever the validation schedule (``check_val_every_n_epoch``) and logging interval. Which checkpoint
``--ckpt_path last|best|interrupted`` means is decided in ``runs.py``; ``interrupted`` is the mid-epoch one,
which Lightning resumes by restarting that epoch's data from its start, so it is not exact.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

from zoo._factory import load_failure, safe_torch_load
from zoo.datasets._base import epoch_seed


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
        s = epoch_seed(self.seed, trainer.current_epoch) % 2**32  # NumPy takes 32-bit seeds
        random.seed(s)
        np.random.seed(s)
        torch.manual_seed(s)


def _interrupted_class():
    from lightning.pytorch.callbacks import OnExceptionCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    class Interrupted(OnExceptionCheckpoint):
        """``interrupted.ckpt`` when the run is stopped from outside (Ctrl-C, SIGTERM) after at least one step.
        A run that fails (bad data, a non-finite loss) writes none: it is not a state to resume from."""

        def on_exception(self, trainer, pl_module, exception) -> None:
            if trainer.global_step > 0 and isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
                super().on_exception(trainer, pl_module, exception)

    return Interrupted


def checkpoint_callbacks(ckpt_dir: str | None, monitor: str, mode: str) -> list[Callback]:
    """Best on ``monitor``, ``last.ckpt`` at every training epoch's end, ``interrupted.ckpt`` on Ctrl-C."""
    from lightning.pytorch.callbacks import ModelCheckpoint as Checkpoint

    callbacks = [
        Checkpoint(dirpath=ckpt_dir, filename='best-epoch{epoch}-step{step}', auto_insert_metric_name=False,
                   monitor=monitor, mode=mode, save_top_k=1),
        # No monitor and top-1 under a fixed name: overwritten at every training epoch's end (Lightning would
        # otherwise save it only after validation when validation is not every epoch).
        Checkpoint(dirpath=ckpt_dir, filename='last', monitor=None, save_top_k=1, enable_version_counter=False,
                   save_on_train_epoch_end=True),
        EpochSeed(),
    ]
    if ckpt_dir is not None:
        callbacks.append(_interrupted_class()(dirpath=ckpt_dir, filename='interrupted'))
    return callbacks


def read_checkpoint(path: str | Path) -> dict:
    """A Lightning checkpoint (tensors and plain types only); a file that is not one is a one-line error."""
    try:
        ckpt = safe_torch_load(path)
    except Exception as e:  # truncated files, pickles of arbitrary objects, non-checkpoints
        raise ValueError(f'--ckpt_path {path} is not a readable Lightning checkpoint ({load_failure(e)}); '
                         f'expected a .ckpt written by `zoo fit`') from None
    if not isinstance(ckpt, dict) or 'state_dict' not in ckpt:
        raise ValueError(f'--ckpt_path {path} is not a Lightning checkpoint (no state_dict); to start from plain '
                         f'weights use --model.checkpoint instead')
    return ckpt


def check_checkpoint_model(ckpt: dict, path: str | Path, model_name: str | None, class_path: str | None) -> None:
    """Refuse a checkpoint of another model: Lightning would otherwise rebuild the model from the
    checkpoint's hyper-parameters and silently run that one under this config's name."""
    hp = dict(ckpt.get('hyper_parameters') or {})
    theirs = hp.get('name')
    if model_name and theirs and theirs != model_name:
        raise ValueError(f'--ckpt_path {path} holds a {theirs} model but the config builds {model_name}; '
                         f'pass a checkpoint of {model_name} or --model.name {theirs}')
    their_class = hp.get('_class_path')
    if class_path and their_class and their_class.rsplit('.', 1)[-1] != class_path.rsplit('.', 1)[-1]:
        raise ValueError(f'--ckpt_path {path} was written by {their_class} but the config uses {class_path}')


def _shape(t) -> str:
    return '(' + ', '.join(map(str, t.shape)) + ')'


def check_weights_fit(ckpt: dict, path: str | Path, module: torch.nn.Module) -> None:
    """Refuse, in one line naming the checkpoint's run, a checkpoint whose weights do not fit ``module`` (the
    same config name run on data with another number of classes, another model argument): Lightning would
    stop with a size-mismatch traceback."""
    theirs, ours = ckpt.get('state_dict') or {}, module.state_dict()
    wrong = [k for k in ours if k in theirs and tuple(theirs[k].shape) != tuple(ours[k].shape)]
    missing = [k for k in ours if k not in theirs]
    built = {k.split('.', 1)[0] for k in ours}  # a part a system builds later (in setup) is not judged
    unexpected = [k for k in theirs if k not in ours and k.split('.', 1)[0] in built]
    if not (wrong or missing or unexpected):
        return
    run = Path(path).resolve().parent.parent
    if wrong:
        k = wrong[0]
        what = f'{k} is {_shape(theirs[k])} there and {_shape(ours[k])} here' + (
            f' (and {len(wrong) - 1} more)' if len(wrong) > 1 else '')
    else:
        what = (f'{len(missing)} weight(s) of this model are not in it ({missing[0]}, ...)' if missing else
                f'it holds {len(unexpected)} weight(s) this model lacks ({unexpected[0]}, ...)')
    raise ValueError(f'--ckpt_path {path} (from run {run}) does not fit the model this config builds: {what}; '
                     f'was that run made with other data or model arguments? Pass a checkpoint of this configuration')
