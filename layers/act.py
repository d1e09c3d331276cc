"""Activations (kind ``act``), constructed with no arguments."""
from __future__ import annotations

from torch import nn

from ._registry import register

_EX = dict(layout='any', example_input=(2, 16, 8, 8))

register('act', 'gelu', **_EX)(nn.GELU)
register('act', 'relu', **_EX)(nn.ReLU)
register('act', 'silu', **_EX)(nn.SiLU)
register('act', 'hardswish', **_EX)(nn.Hardswish)
register('act', 'identity', **_EX)(nn.Identity)
