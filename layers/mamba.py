"""Mamba-YOLO's blocks: the 2-D selective scan (SS2D) and the blocks built around it.

Paper: Wang et al., "Mamba YOLO: SSMs-Based YOLO For Object Detection" (arXiv 2406.05835; AAAI 2025,
"Mamba YOLO: A Simple Baseline for Object Detection with State Space Model"). Official code:
https://github.com/HZAI-ZJNU/Mamba-YOLO (blocks in ``ultralytics/nn/modules/mamba_yolo.py``); SS2D and
the cross scan come from VMamba (Liu et al., arXiv 2401.10166, https://github.com/MzeroMiko/VMamba).
Re-stated here from the paper and /work/shared/references/mamba_yolo.md; every block is NCHW.

| block | registered as | shape |
|---|---|---|
| :class:`SS2D` | ``token_mixer/ss2d`` | (B, C, H, W) -> same |
| :class:`VSSBlock` (= ODSSBlock of the backbone) | ``block/vss_block`` | (B, Cin, H, W) -> (B, C, H, W) |
| :class:`XSSBlock` (ODSSBlock of the neck) | ``block/xss_block`` | (B, Cin, H, W) -> (B, C, H, W) |
| :class:`LSBlock` | ``block/ls_block`` | same shape |
| :class:`RGBlock` | ``channel_mixer/rg_block`` | channels in -> out |
| :class:`SimpleStem` | ``stem/simple_stem`` | (B, 3, H, W) -> (B, C, H/4, W/4) |
| :class:`VisionClueMerge` | ``downsample/vision_clue_merge`` | (B, C, H, W) -> (B, C', H/2, W/2) |
| :class:`XSSPAFPN` (the neck) | ``neck/xss_pafpn`` | three maps -> three maps, same strides |

Every Conv + BatchNorm pair is a :class:`~zoo.layers.convbn.ConvBN` (so ``set_mode`` switches them)
with YOLO's BatchNorm settings (eps 1e-3, momentum 0.03); ``conv_layer`` builds the 3x3 convolutions
(a weighted convolution, for instance); 1x1 convolutions stay ``nn.Conv2d``.
"""
from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ._registry import register
from .convbn import ConvBN
from .detect import BN_EPS, BN_MOMENTUM, PAFPN
from .drop import DropPath
from .norm import LayerNorm2d
from .selective_scan import selective_scan

__all__ = ['cross_scan', 'cross_merge', 'SS2D', 'LSBlock', 'RGBlock', 'VSSBlock', 'ODSSBlock', 'XSSBlock',
           'SimpleStem', 'VisionClueMerge', 'XSSPAFPN', 'space_to_depth', 'BN_EPS', 'BN_MOMENTUM']


def conv_bn(in_chs, out_chs, kernel_size=1, stride=1, groups=1, bias=False, conv_layer=None) -> ConvBN:
    """Conv (3x3 convs from ``conv_layer``) + BatchNorm with YOLO's eps and momentum, 'same' padding."""
    conv = (conv_layer or nn.Conv2d) if kernel_size > 1 else nn.Conv2d
    return ConvBN(in_chs, out_chs, kernel_size, stride, kernel_size // 2, groups=groups, bias=bias,
                  conv_layer=conv, eps=BN_EPS, momentum=BN_MOMENTUM)


# --------------------------------------------------------------------------------------- cross scan


def cross_scan(x: torch.Tensor) -> torch.Tensor:
    """(B, D, H, W) -> (B, 4, D, H*W): row-major, column-major, and both reversed.

    Returned as a view of (B, H*W, 4, D) memory ("L-major"): the projections read it as rows of 4 D
    channels and the selective scan takes it without a transpose.
    """
    b, d, h, w = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(b, h * w, d)      # b d h w -> b (h w) d
    cols = x.permute(0, 3, 2, 1).reshape(b, w * h, d)      # b d h w -> b (w h) d
    xs = torch.stack([rows, cols, rows.flip(1), cols.flip(1)], dim=2)   # (B, L, 4, D)
    return xs.permute(0, 2, 3, 1)                          # b l k d -> b k d l (a view)


