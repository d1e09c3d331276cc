"""timm's private names that zoo relies on, in one place (``tests/test_timm_contract.py`` checks that each still
resolves, so a timm upgrade that moves one fails there, loudly).

timm exports ``FeatureInfo`` and ``FeatureHookNet`` from ``timm.models``, but not ``FeatureGetterNet`` nor
``feature_take_indices``: those two live in the private ``timm.models._features``. timm is imported here lazily
(its import is heavy; ``import zoo`` must stay light).
"""
from __future__ import annotations


def feature_take_indices(num_stages: int, indices) -> tuple[list[int], int]:
    """timm's ``feature_take_indices``: ``None`` all, an int the last n, a list those (negative from the end)."""
    from timm.models._features import feature_take_indices as take
    return take(num_stages, indices)


def feature_getter_net():
    """timm's ``FeatureGetterNet`` class (wraps a model's ``forward_intermediates``)."""
    from timm.models._features import FeatureGetterNet
    return FeatureGetterNet
