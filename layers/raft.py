"""RaftMLP's token mixing: vertical and horizontal MLPs over "rafts" of channels.

"RaftMLP: How Much Can Be Done Without Attention and with Less Spatial Locality?", Tatsunami & Taki,
arXiv 2108.04384. Official code: https://github.com/okojoalg/raft-mlp (``libs/modules.py``).

The C channels of a token are split into C/r rafts of r channels each. Vertical mixing treats a raft
of one column as one vector of r*h values (r channels x h rows) and runs an MLP over it; the weights
are shared by all rafts and all columns. Horizontal mixing does the same along a row. The grouping is
*strided* as in the official code: raft ``co`` holds channels ``{co, co + C/r, ..., co + (r-1)C/r}``
(einops ``(r co)``, r the outer factor), not r adjacent channels.

The token-MLP sizes depend on the grid, so the weights are built for one grid. Other grids work as in
the paper's code: the map is resized bicubically to the trained grid, mixed, and resized back.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register
from .onednn import exact_gelu, linear


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def resize_grid(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of an NCHW map (no-op when the grid already matches), as the official RaftShrink."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode='bicubic', align_corners=False)


class RaftMixing(nn.Module):
    """One token MLP along one axis of (B, H, W, C) tokens, over rafts of ``r`` strided channels.

    ``axis='h'`` (vertical): vectors of r*H values, Linear(r*H -> e*r*H) -> GELU -> Linear(e*r*H -> r*H).
    ``axis='w'`` (horizontal): the same along W. No norm and no residual (the caller adds them).
    """

    def __init__(self, dim: int, length: int, axis: str, raft_size: int = 2, expansion: float = 2.0,
                 act_layer=nn.GELU, drop: float = 0.0):
        super().__init__()
        if axis not in ('h', 'w'):
            raise ValueError(f"axis must be 'h' (vertical) or 'w' (horizontal), got {axis!r}")
        if dim % raft_size:
            raise ValueError(f'raft mixing: dim={dim} must be divisible by raft_size={raft_size}')
        self.axis, self.r, self.length = axis, raft_size, length
        features = raft_size * length
        hidden = int(expansion * features)
        self.fc1 = nn.Linear(features, hidden)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) tokens in any memory layout -> (B, H, W, C).

        Short rafts: computed as two batched matrix products on the tokens where they lie, instead of moving
        every raft into a row of its own (``reference``, the plain form; same function). With the mixed axis L next to
        the channels, (L, C) = (L, r, co) memory is an (L*r) x co matrix per (batch, other axis) whose column
        co holds raft co's r*L values, in (l r) order, so the weights are permuted from (r l) to (l r) (small copies).
        Vertical mixing reads (B, W, H, C) memory (free when the caller stores the tokens so, see
        ``zoo.raftmlp.RaftBlock``) and returns its result stored that way; horizontal mixing works on
        (B, H, W, C) memory.
        """
        b, h, w, c = x.shape
        size = h if self.axis == 'h' else w
        if size != self.length:
            raise ValueError(f'raft mixing along {self.axis.upper()} was built for length {self.length}, got {size}')
        r, co = self.r, c // self.r
        if size * r >= 48:
            # Long rafts (the 56 and 28 grids): moving the rafts into rows (as ``reference``) and two large
            # oneDNN GEMMs (GELU fused in inference) beat the batched products, copy included. (With autograd,
            # the batched products' weight gradient would also be a (B*n, e*r*L, r*L) tensor to sum.)
            if not exact_gelu(self.act):
                return self.reference(x)
            pattern = 'b h w (r co) -> b co w (r h)' if self.axis == 'h' else 'b h w (r co) -> b co h (r w)'
            t = self.drop1(linear(rearrange(x, pattern, r=r), self.fc1, gelu=True))
            t = self.drop2(linear(t, self.fc2))
            return rearrange(t, f"{pattern.split(' -> ')[1]} -> {pattern.split(' -> ')[0]}", r=r)  # a view
        t = x.transpose(1, 2) if self.axis == 'h' else x                 # (B, n, L, C), L the mixed axis
        n = t.shape[1]
        t = t.contiguous().view(b * n, size * r, co)                     # (B*n, (l r), co)
        hidden = self.fc1.out_features
        w1 = rearrange(self.fc1.weight, 'e (r l) -> e (l r)', r=r)
        w2 = rearrange(self.fc2.weight, '(r l) e -> (l r) e', r=r)
        b2 = rearrange(self.fc2.bias, '(r l) -> (l r) 1', r=r)
        u = torch.baddbmm(self.fc1.bias[:, None].expand(b * n, hidden, co), w1.expand(b * n, -1, -1), t)
        u = self.drop1(self.act(u))                                      # (B*n, e*r*L, co)
        y = torch.baddbmm(b2.expand(b * n, -1, co), w2.expand(b * n, -1, -1), u)
        y = self.drop2(y).view(b, n, size, c)                            # (B, n, L, (r co))
        return y.transpose(1, 2) if self.axis == 'h' else y

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The plain form of ``forward`` (each raft's r*L values moved into a row, nn.Linear, moved back)."""
        if self.axis == 'h':
            t = rearrange(x, 'b h w (r co) -> b co w (r h)', r=self.r)
        else:
            t = rearrange(x, 'b h w (r co) -> b co h (r w)', r=self.r)
        t = self.drop2(self.fc2(self.drop1(self.act(self.fc1(t)))))
        if self.axis == 'h':
            return rearrange(t, 'b co w (r h) -> b h w (r co)', r=self.r)
        return rearrange(t, 'b co h (r w) -> b h w (r co)', r=self.r)


@register('token_mixer', 'raft', layout='nchw', fixed_size=True,
          example=dict(dim=16, input_resolution=(8, 8)), example_input=(2, 16, 8, 8))
class RaftTokenMixer(nn.Module):
    """Raft token mixing for the MetaFormer skeleton: vertical, then horizontal raft MLP (NCHW in and out).

    Fixed grid: the weights are built for ``input_resolution`` (the MetaFormer stage grid); another
    grid is resized bicubically to it and back, as in RaftMLP. The official block runs the two
    mixings as two pre-norm residual sub-blocks; here the MetaFormer block supplies the one norm and
    the outer residual, and the mixer keeps the inner residual between them:
    ``t = x + V(x)``, output ``t + H(t) - x`` (so that the block's ``x + out`` is ``t + H(t)``).
    """

    def __init__(self, dim: int, input_resolution: int | Sequence[int] = (14, 14), raft_size: int = 2,
                 expansion: float = 2.0, drop: float = 0.0):
        super().__init__()
        if input_resolution is None:
            raise ValueError('the raft token mixer needs input_resolution=(H, W), the token grid its MLPs are '
                             'built for')
        self.grid = _pair(input_resolution)
        self.vertical = RaftMixing(dim, self.grid[0], 'h', raft_size, expansion, drop=drop)
        self.horizontal = RaftMixing(dim, self.grid[1], 'w', raft_size, expansion, drop=drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        t = rearrange(resize_grid(x, self.grid), 'b c h w -> b h w c')
        v = self.vertical(t)
        out = v + self.horizontal(t + v)  # (t + v) + H(t + v) - t
        return resize_grid(rearrange(out, 'b h w c -> b c h w'), tuple(size))
