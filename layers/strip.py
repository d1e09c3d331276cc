"""Strip-MLP's token mixing: the Strip MLP layer, CGSMM and LSMM.

"Strip-MLP: Efficient Token Interaction for Vision MLP", Cao et al., ICCV 2023, arXiv 2307.11458.
Official code: https://github.com/Med-Process/Strip_MLP (``models/strip_mlp.py``).

- Strip MLP layer: every row (or column) of a channel is mixed by a full W x W linear map that also
  reads the two neighbouring rows ("cross-strip aggregation"): a grouped conv with kernel (1, 3)
  whose channels are the W positions of a row.
- CGSMM (cascade group strip mixing): the channels are cut into p "patches" of g channels; the
  strip weights are specific to the within-patch channel and shared by the p patches. A row step
  then a column step, each fused with its input by a 1x1 conv.
- LSMM (local strip mixing): 3x7 and 7x3 depthwise strips and the identity, weighted per channel by
  a softmax over the three branches (ViP's split attention).

Every block here needs a fixed, square grid (the strip weights are W x W); a mismatched input raises.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from einops import rearrange
from torch import nn

from ._registry import register
from .onednn import conv_bn_act, exact_gelu

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')


def _square(input_resolution, who: str) -> int:
    if input_resolution is None:
        raise ValueError(f'{who} needs input_resolution, the square token grid its weights are built for')
    h, w = (input_resolution, input_resolution) if isinstance(input_resolution, int) else input_resolution
    if h != w:
        raise ValueError(f'{who} needs a square grid (its strip weights are W x W), got {h}x{w}')
    return int(h)


def strip_groups(dim: int) -> int:
    """The official group factor p: 2 when the block width is a multiple of 80, else 4."""
    return 2 if dim % 80 == 0 else 4


class RelativePosition(nn.Module):
    """A learned Toeplitz bias over the (s, s) grid per channel: ``bias[c, q, k] = table[k - q + s, c]``."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        self.table = nn.Parameter(torch.empty(2 * size + 1, channels))
        nn.init.trunc_normal_(self.table, std=0.02)
        pos = torch.arange(size)
        self.register_buffer('index', (pos[None, :] - pos[:, None]).clamp(-size, size) + size, persistent=False)

    def forward(self) -> torch.Tensor:
        return rearrange(self.table[self.index], 'q k c -> c q k')  # (s, s, C) -> (C, s, s)