def cross_merge(ys: torch.Tensor) -> torch.Tensor:
    """(B, 4, D, H, W) in each direction's own order -> (B, D, H*W) row-major, the sum of the four.

    ``ys[:, k]`` holds direction k's outputs laid out as its scan visited them, viewed as (H, W); the
    column-major ones are (W, H) sequences, un-transposed here. ``cross_merge(cross_scan(x)) == 4 x``.
    Computed position-major ((B, H*W, 4, D), a view for SS2D's scan output) and returned as a transposed
    view of (B, H*W, D) memory, which the LayerNorm over D reads as it is.
    """
    b, k, d, h, w = ys.shape
    y = ys.permute(0, 3, 4, 1, 2).reshape(b, h * w, k, d)               # b k d h w -> b (h w) k d
    fwd = y[:, :, 0] + y[:, :, 2].flip(1)                                # row-major and its reverse
    col = (y[:, :, 1] + y[:, :, 3].flip(1)).view(b, w, h, d).transpose(1, 2)  # b (w h) d -> b h w d
    return (fwd.view(b, h, w, d) + col).view(b, h * w, d).transpose(1, 2)   # b (h w) d -> b d (h w)


# --------------------------------------------------------------------------------------------- SS2D


@register('token_mixer', 'ss2d', layout='nchw', example=dict(dim=16), example_input=(2, 16, 6, 5))
class SS2D(nn.Module):
    """VMamba's 2-D selective scan as Mamba-YOLO uses it (GELU activations, "v2" cross scan).

    in_proj 1x1 (C -> 4C) -> (x, z); x = GELU(DWConv3x3(x)); y = LayerNorm(CrossMerge(scan(CrossScan(x))))
    over the four directions with d_state N, dt_rank R = ceil(C/16); out = out_proj(y * GELU(z)).
    ``scan_method`` picks the selective scan ('chunked' by default, 'sequential' = the reference loop).
    """

    def __init__(self, dim: int, d_state: int = 16, ssm_ratio: float = 2.0, dt_rank='auto', d_conv: int = 3,
                 conv_bias: bool = True, dropout: float = 0.0, conv_layer=None, scan_method: str = 'chunked',
                 chunk_size: int | None = None):
        super().__init__()
        d_inner = int(ssm_ratio * dim)
        self.d_inner, self.d_state, self.k = d_inner, d_state, 4
        self.dt_rank = math.ceil(dim / 16) if dt_rank == 'auto' else int(dt_rank)
        self.scan_method, self.chunk_size = scan_method, chunk_size
        self.in_proj = nn.Conv2d(dim, 2 * d_inner, 1, bias=False)
        conv = (conv_layer or nn.Conv2d) if d_conv > 1 else nn.Conv2d
        self.conv2d = conv(d_inner, d_inner, d_conv, padding=(d_conv - 1) // 2, groups=d_inner, bias=conv_bias)
        self.act = nn.GELU()
        k, r, n = self.k, self.dt_rank, d_state
        # per direction: x -> (dt (R), B (N), C (N)); dt (R) -> d_inner. nn.Linear's default init for x_proj.
        bound = 1.0 / math.sqrt(d_inner)
        self.x_proj_weight = nn.Parameter(torch.empty(k, r + 2 * n, d_inner).uniform_(-bound, bound))
        self.dt_projs_weight = nn.Parameter(torch.randn(k, d_inner, r))  # the official "simple init"
        self.dt_projs_bias = nn.Parameter(torch.randn(k, d_inner))
        self.A_logs = nn.Parameter(torch.zeros(k * d_inner, n))   # A = -exp(A_logs) = -1
        self.Ds = nn.Parameter(torch.ones(k * d_inner))
        self.out_norm = nn.LayerNorm(d_inner)
        self.out_proj = nn.Conv2d(d_inner, dim, 1, bias=False)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def no_weight_decay(self) -> set[str]:
        return {'A_logs', 'Ds'}

    def scan(self, x: torch.Tensor) -> torch.Tensor:
        """Cross selective scan: (B, D, H, W) -> (B, H, W, D), out_norm included.

        Laid out position-major throughout ((B, L, K, D) memory, the (B, K*D, L) tensors the scan takes are
        transposed views): the chunked scan works position-major, so no (K*D, L) transpose is copied.
        """
        b, d, h, w = x.shape
        k, r, n, length = self.k, self.dt_rank, self.d_state, h * w
        # (B, 4, D, L) as (K, B L, D): a view of cross_scan's (B, L, K, D) memory; batched products per direction
        xs = cross_scan(x).permute(0, 3, 1, 2).reshape(b * length, k, d).transpose(0, 1)
        x_dbl = torch.bmm(xs, self.x_proj_weight.transpose(1, 2))                 # (K, B L, R + 2N)
        dts = torch.bmm(x_dbl[..., :r], self.dt_projs_weight.transpose(1, 2))     # (K, B L, D)
        dts = dts.transpose(0, 1).reshape(b, length, k * d)                       # k (b l) d -> b l (k d)
        bs, cs = (x_dbl[..., i:i + n].view(k, b, length, n).permute(1, 0, 3, 2)  # k (b l) n -> b k n l
                  for i in (r, r + n))
        ys = selective_scan(xs.transpose(0, 1).reshape(b, length, k * d).transpose(1, 2),  # b (k d) l, a view
                            dts.transpose(1, 2), -torch.exp(self.A_logs.float()), bs, cs,
                            self.Ds.float(), self.dt_projs_bias.reshape(-1).float(), delta_softplus=True,
                            method=self.scan_method, chunk_size=self.chunk_size)  # (B, K*D, L)
        y = cross_merge(ys.reshape(b, k, d, h, w))                              # (B, D, L)
        y = self.out_norm(y.transpose(1, 2))                                    # (B, L, D)
        return y.reshape(b, h, w, d).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(x).chunk(2, dim=1)                                  # 2 x (B, D, H, W)
        x = self.act(self.conv2d(x))
        y = self.scan(x).permute(0, 3, 1, 2)                                    # b h w d -> b d h w
        return self.dropout(self.out_proj(y * self.act(z)))


# ---------------------------------------------------------------------------------- the other blocks


@register('block', 'ls_block', layout='nchw', example=dict(dim=16), example_input=(2, 16, 6, 5))
class LSBlock(nn.Module):
    """Local spatial block: x + fc3(GELU(fc2(BN(DWConv3x3(x))))), 1x1 convs with bias."""

    def __init__(self, dim: int, out_dim: int | None = None, drop: float = 0.0, conv_layer=None):
        super().__init__()
        out_dim = out_dim or dim
        self.fc1 = conv_bn(dim, dim, 3, groups=dim, bias=True, conv_layer=conv_layer)  # depthwise + BN
        self.fc2 = nn.Conv2d(dim, dim, 1)
        self.act = nn.GELU()
        self.fc3 = nn.Conv2d(dim, out_dim, 1)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.drop(self.fc3(self.act(self.fc2(self.fc1(x)))))
        return x + y


@register('channel_mixer', 'rg_block', layout='nchw', example=dict(in_features=16, hidden_features=64),
          example_input=(2, 16, 6, 5))
class RGBlock(nn.Module):
    """Residual-gated FFN: 1x1 (C -> 2h) -> (x, v); x = GELU(DWConv3x3(x) + x) * v; 1x1 (h -> C'), h = int(2 hidden / 3)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, drop: float = 0.0, conv_layer=None):
        super().__init__()
        out_features = out_features or in_features
        hidden = int(2 * (hidden_features or in_features) / 3)
        self.fc1 = nn.Conv2d(in_features, 2 * hidden, 1)
        self.dwconv = (conv_layer or nn.Conv2d)(hidden, hidden, 3, padding=1, groups=hidden, bias=True)
        self.act = act_layer()
        self.fc2 = nn.Conv2d(hidden, out_features, 1)
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, v = self.fc1(x).chunk(2, dim=1)                                      # 2 x (B, h, H, W)
        x = self.drop(self.act(self.dwconv(x) + x) * v)
        return self.drop(self.fc2(x))


class _SSBlockBase(nn.Module):
    """x = proj(x); x = x + DropPath(SSM(LN(LSBlock(x)))); x = x + DropPath(RGBlock(LN(x)))."""

    def _build_common(self, dim, ssm, mlp_ratio, drop_path, conv_layer):
        self.lsblock = LSBlock(dim, conv_layer=conv_layer)
        self.norm = LayerNorm2d(dim, eps=1e-6)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp_branch = mlp_ratio > 0
        if self.mlp_branch:
            self.norm2 = LayerNorm2d(dim, eps=1e-6)
            self.mlp = RGBlock(dim, int(dim * mlp_ratio), conv_layer=conv_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        # the SSM reads LSBlock(x) but the residual adds to x itself (as in the official code)
        x = x + self.drop_path(self.ssm(self.norm(self.lsblock(x))))
        if self.mlp_branch:
            x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x


def _ss2d_kwargs(d_state, ssm_ratio, conv_layer, scan_method, chunk_size):
    return dict(d_state=d_state, ssm_ratio=ssm_ratio, conv_layer=conv_layer, scan_method=scan_method,
                chunk_size=chunk_size)


@register('block', 'vss_block', layout='nchw', example=dict(dim=16), example_input=(2, 16, 6, 5))
class VSSBlock(_SSBlockBase):
    """The backbone's ODSSBlock: 1x1 Conv (bias) + BN + SiLU (always), LSBlock, SS2D, RGBlock."""

    def __init__(self, dim: int, out_dim: int | None = None, drop_path: float = 0.0, mlp_ratio: float = 4.0,
                 d_state: int = 16, ssm_ratio: float = 2.0, conv_layer=None, scan_method: str = 'chunked',
                 chunk_size: int | None = None):
        super().__init__()
        out_dim = out_dim or dim
        self.proj = nn.Sequential(conv_bn(dim, out_dim, 1, bias=True), nn.SiLU())
        self.ssm = SS2D(out_dim, **_ss2d_kwargs(d_state, ssm_ratio, conv_layer, scan_method, chunk_size))
        self._build_common(out_dim, self.ssm, mlp_ratio, drop_path, conv_layer)


ODSSBlock = VSSBlock  # the AAAI paper's name for the backbone block


@register('block', 'xss_block', layout='nchw', example=dict(dim=16, n=2), example_input=(2, 16, 6, 5))
class XSSBlock(_SSBlockBase):
    """The neck's ODSSBlock: 1x1 Conv + BN + SiLU only when the width changes, then ``n`` SS2D in a row."""

    def __init__(self, dim: int, out_dim: int | None = None, n: int = 1, drop_path: float = 0.0,
                 mlp_ratio: float = 4.0, d_state: int = 16, ssm_ratio: float = 2.0, conv_layer=None,
                 scan_method: str = 'chunked', chunk_size: int | None = None):
        super().__init__()
        out_dim = out_dim or dim
        self.proj = (nn.Sequential(conv_bn(dim, out_dim, 1), nn.SiLU()) if dim != out_dim else nn.Identity())
        kw = _ss2d_kwargs(d_state, ssm_ratio, conv_layer, scan_method, chunk_size)
        self.ssm = nn.Sequential(*(SS2D(out_dim, **kw) for _ in range(n)))
        self._build_common(out_dim, self.ssm, mlp_ratio, drop_path, conv_layer)


@register('stem', 'simple_stem', example=dict(in_chans=3, out_chs=16), example_input=(2, 3, 32, 24))
class SimpleStem(nn.Module):
    """Two 3x3 stride-2 Conv + BN: GELU after the first, SiLU after the second (stride 4)."""

    def __init__(self, in_chans: int, out_chs: int, kernel_size: int = 3, conv_layer=None):
        super().__init__()
        self.conv = nn.Sequential(conv_bn(in_chans, out_chs // 2, kernel_size, 2, conv_layer=conv_layer), nn.GELU(),
                                  conv_bn(out_chs // 2, out_chs, kernel_size, 2, conv_layer=conv_layer), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@register('downsample', 'vision_clue_merge', example=dict(in_chs=16, out_chs=32), example_input=(2, 16, 8, 6))
class VisionClueMerge(nn.Module):
    """Space-to-depth (no pixel dropped) then 1x1 Conv (bias) + BN + SiLU: (B, C, H, W) -> (B, C', H/2, W/2)."""

    def __init__(self, in_chs: int, out_chs: int):
        super().__init__()
        self.pw = nn.Sequential(conv_bn(4 * in_chs, out_chs, 1, bias=True), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(space_to_depth(x))


def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, 4C, H/2, W/2), rows/cols (even, even), (odd, even), (even, odd), (odd, odd)."""
    if x.shape[-2] % 2 or x.shape[-1] % 2:
        raise ValueError(f'VisionClueMerge needs an even height and width, got {tuple(x.shape[-2:])}')
    return torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], dim=1)


@register('neck', 'xss_pafpn', example=dict(in_channels=(8, 16, 32)),
          example_input=((2, 8, 16, 16), (2, 16, 8, 8), (2, 32, 4, 4)))
class XSSPAFPN(PAFPN):
    """Mamba-YOLO's neck: YOLOv8's path aggregation (:class:`~zoo.layers.detect.PAFPN`) with XSSBlocks as its
    four fusion blocks, each with ``depth`` SS2D; no SPPF by default (the ODMamba backbone ends with one).

    top-down: T4 = XSS(cat(up(C5), C4)); P3 = XSS(cat(up(T4), C3))
    bottom-up: P4 = XSS(cat(conv_s2(P3), T4)); P5 = XSS(cat(conv_s2(P4), C5))
    """

    def __init__(self, in_channels, out_channels=None, depth: int = 1, sppf: bool = False, conv_layer=None,
                 scan_method: str = 'chunked', chunk_size: int | None = None):
        block = functools.partial(XSSBlock, conv_layer=conv_layer, scan_method=scan_method, chunk_size=chunk_size)
        super().__init__(in_channels, out_channels, depth, sppf, block=block, conv_layer=conv_layer)
