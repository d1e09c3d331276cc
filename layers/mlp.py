"""Channel mixers (kind ``channel_mixer``): ``(in_features, hidden_features, out_features, act_layer, drop)``."""
from __future__ import annotations

import torch
from torch import nn

from ._registry import get, register
from .onednn import exact_gelu


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

    def forward(self, x):
        if fusable(x, self):
            return self.forward_fused(x)
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                      scale: torch.Tensor | None = None) -> torch.Tensor:
        """Inference on CPU: ``residual + scale * mlp(x)`` in two oneDNN kernels.

        GELU runs inside the fc1 convolution and the residual add inside fc2 (the per-channel
        scale is folded into fc2's weight and bias), so neither the 4x-wide hidden tensor nor the
        output takes an extra pass through memory. The same function as the plain path to float
        rounding (tested). Call only when ``fusable(x, self)``.
        """
        h = torch.ops.mkldnn._convolution_pointwise(x, self.fc1.weight, self.fc1.bias, [0, 0], [1, 1], [1, 1], 1,
                                                    'gelu', [None], 'none')
        w, b = self.fc2.weight, self.fc2.bias
        if scale is not None:
            w, b = w * scale.view(-1, 1, 1, 1), (b * scale if b is not None else None)
        if residual is None:
            # fc2 as a GEMM over the channels-last view: (B, 4C, H, W) viewed as (B, H, W, 4C).
            y = torch.nn.functional.linear(h.permute(0, 2, 3, 1), w.flatten(1), b)
            return y.permute(0, 3, 1, 2)  # b h w c -> b c h w (channels-last strides)
        return torch.ops.mkldnn._convolution_pointwise.binary(h, residual, w, b, [0, 0], [1, 1], [1, 1], 1, 'add',
                                                              1.0, None, [], None)


def fusable(x: torch.Tensor, mlp: ConvMlp) -> bool:
    """Whether the oneDNN inference path applies: no autograd, CPU fp32 channels-last, exact GELU."""
    return (not torch.is_grad_enabled() or not (x.requires_grad or mlp.fc1.weight.requires_grad)) \
        and x.device.type == 'cpu' and x.dtype == torch.float32 and exact_gelu(mlp.act) \
        and _HAS_MKLDNN_FUSION and x.is_contiguous(memory_format=torch.channels_last)


_HAS_MKLDNN_FUSION = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, '_convolution_pointwise')


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

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))
