"""timm's private names that zoo relies on, in one place. ``tests/test_private_surface.py`` checks that each still
resolves and means what zoo assumes, naming the name and the timm version when one does not, so a timm upgrade
that moves one fails there, loudly; the same file fails if a private timm name is used anywhere else in zoo.

timm exports ``FeatureInfo`` and ``FeatureHookNet`` from ``timm.models``, but not ``FeatureGetterNet`` nor
``feature_take_indices``: those two live in the private ``timm.models._features``. (``auto_group_layers`` also
lives in a private module, ``timm.optim._param_groups``, but ``timm.optim`` re-exports it, so ``zoo.recipes.optim``
imports it from there.) timm is imported here lazily (its import is heavy; ``import zoo`` must stay light).
"""
from __future__ import annotations


def feature_take_indices(num_stages: int, indices) -> tuple[list[int], int]:
    """Which stages ``indices`` selects, as timm's ``forward_intermediates`` reads it: ``None`` all, an int the last
    n, a list those (negative from the end); and the last stage needed.

    Private name: ``timm.models._features.feature_take_indices``. timm does not export it, and zoo's models must
    read ``indices`` exactly as timm's own models do."""
    from timm.models._features import feature_take_indices as take
    return take(num_stages, indices)


def feature_getter_net():
    """timm's ``FeatureGetterNet`` class: a model's ``forward_intermediates`` as a ``features_only`` network
    (``feature_cls='getter'``).

    Private name: ``timm.models._features.FeatureGetterNet``. timm does not export it; it is the wrapper timm's own
    ``features_only`` models use for ``feature_cls='getter'``."""
    from timm.models._features import FeatureGetterNet
    return FeatureGetterNet
