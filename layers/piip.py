"""PIIP's cross-branch interactions: injector, bidirectional interaction unit and one interaction step.

"Parameter-Inverted Image Pyramid Networks", Zhu et al., NeurIPS 2024, arXiv 2406.04330; official code
https://github.com/OpenGVLab/PIIP (``classification/piip_modules.py``). Module and parameter names follow the
official ones (``branch2to1_injector``, ``ca_gamma``, ``ffn.dwconv.dwconv``, ``interaction_units_12``, ...),
so official state dicts map onto ours key for key.

Branch convention (the official one): branch a is the WIDER model on the SMALLER image, branch b the narrower
model on the larger image. Tokens are (B, H*W, D) sequences without class tokens (those never interact).

All residual terms are scaled by per-channel gammas initialised to zero, so at initialisation every
interaction is an exact identity and pretrained branches compute exactly what they computed alone.
"""
from __future__ import annotations

import math
from functools import partial
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import nn

from .deform_attn import DeformCrossAttention
from .drop import DropPath

__all__ = ['ConvFFN', 'Injector', 'InteractionUnit', 'InteractionBlock']

Grid = tuple[int, int]


class _DWConv(nn.Module):
    """Depthwise 3x3 conv over a token sequence laid out on its (H, W) grid (a module so keys match the official)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        x = rearrange(x, 'b (h w) c -> b c h w', h=grid[0], w=grid[1])
        return rearrange(self.dwconv(x), 'b c h w -> b (h w) c')


class ConvFFN(nn.Module):
    """Linear(D -> hidden) -> depthwise 3x3 conv on the token grid -> GELU -> Dropout -> Linear(-> D) -> Dropout."""

    def __init__(self, dim: int, hidden: int, act_layer=nn.GELU, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = _DWConv(hidden)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, grid: Grid) -> torch.Tensor:
        x = self.drop(self.act(self.dwconv(self.fc1(x), grid)))
        return self.drop(self.fc2(x))


class Injector(nn.Module):
    """Inject value tokens (another branch, already projected to this width) into query tokens:

        q = q + ca_gamma * DeformAttn(query_norm(q), feat_norm(feat))
        q = q + cffn_gamma * DropPath(ConvFFN(ffn_norm(q)))

    Both gammas start at zero (identity at init); DropPath is on the ConvFFN term only (official).
    """

    def __init__(self, dim: int, num_heads: int = 16, num_points: int = 4, deform_ratio: float = 0.5,
                 cffn_ratio: float = 0.25, drop: float = 0.0, drop_path: float = 0.0,
                 norm_layer=partial(nn.LayerNorm, eps=1e-6)):
        super().__init__()
        self.query_norm = norm_layer(dim)
        self.feat_norm = norm_layer(dim)
        self.attn = DeformCrossAttention(dim, dim, num_heads=num_heads, num_points=num_points, ratio=deform_ratio)
        self.ca_gamma = nn.Parameter(torch.zeros(dim))
        self.cffn_gamma = nn.Parameter(torch.zeros(dim))
        self.ffn = ConvFFN(dim, int(dim * cffn_ratio), drop=drop)
        self.ffn_norm = norm_layer(dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, query: torch.Tensor, query_grid: Grid, feat: torch.Tensor, feat_grid: Grid) -> torch.Tensor:
        attn = self.attn(self.query_norm(query), query_grid, self.feat_norm(feat), feat_grid)
        query = query + self.ca_gamma * attn
        return query + self.cffn_gamma * self.drop_path(self.ffn(self.ffn_norm(query), query_grid))


class InteractionUnit(nn.Module):
    """Bidirectional interaction between neighbouring branches a (width dim_a, small image) and b (dim_b, large).

    Both projections read the PRE-update tensors, so the two directions are symmetric:
    a <- Injector_a(a, Linear(dim_b -> dim_a)(b)),  b <- Injector_b(b, Linear(dim_a -> dim_b)(a)).
    """

    def __init__(self, dim_a: int, dim_b: int, **injector_kw):
        super().__init__()
        self.branch2to1_proj = nn.Linear(dim_b, dim_a)
        self.branch1to2_proj = nn.Linear(dim_a, dim_b)
        self.branch2to1_injector = Injector(dim_a, **injector_kw)
        self.branch1to2_injector = Injector(dim_b, **injector_kw)

    def forward(self, xa: torch.Tensor, grid_a: Grid, xb: torch.Tensor,
                grid_b: Grid) -> tuple[torch.Tensor, torch.Tensor]:
        a_to_b = self.branch1to2_proj(xa)  # (B, Na, dim_b)
        b_to_a = self.branch2to1_proj(xb)  # (B, Nb, dim_a)
        xa = self.branch2to1_injector(xa, grid_a, b_to_a, grid_b)
        xb = self.branch1to2_injector(xb, grid_b, a_to_b, grid_a)
        return xa, xb


def _init_weights(m: nn.Module) -> None:
    """The official init of the interaction modules: truncated-normal Linears (std 0.02, zero bias), unit
    LayerNorms, He-normal convs over fan-out (kernel area * out channels / groups), zero conv bias."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


class InteractionBlock(nn.Module):
    """One interaction step over N branches (index 0 = widest model on the smallest image).

    Units join neighbours only, named ``interaction_units_{i}{i+1}`` (1-based, official), and run from the
    high-resolution end inward: for 3 branches unit 23 first, then unit 12, which sees branch 2 as unit 23
    left it. Branches 1 and 3 never talk directly.
    """

    def __init__(self, dims: Sequence[int], **injector_kw):
        super().__init__()
        if len(dims) < 2:
            raise ValueError(f'InteractionBlock needs at least 2 branches, got dims={tuple(dims)}')
        self.num_branches = len(dims)
        for i in range(len(dims) - 1):
            self.add_module(f'interaction_units_{i + 1}{i + 2}', InteractionUnit(dims[i], dims[i + 1], **injector_kw))
        self.apply(_init_weights)
        for m in self.modules():  # the deformable attention keeps its own init (offset rays, uniform weights)
            if isinstance(m, DeformCrossAttention):
                m.reset_parameters()

    def unit(self, i: int) -> InteractionUnit:
        """The unit between branches i and i+1 (0-based)."""
        return getattr(self, f'interaction_units_{i + 1}{i + 2}')

    def forward(self, xs: Sequence[torch.Tensor], grids: Sequence[Grid]) -> list[torch.Tensor]:
        xs = list(xs)
        for i in reversed(range(self.num_branches - 1)):  # high-resolution pair first
            xs[i], xs[i + 1] = self.unit(i)(xs[i], grids[i], xs[i + 1], grids[i + 1])
        return xs
