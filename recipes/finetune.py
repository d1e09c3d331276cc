"""Fine-tuning: start from a checkpoint, put a new head on, optionally freeze the backbone, and
give earlier layers smaller learning rates (layer-wise lr decay, BEiT/ConvNeXt style).

The checkpoint can be a zoo or timm state dict (``.pth``/``.safetensors``, official layouts are
remapped by the family) or a Lightning ``.ckpt`` written by ``zoo fit`` (the ``model.`` weights).
"""
from __future__ import annotations

from torch import nn

import zoo

from . import optim
from .classification import ImageClassifier


class FineTuner(ImageClassifier):
    """:class:`ImageClassifier` that starts from ``checkpoint`` with a new ``num_classes`` head.

    Args:
        checkpoint: the weights to start from (required).
        freeze_backbone: train the head only (backbone parameters frozen, its norms in eval mode).
        layer_decay: lr multiplier per layer of depth below the head (``lr * layer_decay ** depth_from_head``);
            ``None`` for one lr everywhere.
        convbn_mode: put every ConvBN of the model in this mode (``zoo.layers.convbn.set_mode``), e.g. ``tune``.
        Everything else as :class:`ImageClassifier`.
    """

    def __init__(self, name: str, checkpoint: str, model_args: dict | None = None, num_classes: int | None = None,
                 in_chans: int | None = None, freeze_backbone: bool = False, layer_decay: float | None = None,
                 convbn_mode: str | None = None, optimizer: str = 'adamw', lr: float = 1e-4,
                 weight_decay: float = 0.05, momentum: float = 0.9, warmup_epochs: float = 0.0, min_lr: float = 0.0,
                 label_smoothing: float = 0.1, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                 mixup_prob: float = 1.0, ema_decay: float | None = None):
        if layer_decay is not None and not 0 < layer_decay <= 1:
            raise ValueError(f'layer_decay must be in (0, 1], got {layer_decay}')
        super().__init__(name, model_args=model_args, num_classes=num_classes, in_chans=in_chans,
                         checkpoint=checkpoint, optimizer=optimizer, lr=lr, weight_decay=weight_decay,
                         momentum=momentum, warmup_epochs=warmup_epochs, min_lr=min_lr,
                         label_smoothing=label_smoothing, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha,
                         mixup_prob=mixup_prob, ema_decay=ema_decay)
        self.save_hyperparameters()
        if convbn_mode is not None:
            self.block_choices['convbn_mode'] = convbn_mode
        self.heads = [self.model.get_submodule(h) for h in zoo.classifier_prefix(self.model)]
        if freeze_backbone:
            head_params = {id(p) for h in self.heads for p in h.parameters()}
            for p in self.model.parameters():
                p.requires_grad_(id(p) in head_params)

    def build_model(self) -> nn.Module:
        hp = self.hparams
        model = zoo.create(hp.name, num_classes=hp.num_classes, in_chans=hp.in_chans, **(hp.model_args or {}))
        zoo.load_checkpoint(model, hp.checkpoint, new_head='always')
        heads = tuple(h + '.' for h in zoo.classifier_prefix(model))
        self.new_head_keys = [k for k in model.state_dict() if k.startswith(heads)]
        if hp.convbn_mode is not None:
            from zoo.layers.convbn import set_mode  # written with the ConvBN issue; imported only when asked for
            set_mode(model, hp.convbn_mode)
        return model

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone:  # a frozen backbone keeps its normalisation statistics too
            self.model.eval()
            for head in self.heads:
                head.train()

    def param_groups(self) -> list[dict]:
        hp = self.hparams
        return optim.param_groups(self.model, hp.weight_decay, lr=hp.lr, layer_decay=hp.layer_decay)
