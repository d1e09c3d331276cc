"""Optimizer parameter groups and the learning-rate schedule, shared by every recipe and experiment.

- ``param_groups``: timm's ``param_groups_weight_decay`` (no decay on 1-d parameters and biases, i.e. norms,
  biases, scales) plus the model's own ``no_weight_decay()`` names (position embeddings, class tokens, ...;
  ``zoo.ClassifierBase`` declares it, timm models have it too). With ``layer_decay``, timm's
  ``param_groups_layer_decay`` (BEiT-style layer-wise lr decay) on the model's ``group_matcher``.
- ``warmup_cosine``: linear warm-up, then cosine decay to a floor, as an lr multiplier per optimizer step;
  :class:`WarmupCosine` is it as a scheduler a config injects (``lr_scheduler: {class_path:
  zoo.recipes.optim.WarmupCosine, init_args: {warmup_epochs: 1, min_lr: 2.0e-5}}``), sized from the run.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Parameter names (or glob patterns) the model keeps out of weight decay, beyond timm's 1-d rule."""
    fn = getattr(model, 'no_weight_decay', None)  # timm models and nn.Modules outside zoo may lack it
    return set(fn()) if callable(fn) else set()


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer id as timm's ``param_groups_layer_decay`` assigns them: from the model's
    ``group_matcher`` (zoo's and timm's models: stem 0, blocks in order, head and final norm last), else timm's
    fallback grouping."""
    from timm.models import group_parameters
    from timm.optim import auto_group_layers  # the public re-export, not its private home (timm.optim._param_groups)

    if hasattr(model, 'group_matcher'):
        return group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    return auto_group_layers(model)


def param_groups(model: nn.Module, weight_decay: float | None = None, lr: float | None = None,
                 layer_decay: float | None = None) -> list[dict]:
    """Trainable parameters of ``model`` in optimizer groups, by timm's ``param_groups_weight_decay`` (no weight
    decay on 1-d parameters, biases and ``model.no_weight_decay()``) or, with ``layer_decay``, timm's
    ``param_groups_layer_decay`` (one group per layer of depth and decay, ``lr_scale = layer_decay ** (depth below
    the head)``, layers from the model's ``group_matcher``; each group also names its ``layer``).

    ``weight_decay=None`` leaves the decayed groups without the key, so the optimizer's own setting applies (an
    injected optimizer); ``lr`` sets ``lr * lr_scale`` per group, else :func:`apply_lr_scale` does once the
    optimizer exists."""
    from timm.optim import param_groups_layer_decay, param_groups_weight_decay  # lazily: timm's import is heavy

    wd = 1.0 if weight_decay is None else weight_decay  # a stand-in that marks the decayed groups, removed below
    nwd = no_weight_decay_names(model)
    if layer_decay is None:
        groups = param_groups_weight_decay(model, wd, no_weight_decay_list=nwd)
    else:
        groups = param_groups_layer_decay(model, wd, no_weight_decay_list=nwd, layer_decay=layer_decay)
        ids = layer_ids(model)
        last = max(ids.values(), default=0)
        names = {id(p): n for n, p in model.named_parameters()}
        for g in groups:
            g['layer'] = ids.get(names[id(g['params'][0])], last)
            if lr is not None:
                g['lr'] = lr * g['lr_scale']
    if weight_decay is None:  # the optimizer's own weight decay on the decayed groups
        for g in groups:
            if g['weight_decay'] != 0:
                del g['weight_decay']
    # decayed group first, as the recipes had it (gradient clipping sums in this order); layers in depth order
    return sorted((g for g in groups if g['params']), key=lambda g: (g.get('layer', 0), g.get('weight_decay') == 0))


def apply_lr_scale(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Scale each group's learning rate by its ``lr_scale`` (layer-wise decay) once the optimizer has set it."""
    for g in optimizer.param_groups:
        g['lr'] = g['lr'] * g.get('lr_scale', 1.0)
    return optimizer


