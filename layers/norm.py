"""Normalisation blocks (kind ``norm``), constructed as ``norm_layer(num_channels)``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register

_EX = dict(example=dict(num_channels=16), example_input=(2, 16, 8, 8))


@register('norm', 'groupnorm1', **_EX)
class GroupNorm1(nn.GroupNorm):
    """GroupNorm with one group: normalises over (C, H, W) per sample (PoolFormer's norm)."""

    def __init__(self, num_channels: int, eps: float = 1e-5):
        super().__init__(1, num_channels, eps=eps)


@register('norm', 'layernorm2d', **_EX)
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map (MetaFormer's ``LayerNormChannel``)."""

    def __init__(self, num_channels: int, eps: float = 1e-6):
        super().__init__(num_channels, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # b c h w -> b h w c
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)  # b h w c -> b c h w


@register('norm', 'batchnorm2d', **_EX)
class BatchNorm2d(nn.BatchNorm2d):
    """BatchNorm over an NCHW map."""

    def __init__(self, num_channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(num_channels, eps=eps, momentum=momentum)


@register('norm', 'layernorm', layout='nlc', example=dict(num_channels=16), example_input=(2, 10, 16))
class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dimension of a (B, N, C) sequence."""

    def __init__(self, num_channels: int, eps: float = 1e-6):
        super().__init__(num_channels, eps=eps)


@register('norm', 'rmsnorm', layout='nlc', example=dict(num_channels=16), example_input=(2, 10, 16))
class RMSNorm(nn.RMSNorm):
    """RMSNorm over the last dimension (Zhang & Sennrich, 2019)."""

    def __init__(self, num_channels: int, eps: float = 1e-6):
        super().__init__(num_channels, eps=eps)
