"""Classification heads (kind ``head``): ``(in_features, num_classes)``, (B, C, H, W) -> (B, classes)."""
from __future__ import annotations

import torch
from torch import nn

from ._registry import get, register


@register('head', 'classifier', example=dict(in_features=16, num_classes=5), example_input=(2, 16, 4, 4))
class ClassifierHead(nn.Module):
    """Norm, global average pool, dropout, linear.

    ``pool_first=False`` normalises the whole map then pools (official PoolFormer: GroupNorm(1, C)
    over C*H*W, then mean); ``pool_first=True`` pools then normalises the channels of the pooled
    vector (timm's MetaFormer head: LayerNorm2d, eps 1e-6). Same parameter shapes, different
    functions: a checkpoint reproduces its own implementation only with its own order.
    """

    def __init__(self, in_features: int, num_classes: int, norm_layer='groupnorm1', pool_first: bool = False,
                 drop_rate: float = 0.0):
        super().__init__()
        self.in_features = in_features
        self.pool_first = pool_first
        norm = get('norm', norm_layer)
        self.norm = norm(in_features) if norm else nn.Identity()
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(in_features, num_classes) if num_classes > 0 else nn.Identity()

    def reset(self, num_classes: int) -> None:
        self.fc = nn.Linear(self.in_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.pool_first:
            x = self.norm(x.mean((2, 3), keepdim=True)).flatten(1)  # (B, C, 1, 1) -> (B, C)
        else:
            x = self.norm(x).mean((2, 3))  # (B, C, H, W) -> (B, C)
        x = self.drop(x)
        return x if pre_logits else self.fc(x)