def warmup_cosine(step: int, total: int, warmup: int = 0, floor: float = 0.0) -> float:
    """lr multiplier at optimizer step ``step``: linear warm-up from 1/(warmup+1) to 1 over ``warmup`` steps,
    then cosine from 1 down to ``floor`` at ``total`` (held there after)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def scheduler(optimizer: torch.optim.Optimizer, total: int, warmup: int = 0, floor: float = 0.0):
    """``warmup_cosine`` as a per-step ``LambdaLR`` (Lightning: ``{'scheduler': ..., 'interval': 'step'}``)."""
    fn: Callable[[int], float] = lambda step: warmup_cosine(step, total, warmup, floor)  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


class WarmupCosine(torch.optim.lr_scheduler.LambdaLR):
    """:func:`warmup_cosine` per optimizer step, as the scheduler a config injects into a system.

    Args:
        warmup_epochs: linear warm-up length in epochs (fractions allowed), converted with the run's steps.
        warmup_steps: the warm-up in optimizer steps instead (0 or None: ``warmup_epochs``).
        min_lr: the floor as an absolute learning rate (divided by the optimizer's lr), or
        min_lr_ratio: the floor as a fraction of the lr.

    The run's length is not known when the scheduler is built: the system calls :meth:`bind` with the
    trainer before the first step (total = ``max_steps`` when set, else Lightning's estimate).
    """

    interval = 'step'

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_epochs: float = 0.0, warmup_steps: int | None = None,
                 min_lr: float = 0.0, min_lr_ratio: float | None = None):
        if warmup_epochs < 0 or (warmup_steps is not None and warmup_steps < 0) or min_lr < 0:
            raise ValueError(f'WarmupCosine: warm-up and min_lr must be >= 0, got warmup_epochs={warmup_epochs}, '
                             f'warmup_steps={warmup_steps}, min_lr={min_lr}')
        self.warmup_epochs, self.warmup_steps, self.min_lr, self.min_lr_ratio = (warmup_epochs, warmup_steps, min_lr,
                                                                                 min_lr_ratio)
        lr = optimizer.defaults.get('lr') or 0.0
        self.floor = min_lr_ratio if min_lr_ratio is not None else (min_lr / lr if lr > 0 else 0.0)
        self.total, self.warmup = 1, 0
        super().__init__(optimizer, lambda step: warmup_cosine(step, self.total, self.warmup, self.floor))

    def bind(self, trainer) -> 'WarmupCosine':
        """Size the schedule from the run and set the learning rates of the current step."""
        from zoo.layers._torch_compat import set_last_lr

        self.total = trainer.max_steps if trainer.max_steps > 0 else max(1, int(trainer.estimated_stepping_batches))
        if self.warmup_steps:  # 0 as well as None means "by epochs": the CLI's parser fills the unset value with 0
            self.warmup = min(self.warmup_steps, self.total)
        else:
            epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
            self.warmup = min(self.total - 1, round(self.warmup_epochs * self.total / epochs))
        factor = warmup_cosine(self.last_epoch, self.total, self.warmup, self.floor)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group['lr'] = base * factor
        set_last_lr(self, [g['lr'] for g in self.optimizer.param_groups])
        return self


def epoch_schedule(optimizer: torch.optim.Optimizer, trainer, warmup_epochs: float, lr: float, min_lr: float) -> dict:
    """The per-step warm-up/cosine of a recipe whose warm-up is given in epochs (fractions allowed) and whose
    floor is an absolute ``min_lr``, sized from the Lightning ``trainer``; Lightning's scheduler config."""
    total = max(1, int(trainer.estimated_stepping_batches))
    epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else 1
    warmup = min(total - 1, round(warmup_epochs * total / epochs))
    floor = min_lr / lr if lr > 0 else 0.0
    return {'scheduler': scheduler(optimizer, total, warmup, floor), 'interval': 'step'}


class WarmupPoly(torch.optim.lr_scheduler.LambdaLR):
    """mmseg's ``poly`` schedule per optimizer step, with mmcv's optional linear warm-up: the lr falls from the
    base to ``min_lr`` as ``(1 - step / total) ** power``; during the first ``warmup_steps`` it is that value times
    ``1 - (1 - step / warmup_steps) * (1 - warmup_ratio)``. The official ADE20K schedules: PoolFormer's Semantic FPN
    power 0.9, no warm-up; PIIP's UperNet power 1.0, 1,500 warm-up steps from ratio 1e-6. The run's length comes
    from the trainer (``bind``: ``max_steps`` when set, else Lightning's estimate), as :class:`WarmupCosine`."""

    interval = 'step'

    def __init__(self, optimizer: torch.optim.Optimizer, power: float = 0.9, min_lr: float = 0.0,
                 warmup_steps: int = 0, warmup_ratio: float = 1e-6):
        if power <= 0 or min_lr < 0 or warmup_steps < 0 or not 0 <= warmup_ratio <= 1:
            raise ValueError(f'WarmupPoly: power > 0, min_lr >= 0, warmup_steps >= 0 and 0 <= warmup_ratio <= 1, got '
                             f'{power}, {min_lr}, {warmup_steps}, {warmup_ratio}')
        lr = optimizer.defaults.get('lr') or 0.0
        self.power, self.warmup_steps, self.warmup_ratio = power, warmup_steps, warmup_ratio
        self.floor, self.total = (min_lr / lr if lr > 0 else 0.0), 1
        super().__init__(optimizer, self.factor)

    def factor(self, step: int) -> float:
        f = self.floor + (1 - self.floor) * (1 - min(step, self.total) / self.total) ** self.power
        if step < self.warmup_steps:
            f *= 1 - (1 - step / self.warmup_steps) * (1 - self.warmup_ratio)
        return f

    def bind(self, trainer) -> 'WarmupPoly':
        """Size the schedule from the run and set the learning rates of the current step."""
        from zoo.layers._torch_compat import set_last_lr

        self.total = trainer.max_steps if trainer.max_steps > 0 else max(1, int(trainer.estimated_stepping_batches))
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group['lr'] = base * self.factor(self.last_epoch)
        set_last_lr(self, [g['lr'] for g in self.optimizer.param_groups])
        return self
