"""zoo.recipes: Lightning systems, the command line and sweeps. Imports Lightning; not imported by ``import zoo``.

The systems load lazily (PEP 562), so ``import zoo.recipes`` stays cheap until one is used:

>>> from zoo.recipes import ImageClassifier
>>> system = ImageClassifier('poolformer_tiny', num_classes=10, in_chans=1)
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    'ImageClassifier': 'classification',
    'FineTuner': 'finetune',
    'Denoiser': 'denoising',
    'CausalLM': 'lm',  # issue 7: causal LM on the synthetic reasoning tasks
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f'{__name__}.{_EXPORTS[name]}'), name)
        globals()[name] = value
        return value
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(set(globals()) | set(__all__))
