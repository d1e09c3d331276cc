"""Fine-tuning: start from a checkpoint, put a new head on, optionally freeze the backbone, and
give earlier layers smaller learning rates (layer-wise lr decay, BEiT/ConvNeXt style).

The checkpoint can be a zoo or timm state dict (``.pth``/``.safetensors``, official layouts are
remapped by the family) or a Lightning ``.ckpt`` written by ``zoo fit`` (the ``model.`` weights).

With ``convbn_mode`` set, every fit ends with the ConvBN probe (You et al., ICLR 2024, "Efficient ConvBN Blocks for
Transfer Learning and Beyond": Tune mode keeps fewer activations for backward and steps faster than Eval), on the
trained network and one training batch of the run, logged as :data:`PROBE_METRICS` (so the results database has
them): ``train/saved_backward_mb``, ``train/saved_backward_vs_eval`` and ``train/step_time_vs_eval``
(``zoo.eval.profile.convbn_probe``). An Eval run's ratios are 1 by construction; a benchmark compares a Tune run's
ratios with the Eval run's of the same seed.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch.nn.functional as F
from torch import nn

import zoo

from . import optim
from .classification import ImageClassifier

# What the ConvBN probe logs at the end of a fit (``zoo.eval.profile.convbn_probe``'s keys under ``train/``).
PROBE_METRICS = ('train/saved_backward_mb', 'train/saved_backward_vs_eval', 'train/step_time_vs_eval')
PROBE_ROUNDS = 10   # interleaved rounds of the two steps: the probe stays under 3 s on resnet_tiny at batch 64


class FineTuner(ImageClassifier):
    """:class:`ImageClassifier` that starts from ``checkpoint`` with a new ``num_classes`` head.

    Args:
        checkpoint: the weights to start from (required).
        freeze_backbone: train the head only (backbone parameters frozen, its norms in eval mode).
        layer_decay: lr multiplier per layer of depth below the head (``lr * layer_decay ** depth_from_head``);
            ``None`` for one lr everywhere.
        convbn_mode: put every ConvBN of the model in this mode (``zoo.layers.convbn.set_mode``), e.g. ``tune``.
        convbn_probe: at the end of the fit, log :data:`PROBE_METRICS` (the trained network in its mode against the
            same weights in Eval mode, on the first batch of the last training epoch; on copies, so the run's
            weights are untouched). Default: on when ``convbn_mode`` is ``train``, ``eval`` or ``tune``.
        Everything else as :class:`ImageClassifier` (label smoothing 0.1 by default here).
    """

    def __init__(self, name: str, checkpoint: str, freeze_backbone: bool = False, layer_decay: Optional[float] = None,
                 convbn_mode: Optional[str] = None, convbn_probe: Optional[bool] = None, label_smoothing: float = 0.1,
                 **kwargs):
        if layer_decay is not None and not 0 < layer_decay <= 1:
            raise ValueError(f'layer_decay must be in (0, 1], got {layer_decay}')
        if convbn_probe and convbn_mode == 'deploy':
            raise ValueError('convbn_probe compares a mode with Eval mode; deploy has no BN left to switch '
                             '(use convbn_mode train, eval or tune, or convbn_probe false)')
        self._finetune = dict(checkpoint=checkpoint, convbn_mode=convbn_mode)  # build_model runs in super()
        super().__init__(name, checkpoint=checkpoint, label_smoothing=label_smoothing, **kwargs)
        # a measurement, not a training choice: kept out of the hyper-parameters, so the run's configuration key
        # is the same with the probe on or off (and as that of the runs recorded before it existed)
        self.hparams.pop('convbn_probe', None)
        self.convbn_probe = convbn_mode in ('train', 'eval', 'tune') if convbn_probe is None else convbn_probe
        self._probe_batch, self._probe_epoch = None, None
        if convbn_mode is not None:
            self.block_choices['convbn_mode'] = convbn_mode
        self.heads = [self.model.get_submodule(h) for h in zoo.classifier_prefix(self.model)]
        if freeze_backbone:
            head_params = {id(p) for h in self.heads for p in h.parameters()}
            for p in self.model.parameters():
                p.requires_grad_(id(p) in head_params)

    def build_model(self) -> nn.Module:
        model = zoo.create_with_optional(self.model_name, self.sizes, **self.model_args)
        zoo.load_checkpoint(model, self._finetune['checkpoint'], new_head='always')
        heads = tuple(h + '.' for h in zoo.classifier_prefix(model))
        self.new_head_keys = [k for k in model.state_dict() if k.startswith(heads)]
        if self._finetune['convbn_mode'] is not None:
            from zoo.layers.convbn import set_mode  # written with the ConvBN issue; imported only when asked for
            set_mode(model, self._finetune['convbn_mode'])
        return model

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone:  # a frozen backbone keeps its normalisation statistics too
            self.model.eval()
            for head in self.heads:
                head.train()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.convbn_probe and batch_idx == 0:  # a full batch (an epoch's last may be a remainder)
            self._probe_batch, self._probe_epoch = batch, self.current_epoch

    def on_train_end(self) -> None:
        """The ConvBN probe (``convbn_probe``), written straight to the run's loggers: Lightning's ``self.log``
        is closed in this hook, and the results logger records what it is given before the run's final values."""
        batch, self._probe_batch = self._probe_batch, None
        if batch is None or self.trainer.fast_dev_run:  # a smoke run's loggers are dummies
            return
        from lightning.pytorch.utilities import rank_zero_warn

        from zoo.eval import profile

        x, y = batch
        loss = functools.partial(F.cross_entropy, label_smoothing=self.hparams.label_smoothing)
        try:
            stats = profile.convbn_probe(self.model, x, y, loss_fn=loss, rounds=PROBE_ROUNDS, warmup=1)
        except Exception as e:  # a measurement must not fail a run that trained (its checkpoints are written)
            rank_zero_warn(f'convbn_probe: not measured ({type(e).__name__}: {e})')
            return
        metrics = {name: stats[name.removeprefix('train/')] for name in PROBE_METRICS}
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics({**metrics, 'epoch': self._probe_epoch}, step=self.global_step)

    def param_groups(self) -> list[dict]:
        return optim.param_groups(self.model, layer_decay=self.hparams.layer_decay)
