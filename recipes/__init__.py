"""zoo.recipes: Lightning systems, the command line and sweeps. Imports Lightning; not imported by ``import zoo``.

The systems load lazily (PEP 562), so ``import zoo.recipes`` stays cheap until one is used:

>>> from zoo.recipes import ImageClassifier
>>> system = ImageClassifier('poolformer_tiny', num_classes=10, in_chans=1)
"""
from __future__ import annotations

from zoo._lazy import lazy_exports

_EXPORTS = {
    'ZooSystem': 'system',  # the plumbing every task's system shares
    'DenseSystem': 'dense',  # what detection and segmentation share: evaluation loop, grid, writer
    'ImageClassifier': 'classification',
    'FineTuner': 'finetune',
    'Denoiser': 'denoising',
    'CausalLM': 'lm',  # issue 7: causal LM on the synthetic reasoning tasks
    'Detection': 'detection',  # issue 16: YOLOv8-style detection on any features_only backbone
    'Segmentation': 'segmentation',  # issue 28: Semantic FPN / UperNet on any features_only backbone
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
