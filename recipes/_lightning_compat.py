"""Lightning's private names that zoo relies on, in one place. ``tests/test_private_surface.py`` checks that each
still resolves and is still used by Lightning the way zoo assumes, naming the name and the Lightning version when
one is not, so a Lightning upgrade that moves one fails there, loudly; the same file fails if a private Lightning
name is used anywhere else in zoo.

Lightning lives only in ``zoo.recipes``, so this module sits there. It imports Lightning only inside its functions
(and its mixins need none): importing it costs nothing, as ``zoo --help`` and ``zoo list`` require.

Not a private name, so not here: ``recipes/errors.py`` filters a deprecation warning that Lightning's own call
into ``torch.utils._pytree`` raises; it matches the warning's text and calls nothing private.
"""
from __future__ import annotations

__all__ = ['CkptPathHook', 'rich_available']


def rich_available() -> bool:
    """Lightning can use ``rich`` (its ``RichModelSummary`` and ``RichProgressBar`` would work).

    Private name: ``lightning.pytorch.utilities.imports._RICH_AVAILABLE``, Lightning's own requirement check
    (``rich`` installed at a version it supports). Lightning has no public spelling of it, and asking
    ``importlib`` instead would miss its version bound."""
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
    return bool(_RICH_AVAILABLE)


class CkptPathHook:
    """Mixin for a ``LightningCLI`` subclass (listed before ``LightningCLI``): its ``resolve_ckpt_path()`` runs
    where LightningCLI would read ``--ckpt_path``'s checkpoint, right after the arguments are parsed and before
    the seed is set and the classes are instantiated, and replaces that step.

    Private name: ``LightningCLI._parse_ckpt_path``, overridden here. Lightning's step merges the checkpoint's
    hyper-parameters into the config over the user's overrides; no public hook runs at that point, and the
    public ``before_instantiate_classes`` comes after the merge, too late to keep the config as given."""

    def resolve_ckpt_path(self) -> None:
        """Nothing by default (the subclass's step)."""

    def _parse_ckpt_path(self) -> None:
        self.resolve_ckpt_path()
