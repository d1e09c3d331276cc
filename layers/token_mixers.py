"""Token mixers (kind ``token_mixer``): ``(dim, **kw)``, x -> x with the same shape.

The MetaFormer paper (Yu et al., CVPR 2022, arXiv 2111.11418; github.com/sail-sg/poolformer)
argues that the block skeleton, not the particular mixer, carries most of the accuracy; these
are the mixers its paper and "MetaFormer Baselines" (arXiv 2210.13452) compare.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register

_EX = dict(example=dict(dim=16), example_input=(2, 16, 8, 8))


@register('token_mixer', 'pooling', **_EX)
class Pooling(nn.Module):
    """PoolFormer's mixer: ``avgpool(x) - x``.

    The ``- x`` cancels the block's residual (the input is added back outside);
    ``count_include_pad=False`` keeps border averages unbiased. No parameters.
    """

    def __init__(self, dim: int | None = None, pool_size: int = 3):
        super().__init__()
        self.pool = nn.AvgPool2d(pool_size, stride=1, padding=pool_size // 2, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x) - x


@register('token_mixer', 'identity', **_EX)
class IdentityMixer(nn.Module):
    """No token mixing at all (MetaFormer's ``metaformer_id`` ablation)."""

    def __init__(self, dim: int | None = None):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@register('token_mixer', 'attention', **_EX)
class Attention(nn.Module):
    """Multi-head self-attention over the H*W tokens of an NCHW map (MetaFormer's ``Attention``).

    ``head_dim=32`` and ``qkv_bias=False`` follow the official MetaFormer hybrids.
    """

    def __init__(self, dim: int, head_dim: int = 32, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        self.head_dim = min(head_dim, dim)
        if dim % self.head_dim:
            raise ValueError(f'attention: dim={dim} must be a multiple of head_dim={self.head_dim}')
        self.num_heads = dim // self.head_dim
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        t = rearrange(x, 'b c h w -> b (h w) c')
        q, k, v = rearrange(self.qkv(t), 'b n (three nh d) -> three b nh n d', three=3, nh=self.num_heads)
        t = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        t = self.proj_drop(self.proj(rearrange(t, 'b nh n d -> b n (nh d)')))
        return rearrange(t, 'b (h w) c -> b c h w', h=h, w=w)


class StarReLU(nn.Module):
    """``s * relu(x)**2 + b`` with learnable scalars (MetaFormer Baselines)."""

    def __init__(self, scale: float = 1.0, bias: float = 0.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.bias = nn.Parameter(torch.tensor(float(bias)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * F.relu(x).square() + self.bias


register('act', 'star_relu', layout='any', example_input=(2, 16, 8, 8))(StarReLU)


@register('token_mixer', 'sepconv', **_EX)
class SepConv(nn.Module):
    """Inverted separable convolution (MobileNetV2), ConvFormer's mixer in MetaFormer Baselines.

    1x1 expand (x2) -> StarReLU -> depthwise 7x7 -> 1x1 project, all without bias.
    """

    def __init__(self, dim: int, expansion_ratio: float = 2, kernel_size: int = 7, act_layer=StarReLU):
        super().__init__()
        mid = int(expansion_ratio * dim)
        self.pwconv1 = nn.Conv2d(dim, mid, 1, bias=False)
        self.act = act_layer()
        self.dwconv = nn.Conv2d(mid, mid, kernel_size, padding=kernel_size // 2, groups=mid, bias=False)
        self.pwconv2 = nn.Conv2d(mid, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pwconv2(self.dwconv(self.act(self.pwconv1(x))))
