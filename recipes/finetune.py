"""Fine-tuning: start from a checkpoint, put a new head on, optionally freeze the backbone, and
give earlier layers smaller learning rates (layer-wise lr decay, BEiT/ConvNeXt style).

The checkpoint can be a zoo or timm state dict (``.pth``/``.safetensors``, official layouts are
remapped by the family) or a Lightning ``.ckpt`` written by ``zoo fit`` (the ``model.`` weights).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

import zoo

from .classification import ImageClassifier

# The first block index in a parameter name: ``stages.2.blocks.3``, ``stages.1`` (downsampling),
# ``blocks.5``, ``layers.0.blocks.1``. Parameters before the first block are the stem (layer 0);
# unmatched ones after it are the head (the last layer).
_BLOCK = re.compile(r'^((?:.*?\.)?(?:stages|layers|levels|blocks)\.\d+(?:\.(?:blocks|layers)\.\d+)?)(?:\.|$)')


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Parameter name -> depth index: 0 for the stem, one index per block (in order), last for the head."""
    order: dict[str, int] = {}
    ids: dict[str, int | None] = {}
    for name, _ in model.named_parameters():
        m = _BLOCK.match(name)
        if m:
            ids[name] = order.setdefault(m.group(1), len(order) + 1)
        else:
            ids[name] = 0 if not order else None  # stem before any block, head after
    last = len(order) + 1
    return {k: last if v is None else v for k, v in ids.items()}


def head_prefix(model: nn.Module) -> str:
    """The module path of the classifier (``head.fc`` for zoo models; timm's ``pretrained_cfg['classifier']``)."""
    prefix = getattr(model, 'classifier_prefix', None) or getattr(model, 'pretrained_cfg', {}).get('classifier')
    if not prefix:
        raise ValueError(f'{type(model).__name__} does not name its classifier (classifier_prefix); cannot fine-tune')
    return prefix


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a zoo/timm checkpoint or the network weights of a Lightning ``.ckpt``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'checkpoint not found: {path} (a .pth/.safetensors state dict or a zoo fit .ckpt)')
    if path.suffix == '.ckpt':
        ckpt = torch.load(path, map_location='cpu', weights_only=False)  # Lightning checkpoints hold hparams too
        sd = ckpt.get('state_dict') if isinstance(ckpt, dict) else None
        if not isinstance(sd, dict):
            raise ValueError(f'{path} is not a Lightning checkpoint (no state_dict)')
        weights = {k[len('model.'):]: v for k, v in sd.items() if k.startswith('model.')}
        if not weights:
            raise ValueError(f'{path} holds no model.* weights (was it written by a zoo recipe?)')
        return weights
    return zoo.read_state_dict(path)


def load_backbone(model: nn.Module, state_dict: dict, path) -> list[str]:
    """Load everything but the classifier; return the head keys left newly initialised.

    A checkpoint of another architecture is rejected, naming its first missing/unexpected/mis-shaped keys.
    """
    remap = getattr(model, 'remap_checkpoint', None)
    sd = remap(state_dict) if remap is not None else dict(state_dict)
    head = head_prefix(model) + '.'
    own = model.state_dict()
    sd = {k: v for k, v in sd.items() if not k.startswith(head)}
    missing = [k for k in own if k not in sd and not k.startswith(head)]
    unexpected = [k for k in sd if k not in own]
    shapes = [f'{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}' for k in sd if k in own and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        name = getattr(model, 'zoo_name', type(model).__name__)
        detail = '; '.join(f'{len(v)} {t}: {", ".join(v[:4])}' for t, v in
                           (('missing', missing), ('unexpected', unexpected), ('mis-shaped', shapes)) if v)
        raise ValueError(f'checkpoint {path} is not a {name} backbone ({detail})')
    model.load_state_dict(sd, strict=False)
    return [k for k in own if k.startswith(head)]


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
        self.head = self.model.get_submodule(head_prefix(self.model))
        if freeze_backbone:
            head_params = {id(p) for p in self.head.parameters()}
            for p in self.model.parameters():
                p.requires_grad_(id(p) in head_params)

    def build_model(self) -> nn.Module:
        hp = self.hparams
        model = zoo.create(hp.name, num_classes=hp.num_classes, in_chans=hp.in_chans, **(hp.model_args or {}))
        self.new_head_keys = load_backbone(model, read_weights(hp.checkpoint), hp.checkpoint)
        if hp.convbn_mode is not None:
            from zoo.layers.convbn import set_mode  # written with the ConvBN issue; imported only when asked for
            set_mode(model, hp.convbn_mode)
        return model

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone:  # a frozen backbone keeps its normalisation statistics too
            self.model.eval()
            self.head.train()

    def param_groups(self) -> list[dict]:
        decay = self.hparams.layer_decay
        if decay is None:
            return super().param_groups()
        ids = layer_ids(self.model)
        last = max(ids.values())
        groups: dict[tuple[int, bool], dict] = {}
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            layer, wd = ids[name], p.ndim > 1
            g = groups.setdefault((layer, wd), {'params': [], 'weight_decay': self.hparams.weight_decay if wd else 0.0,
                                                'lr_scale': decay ** (last - layer), 'layer': layer})
            g['params'].append(p)
        out = sorted(groups.values(), key=lambda g: (g['layer'], g['weight_decay']))
        for g in out:
            g['lr'] = self.hparams.lr * g['lr_scale']
        return out
