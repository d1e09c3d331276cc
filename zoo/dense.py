"""Dense prediction models: ``DenseModel(backbone, neck, head)`` for detection and segmentation.

The model is torchvision's / detectron2's / mmyolo's: any ``features_only`` backbone (zoo or timm), a neck
(``zoo.layers`` kind ``neck``) and a dense head (kind ``dense_head``) that owns its task's loss and its
prediction in the pixels of each input file. The recipe only calls them:

    maps = model.forward_raw(x)                   # the head's raw outputs (train and eval alike)
    loss, parts = model.head.loss(maps, targets)  # one target dict per image
    preds = model.head.predict(maps, metas)       # one dict per image, in file pixels

``forward(x)`` is ``forward_raw`` in train mode and ``head.predict`` in eval mode (``forward(x, metas)`` maps
the predictions back to each file). :func:`dense_model` builds one from names, resolving the backbone once:
``dense_model('poolformer_tiny', neck='pafpn', head='yolov8', num_classes=3)``; backbone-vs-neck ablations are
then one argument.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zoo import layers

from ._factory import create_with_optional

__all__ = ['DenseModel', 'dense_model', 'backbone_levels']


def backbone_levels(backbone: nn.Module, n: int) -> tuple[list[int], list[int]]:
    """Channels and strides of the backbone's last ``n`` feature levels, checked: strides double per level."""
    info = getattr(backbone, 'feature_info', None)
    name = getattr(backbone, 'zoo_name', type(backbone).__name__)
    if info is None:
        raise ValueError(f'{name} has no feature_info: build the backbone with features_only=True')
    if len(info) < n:
        raise ValueError(f'{name} gives {len(info)} feature level(s) (reductions '
                         f'{[i["reduction"] for i in info]}); the head needs {n}')
    info = list(info)[-n:]
    chs, strides = [int(i['num_chs']) for i in info], [int(i['reduction']) for i in info]
    if any(b != 2 * a for a, b in zip(strides, strides[1:])):
        raise ValueError(f'{name}: the last {n} feature levels have reductions {strides}; they must double '
                         f'from level to level (like 8/16/32)')
    return chs, strides


class DenseModel(nn.Module):
    """``backbone`` (features_only) -> its last ``len(head.strides)`` maps -> ``neck`` -> ``head``.

    See the module docstring. ``num_classes`` and ``strides`` are the head's.
    """

    def __init__(self, backbone: nn.Module, neck: nn.Module, head: nn.Module):
        super().__init__()
        _, strides = backbone_levels(backbone, len(head.strides))
        if tuple(strides) != tuple(head.strides):
            raise ValueError(f'head strides {tuple(head.strides)} differ from the backbone reductions {tuple(strides)}')
        self.backbone, self.neck, self.head = backbone, neck, head
        self.num_classes, self.strides = head.num_classes, tuple(head.strides)

    def _check(self, x: torch.Tensor) -> None:
        name = getattr(self, 'zoo_name', type(self).__name__)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ValueError(f'{name} expects an image batch (B, C, H, W), got '
                             f'{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}')
        s = max(self.strides)
        if x.shape[-2] % s or x.shape[-1] % s:
            raise ValueError(f'{name} needs H and W divisible by {s}, got {x.shape[-2]}x{x.shape[-1]} '
                             f'(letterbox or resize the images to a multiple of {s})')

    def forward_neck(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The neck's maps, one per head stride (what the head reads; feature distillation matches one)."""
        self._check(x)
        feats = list(self.backbone(x))[-len(self.strides):]
        return self.neck(feats)

    def forward_raw(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The head's raw outputs (what ``head.loss`` and ``head.predict`` take), in train or eval mode."""
        return self.head(self.forward_neck(x))

    def compile(self, *args, **kwargs) -> None:
        """``torch.compile`` the backbone, neck and head in place (``nn.Module.compile`` on each, so the state dict
        keeps its keys): ``forward_raw``, which training calls, runs compiled, not only ``forward``. The loss and
        the decoding (``head.loss``, ``head.predict``) stay eager."""
        for part in (self.backbone, self.neck, self.head):
            part.compile(*args, **kwargs)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """timm's switch, passed to the backbone (zoo's and timm's backbones checkpoint each block in training)."""
        if not hasattr(self.backbone, 'set_grad_checkpointing'):
            raise TypeError(f'{type(self.backbone).__name__} has no set_grad_checkpointing')
        self.backbone.set_grad_checkpointing(enable)

    def predict(self, x: torch.Tensor, metas: Sequence[dict] | None = None, forward_raw=None):
        """Eval mode's output: the head's prediction from the network's maps. ``forward_raw``: the network to run
        instead of this model's own (``zoo.optimize`` passes the captured graph, so a runtime predicts through
        the same code as eager)."""
        return self.head.predict((forward_raw or self.forward_raw)(x), metas)

    def forward(self, x: torch.Tensor, metas: Sequence[dict] | None = None):
        return self.forward_raw(x) if self.training else self.predict(x, metas)


def dense_model(backbone: str, num_classes: int, in_chans: int = 3, neck: str = 'pafpn', head: str = 'yolov8',
                backbone_kwargs: dict | None = None, neck_kwargs: dict | None = None, head_kwargs: dict | None = None,
                img_size: int | Sequence[int] | None = None, levels: int | None = 3, model_cls: type = DenseModel,
                **model_kwargs) -> DenseModel:
    """A :class:`DenseModel` from names: the registered ``backbone`` with ``features_only`` (``img_size`` goes to
    backbones whose weights depend on it), the ``neck`` on its last ``levels`` maps (``None``: its last four, or
    all it gives when fewer), the ``head`` on the neck's. ``model_cls`` (a ``DenseModel`` subclass, e.g. ``zoo.segmentation.Segmenter``) gets ``model_kwargs``."""
    bb = create_with_optional(backbone, dict(img_size=img_size), in_chans=in_chans, features_only=True,
                              **(backbone_kwargs or {}))
    if levels is None:
        levels = min(4, len(getattr(bb, 'feature_info', None) or ())) or 4
    chs, strides = backbone_levels(bb, levels)
    n = layers.get('neck', neck)(chs, **(neck_kwargs or {}))
    h = layers.get('dense_head', head)(n.out_channels, num_classes, strides, **(head_kwargs or {}))
    model = model_cls(bb, n, h, **model_kwargs)
    model.backbone_name = backbone
    return model