class StripMLPLayer(nn.Module):
    """The Strip MLP layer over one axis of (N, p*g, s, s) maps, as a grouped conv with kernel (1, 3).

    ``axis='w'`` mixes the W positions of each row, reading rows h-1, h, h+1; ``axis='h'`` mixes the
    H positions of each column, reading columns w-1, w, w+1. Weights per within-patch channel c2,
    shared by the p patches.
    """

    def __init__(self, groups: int, size: int, axis: str):
        super().__init__()
        if axis not in ('h', 'w'):
            raise ValueError(f"axis must be 'h' or 'w', got {axis!r}")
        self.g, self.size, self.axis = groups, size, axis
        self.proj = nn.Conv2d(size * groups, groups * size, (1, 3), padding=(0, 1), groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.axis == 'w':  # channels (c2, w); conv runs over (c1, h): kernel 3 along h
            t = rearrange(x, 'n (c1 c2) h w -> n (c2 w) c1 h', c2=self.g)
            return rearrange(conv_bn_act(t, self.proj), 'n (c2 w) c1 h -> n (c1 c2) h w', c2=self.g)
        t = rearrange(x, 'n (c1 c2) h w -> n (c2 h) c1 w', c2=self.g)
        return rearrange(conv_bn_act(t, self.proj), 'n (c2 h) c1 w -> n (c1 c2) h w', c2=self.g)


class CascadeGroupStripMixing(nn.Module):
    """CGSMM on (N, C', s, s): row step, fuse, BN-GELU; column step, fuse (official ``strip_mlp``).

    ``rows = GELU(BN(fuse_h([proj_h(x + pos_h), x]))) + pos_w``; output ``fuse_w([x, proj_w(rows)])``.
    Both fuses take the module's input x (without any bias): the row fuse as its second operand, the
    column fuse as its first. The cascade is row -> column, but each step is fused with the original
    map, not with the previous step.

    ``dim`` is the full block width (it sets p and g); the module sees C' = dim / 2 channels.
    """

    def __init__(self, dim: int, size: int):
        super().__init__()
        half = dim // 2
        p = strip_groups(dim)
        if dim % (2 * p):
            raise ValueError(f'strip mixing: dim={dim} must be divisible by {2 * p} (p={p} groups on half the width)')
        g = dim // (2 * p)
        self.pos_h = RelativePosition(half, size)
        self.pos_w = RelativePosition(half, size)
        self.proj_h = StripMLPLayer(g, size, 'w')  # mixes along each row
        self.proj_w = StripMLPLayer(g, size, 'h')  # mixes along each column
        self.fuse_h = nn.Conv2d(2 * half, half, 1, bias=False)
        self.fuse_w = nn.Conv2d(2 * half, half, 1, bias=False)
        self.norm = nn.BatchNorm2d(half)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Both fuses read the module's *input* x, as the official code does (it never reassigns x): the row
        # fuse sees x without the position bias, and the column fuse sees x, not the row-mixed map.
        rows = torch.cat([self.proj_h(x + self.pos_h()), x], dim=1)  # (N, 2C', s, s)
        if exact_gelu(self.act):  # inference: BN folded, GELU fused
            rows = conv_bn_act(rows, self.fuse_h, self.norm, gelu=True) + self.pos_w()
        else:
            rows = self.act(self.norm(self.fuse_h(rows))) + self.pos_w()
        return conv_bn_act(torch.cat([x, self.proj_w(rows)], dim=1), self.fuse_w)  # oneDNN in inference


class LocalStripMixing(nn.Module):
    """LSMM on (N, C', H, W): 3x7 and 7x3 depthwise strips and the identity, softmax-weighted per channel.

    The weights come from GAP(a + b + x) through a 1x1-conv MLP C' -> dim/4 -> 3C' (GAP first, as in the
    code; the paper's figure draws the MLP first). The hidden width is a quarter of the *full* block
    width ``dim``, as the official counts require.
    """

    def __init__(self, dim: int):
        super().__init__()
        half = dim // 2
        self.strip_w = nn.Conv2d(half, half, (3, 7), padding=(1, 3), groups=half, bias=False)
        self.strip_h = nn.Conv2d(half, half, (7, 3), padding=(3, 1), groups=half, bias=False)
        self.reweight = nn.Sequential(nn.Conv2d(half, dim // 4, 1), nn.GELU(), nn.Conv2d(dim // 4, 3 * half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = conv_bn_act(x, self.strip_w), conv_bn_act(x, self.strip_h)
        gap = a.mean((2, 3), keepdim=True) + b.mean((2, 3), keepdim=True) + x.mean((2, 3), keepdim=True)
        fc1, act, fc2 = self.reweight
        if exact_gelu(act):  # inference: oneDNN (PyTorch's own path for a 1x1 conv on a 1x1 map is im2col)
            att = conv_bn_act(conv_bn_act(gap, fc1, gelu=True), fc2)
        else:
            att = self.reweight(gap)  # GAP(a + b + x) -> (N, 3C', 1, 1)
        att = rearrange(att, 'n (c k) 1 1 -> k n c 1 1', k=3).softmax(dim=0)
        return torch.addcmul(torch.addcmul(b * att[0], a, att[1]), x, att[2])  # b*att0 + a*att1 + x*att2


class StripMLPBlock(nn.Module):
    """1x1 conv-BN-GELU, CGSMM on the first half of the channels and LSMM on the second, 1x1 fuse."""

    def __init__(self, dim: int, size: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f'strip mixing: dim={dim} must be even (half the channels go to each branch)')
        self.proj = nn.Conv2d(dim, dim, 1)
        self.norm = nn.BatchNorm2d(dim)
        self.act = nn.GELU()
        self.cgsmm = CascadeGroupStripMixing(dim, size)
        self.lsmm = LocalStripMixing(dim)
        self.fuse = nn.Conv2d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if exact_gelu(self.act):  # inference: BN folded, GELU fused
            x = conv_bn_act(x, self.proj, self.norm, gelu=True)
        else:
            x = self.act(self.norm(self.proj(x)))
        x1, x2 = x.chunk(2, dim=1)
        return conv_bn_act(torch.cat([self.cgsmm(x1), self.lsmm(x2)], dim=1), self.fuse)  # oneDNN in inference


@register('token_mixer', 'strip', layout='nchw', fixed_size=True,
          example=dict(dim=16, input_resolution=(8, 8)), example_input=(2, 16, 8, 8))
class StripTokenMixer(nn.Module):
    """Strip-MLP's token mixing: pre-activation depthwise conv (BN-GELU-DW3x3), then the Strip MLP block.

    Fixed, square grid: built for ``input_resolution``; another grid raises an error naming it.
    """

    def __init__(self, dim: int, input_resolution: int | Sequence[int] = (14, 14)):
        super().__init__()
        self.size = _square(input_resolution, 'the strip token mixer')
        self.dwsc = nn.Sequential(nn.BatchNorm2d(dim), nn.GELU(),
                                  nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False))
        self.strip = StripMLPBlock(dim, self.size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.fx.Proxy) and tuple(x.shape[-2:]) != (self.size, self.size):  # fx: no shape
            raise ValueError(f'the strip token mixer was built for a {self.size}x{self.size} token grid (its weights '
                             f'depend on it) but got {x.shape[-2]}x{x.shape[-1]}; build the model with the input '
                             f'size you feed it (img_size=...)')
        bn, act, dwconv = self.dwsc
        return self.strip(conv_bn_act(act(bn(x)), dwconv))
