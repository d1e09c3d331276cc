"""Regularisation helpers shared by every family: stochastic depth and layer scale.

Not registered blocks (they have no interchangeable alternatives); plain modules.
"""
from __future__ import annotations

import torch
from torch import nn


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth (Huang et al., 2016): drop whole residual branches per sample."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)  # (B, 1, ..., 1)
    return x * mask.div_(keep)


torch.fx.wrap('drop_path')  # its mask's shape needs the input's: one call in a torch.fx graph


class DropPath(nn.Module):
    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f'p={self.p}'


class LayerScale(nn.Module):
    """Per-channel learnable scale (CaiT, Touvron et al. 2021); ``dim`` is the channel axis."""

    def __init__(self, channels: int, init_value: float = 1e-5, channel_dim: int = 1):
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), float(init_value)))
        self.channel_dim = channel_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channel_dim == 1 and x.ndim == 4:
            return x * self.scale.view(1, -1, 1, 1)  # (C,) -> (1, C, 1, 1)
        return x * self.scale


def linear_drop_path_rates(rate: float, depths: list[int]) -> list[list[float]]:
    """Drop-path rate rising linearly over all blocks of all stages: rate * i / (n - 1)."""
    n = sum(depths)
    rates = [rate * i / max(n - 1, 1) for i in range(n)]
    out, start = [], 0
    for d in depths:
        out.append(rates[start:start + d])
        start += d
    return out
