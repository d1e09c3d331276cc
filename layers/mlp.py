"""Channel mixers (kind ``channel_mixer``): ``(in_features, hidden_features, out_features, act_layer, drop)``."""
from __future__ import annotations

import torch
from torch import nn

from ._registry import get, register
from .onednn import conv_add, conv_bn_act, exact_gelu, linear


@register('channel_mixer', 'mlp', example=dict(in_features=16, hidden_features=32), example_input=(2, 16, 8, 8))
class ConvMlp(nn.Module):
    """Two 1x1 convolutions with an activation between, on NCHW maps (PoolFormer's ``Mlp``).

    Key names ``fc1``/``fc2`` match the official PoolFormer and timm's ``Mlp(use_conv=True)``.
    On a channels-last tensor the 1x1 convolutions run as one GEMM each.
    """

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, drop: float = 0.0, bias: bool = True):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Conv2d(in_features, hidden_features, 1, bias=bias)
        self.act = get('act', act_layer)()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Conv2d(hidden_features, out_features, 1, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                scale: torch.Tensor | None = None) -> torch.Tensor:
        """``mlp(x)``, or ``residual + scale * mlp(x)`` (``scale`` per channel) when ``residual`` is given.

        Through ``zoo.layers.onednn``: in CPU inference an exact GELU runs inside fc1's convolution and the
        residual add inside fc2's (the scale folded into its weights), so neither the 4x-wide hidden tensor
        nor the output takes an extra pass through memory; plain convolutions under autograd, compile, export
        and FLOP counters. The same function either way (tested)."""
        if exact_gelu(self.act):
            h = conv_bn_act(x, self.fc1, gelu=True)
        else:
            h = self.act(self.fc1(x))
        h = self.drop1(h)
        if residual is None:
            return self.drop2(conv_bn_act(h, self.fc2))
        if self.training and self.drop2.p > 0:
            return residual + self.drop2(self.fc2(h)) * (1 if scale is None else scale.view(1, -1, 1, 1))
        return conv_add(h, self.fc2, residual, scale)


@register('channel_mixer', 'mlp_nlc', layout='nlc', example=dict(in_features=16, hidden_features=32),
          example_input=(2, 10, 16))
class Mlp(nn.Module):
    """Two linear layers with an activation between, on (B, N, C) tokens (ViT's MLP)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, drop: float = 0.0, bias: bool = True):
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias)
        self.act = get('act', act_layer)()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out). Through ``zoo.layers.onednn.linear``: in CPU inference an exact GELU runs
        fused into fc1 (oneDNN); elsewhere nn.Linear's function."""
        if exact_gelu(self.act):
            h = linear(x, self.fc1, gelu=True)
        else:
            h = self.act(self.fc1(x))
        return self.drop2(linear(self.drop1(h), self.fc2))
