"""torch's private names that zoo relies on, in one place (``tests/test_timm_contract.py`` checks that each still
resolves, so a torch upgrade that moves one fails there, loudly, instead of silently changing behaviour).

- ``is_fx_symbolic_tracing()``: ``torch.fx.symbolic_trace`` (and tracers built on ``torch.fx.Tracer``: torchvision's
  ``create_feature_extractor``, timm's FX feature tools) is running. Under it, every input is a ``torch.fx.Proxy``
  without a concrete shape, device or dtype: input checks and the oneDNN door step aside and the plain ops are
  recorded. torch has no public spelling of this question (``torch.fx._symbolic_trace.is_fx_symbolic_tracing``,
  the flag ``Tracer.trace`` sets).
"""
from __future__ import annotations

from torch.fx import _symbolic_trace


def is_fx_symbolic_tracing() -> bool:
    """``torch.fx`` symbolic tracing is under way (not ``torch.compile`` / ``torch.export``)."""
    return _symbolic_trace.is_fx_symbolic_tracing()
