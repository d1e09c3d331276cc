"""Fine-tuning: start from a checkpoint, put a new head on, optionally freeze the backbone, and
give earlier layers smaller learning rates (layer-wise lr decay, BEiT/ConvNeXt style).

The checkpoint can be a zoo or timm state dict (``.pth``/``.safetensors``, official layouts are
remapped by the family) or a Lightning ``.ckpt`` written by ``zoo fit`` (the ``model.`` weights).
"""
from __future__ import annotations

from typing import Optional

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
        Everything else as :class:`ImageClassifier` (label smoothing 0.1 by default here).
    """

    def __init__(self, name: str, checkpoint: str, freeze_backbone: bool = False, layer_decay: Optional[float] = None,
                 convbn_mode: Optional[str] = None, label_smoothing: float = 0.1, **kwargs):
        if layer_decay is not None and not 0 < layer_decay <= 1:
            raise ValueError(f'layer_decay must be in (0, 1], got {layer_decay}')
        self._finetune = dict(checkpoint=checkpoint, convbn_mode=convbn_mode)  # build_model runs in super()
        super().__init__(name, checkpoint=checkpoint, label_smoothing=label_smoothing, **kwargs)
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

    def param_groups(self) -> list[dict]:
        return optim.param_groups(self.model, layer_decay=self.hparams.layer_decay)
