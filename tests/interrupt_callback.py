"""Callbacks the run tests load into `zoo fit` (in a subprocess or in-process through --trainer.callbacks)."""
import json
import os
import signal
from pathlib import Path

import torch
from lightning.pytorch import Callback


class StopAt(Callback):
    """Send ``sig`` (``SIGKILL`` or ``SIGINT``) to this process when ``global_step`` reaches ``step``."""

    def __init__(self, step: int, sig: str = 'SIGKILL'):
        self.step, self.sig = step, getattr(signal, sig)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            if self.sig == signal.SIGINT and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
                # Ctrl-C as in a terminal: under a suite started as a background job of a non-interactive shell
                # (``sh -c 'make test &'``) this process inherited SIGINT ignored, and Python installed no handler
                signal.signal(signal.SIGINT, signal.default_int_handler)
            os.kill(os.getpid(), self.sig)


class FailAt(Callback):
    """Raise what bad data raises (a ``ValueError``) when ``global_step`` reaches ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise ValueError(f'bad data at step {self.step} (raised by the test)')


class RecordLast(Callback):
    """After every training epoch, append (the epoch that ended, the epoch and step ``last.ckpt`` holds) to the
    JSON list in ``path``: read at the next epoch's start and at the end of fit, after Lightning has run every
    epoch-end hook (checkpoints are saved last)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def _record(self, trainer, ended: int) -> None:
        ckpt = Path(trainer.default_root_dir) / 'checkpoints' / 'last.ckpt'
        seen = torch.load(ckpt, map_location='cpu', weights_only=True) if ckpt.is_file() else {}
        rows = json.loads(self.path.read_text()) if self.path.is_file() else []
        rows.append([ended, seen.get('epoch'), seen.get('global_step')])
        self.path.write_text(json.dumps(rows))

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch > 0:
            self._record(trainer, trainer.current_epoch - 1)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._record(trainer, trainer.current_epoch - 1)


class FailIfExists(Callback):
    """Raise a ``ValueError`` at the first training step while the file ``path`` exists (a failure the test can
    take away, so the same job succeeds when retried)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.path.exists():
            raise ValueError(f'failing while {self.path.name} exists (raised by the test)')


class Sleep(Callback):
    """Sleep ``seconds`` after every training step (a run long enough to be killed mid-way)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        import time
        time.sleep(self.seconds)


class FailAtStart(Callback):
    """Raise what bad data found in the first batch raises (a ``ValueError``) as training starts: after the run
    folder, its config and its results row are written, before any training step."""

    def on_train_start(self, trainer, pl_module) -> None:
        raise ValueError('bad data in the first batch (raised by the test)')
