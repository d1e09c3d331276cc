"""Image classification as a Lightning system: the training logic around a model from ``zoo.create``.

Cross-entropy with label smoothing, optional mixup/cutmix (timm's ``Mixup``), top-1/top-5 accuracy
(torchmetrics), AdamW or SGD without weight decay on norms and biases, a per-step cosine schedule
with linear warm-up, and an optional exponential moving average of the weights (timm's
``ModelEmaV3``; validation and test then use the averaged weights). Gradient clipping is the
Trainer's (``trainer.gradient_clip_val``). The system never defines architecture.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

import zoo

from . import optim
from .ema import WeightEMA

# model_args keys that choose a block: recorded as ``block_choices`` by the results database.
_BLOCK_KEYS = ('token_mixer', 'canon', 'mixer')


def require_task(name: str, task: str, system: str) -> None:
    """A one-line error when the registered model ``name`` is not a ``task`` model (close choices listed)."""
    info = zoo.model_info(name)
    if info.task != task:
        raise ValueError(f'{name} is a {info.task} model; {system} trains task="{task}" models '
                         f'({", ".join(zoo.list_models(task=task))})')


def block_choices(model_args: dict | None) -> dict:
    """The block-selecting entries of ``model_args`` (``token_mixer``, ``*_layer``, ``*_mixer``, ...), as strings."""
    out = {}
    for k, v in (model_args or {}).items():
        if k in _BLOCK_KEYS or k.endswith(('_layer', '_mixer', '_mode')):
            out[k] = v if isinstance(v, str) else str(list(v) if isinstance(v, tuple) else v)
    return out


class ImageClassifier(WeightEMA, LightningModule):
    """Train, validate and test any registered classifier.

    Args:
        name: a registered model (``zoo.list_models()``) or ``timm/<name>``.
        model_args: extra arguments for ``zoo.create`` (``{'token_mixer': 'pooling'}``).
        num_classes, in_chans: set from the DataModule by ``zoo fit`` when left out.
        checkpoint: weights to start from (a state dict; see ``zoo.create``).
        optimizer: ``adamw`` or ``sgd`` (Nesterov momentum).
        lr, weight_decay, momentum: optimizer settings; norms and biases get no weight decay.
        warmup_epochs: linear warm-up length (fractions allowed); then cosine decay to ``min_lr``.
        label_smoothing: for the cross-entropy (also applied to mixed targets).
        mixup_alpha, cutmix_alpha, mixup_prob: timm ``Mixup``; off when both alphas are 0.
        ema_decay: keep an EMA of the weights with this decay (e.g. 0.999) and evaluate it.
    """

    monitor, monitor_mode = 'val/acc1', 'max'  # what ModelCheckpoint keeps as "best"

    def __init__(self, name: str, model_args: dict | None = None, num_classes: int | None = None,
                 in_chans: int | None = None, checkpoint: str | None = None,
                 optimizer: Literal['adamw', 'sgd'] = 'adamw', lr: float = 1e-3, weight_decay: float = 0.05,
                 momentum: float = 0.9, warmup_epochs: float = 0.0, min_lr: float = 0.0,
                 label_smoothing: float = 0.0, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                 mixup_prob: float = 1.0, ema_decay: float | None = None):
        super().__init__()
        self.save_hyperparameters()
        if optimizer not in ('adamw', 'sgd'):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        self.model_name = name
        self.block_choices = block_choices(model_args)
        self.model = self.build_model()
        self.num_classes = num_classes or getattr(self.model, 'num_classes', None)
        if not self.num_classes:
            raise ValueError(f'{name}: could not tell the number of classes; pass num_classes')
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from timm.data import Mixup
            self.mixup = Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                               label_smoothing=label_smoothing, num_classes=self.num_classes)
        self.init_ema(ema_decay)
        from torchmetrics.classification import MulticlassAccuracy
        top5 = min(5, self.num_classes)
        for split in ('val', 'test'):  # torchmetrics reduces these across processes itself
            setattr(self, f'{split}_acc1', MulticlassAccuracy(self.num_classes, top_k=1, average='micro'))
            setattr(self, f'{split}_acc5', MulticlassAccuracy(self.num_classes, top_k=top5, average='micro'))
        self._nonfinite = None  # device flag: a non-finite training loss was seen (checked without per-step syncs)

    def build_model(self) -> nn.Module:
        hp = self.hparams
        return zoo.create(hp.name, num_classes=hp.num_classes, in_chans=hp.in_chans, checkpoint=hp.checkpoint,
                          **(hp.model_args or {}))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # -- steps -------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.mixup is not None and len(x) % 2 == 0:  # timm's Mixup pairs samples: even batches only
            x, soft = self.mixup(x, y)
            loss = torch.sum(-soft * F.log_softmax(self.model(x), dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(self.model(x), y, label_smoothing=self.hparams.label_smoothing)
        # Log only on the steps the logger writes: Lightning's self.log costs ~2 ms of Python per call,
        # 5-10 % of a small model's step on CPU. The value stays on the device (no host sync here).
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0 or self.trainer.is_last_batch:
            self.log('train/loss', loss, on_step=True, on_epoch=False, prog_bar=True)
        bad = ~torch.isfinite(loss.detach())
        self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)  # the EMA's update
        # One host sync every log interval and before each epoch's validation/checkpoint, not per step.
        if self._nonfinite is not None and (self.global_step % self.trainer.log_every_n_steps == 0
                                            or self.trainer.is_last_batch):
            if bool(self._nonfinite):
                raise FloatingPointError(
                    f'{self.model_name}: the training loss became NaN or infinite by step {self.global_step}; '
                    f'stopped. Checkpoints saved before this point are intact (resume with --ckpt_path last '
                    f'and a lower --model.lr or --trainer.gradient_clip_val).')

    def _evaluate(self, batch, split: str):
        x, y = batch
        logits = self.eval_model(x)
        loss = F.cross_entropy(logits, y)
        acc1, acc5 = getattr(self, f'{split}_acc1'), getattr(self, f'{split}_acc5')
        acc1.update(logits, y)
        acc5.update(logits, y)
        self.log(f'{split}/loss', loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log(f'{split}/acc1', acc1, on_step=False, on_epoch=True, prog_bar=True)
        self.log(f'{split}/acc5', acc5, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        return self._evaluate(batch, 'val')

    def test_step(self, batch, batch_idx):
        return self._evaluate(batch, 'test')

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.eval_model(x).softmax(dim=-1)

    # -- optimisation ------------------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        """Trainable parameters; no weight decay on norms, biases and the model's ``no_weight_decay()``."""
        return optim.param_groups(self.model, self.hparams.weight_decay)

    def configure_optimizers(self):
        hp = self.hparams
        groups = self.param_groups()
        if not groups:
            raise ValueError(f'{self.model_name}: no trainable parameters')
        if hp.optimizer == 'sgd':
            opt = torch.optim.SGD(groups, lr=hp.lr, momentum=hp.momentum, nesterov=hp.momentum > 0)
        else:
            opt = torch.optim.AdamW(groups, lr=hp.lr)
        return {'optimizer': opt, 'lr_scheduler': optim.epoch_schedule(opt, self.trainer, hp.warmup_epochs, hp.lr,
                                                                        hp.min_lr)}
