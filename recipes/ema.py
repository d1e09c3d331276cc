"""An exponential moving average of a system's weights (timm's ``ModelEmaV3``), for the systems that keep one."""
from __future__ import annotations

from torch import nn


class WeightEMA:
    """Mixin for a LightningModule with ``self.model``: ``init_ema`` keeps timm's EMA of it, updated after every
    training batch; ``eval_model`` (the EMA when there is one) is what validation, test and predict run."""

    def init_ema(self, decay: float | None, **kwargs) -> None:
        self.ema = None
        if decay is not None:
            from timm.utils import ModelEmaV3
            self.ema = ModelEmaV3(self.model, decay=decay, **kwargs)

    @property
    def eval_model(self) -> nn.Module:
        return self.ema.module if self.ema is not None else self.model

    def on_fit_start(self) -> None:
        super().on_fit_start()
        # timm's EMA keeps its copy in eval mode, which Lightning reports as "N modules in eval mode" on every
        # fit. The copy only runs in evaluation (which sets eval mode), so its mode while training is moot.
        if self.ema is not None:
            self.ema.train()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
