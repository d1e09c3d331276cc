"""Stems and downsampling layers (kinds ``stem`` and ``downsample``)."""
from __future__ import annotations

from torch import nn

from ._registry import get, register


@register('stem', 'patch_embed', example=dict(in_chans=3, out_chs=16), example_input=(2, 3, 32, 32))
class PatchEmbed(nn.Module):
    """Overlapping patch embedding: one strided convolution, optionally followed by a norm.

    PoolFormer's stem is ``Conv2d(3, C1, k=7, s=4, p=2)`` with bias and no norm.
    """

    def __init__(self, in_chans: int, out_chs: int, kernel_size: int = 7, stride: int = 4, padding: int = 2,
                 norm_layer=None):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(in_chans, out_chs, kernel_size, stride=stride, padding=padding)
        norm = get('norm', norm_layer)
        self.norm = norm(out_chs) if norm else nn.Identity()

    def forward(self, x):
        return self.norm(self.conv(x))


@register('downsample', 'conv', example=dict(in_chs=16, out_chs=32), example_input=(2, 16, 8, 8))
class ConvDownsample(nn.Module):
    """Strided 3x3 convolution between stages (PoolFormer: k=3, s=2, p=1, bias, no norm)."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 3, stride: int = 2, padding: int = 1,
                 norm_layer=None):
        super().__init__()
        self.stride = stride
        norm = get('norm', norm_layer)
        self.norm = norm(in_chs) if norm else nn.Identity()
        self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.conv(self.norm(x))
