"""mmengine interop: every zoo model is buildable as ``MODELS.build(dict(type='zoo.<name>', ...))``.

mmengine resolves the ``zoo.`` scope by importing this module, which creates a child registry of
mmengine's root ``MODELS`` with scope ``zoo`` and registers a builder for each zoo model.
Imported only by mmengine (or explicitly): ``import zoo`` does not import mmengine.
"""
from __future__ import annotations

import functools

from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

import zoo

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='zoo')

for _name in zoo.list_models():
    MODELS.register_module(name=_name, module=functools.partial(zoo.create, _name))

__all__ = ['MODELS']
