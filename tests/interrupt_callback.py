"""A callback the resume tests load into a `zoo fit` subprocess: it kills its own process at a training step."""
import os
import signal

from lightning.pytorch import Callback


class StopAt(Callback):
    """Send ``sig`` (``SIGKILL`` or ``SIGINT``) to this process when ``global_step`` reaches ``step``."""

    def __init__(self, step: int, sig: str = 'SIGKILL'):
        self.step, self.sig = step, getattr(signal, sig)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.sig)
