"""Lazy package exports (PEP 562), shared by ``zoo.datasets`` and ``zoo.recipes``.

Those packages import Lightning in their modules; resolving a name only when it is first used keeps
``import zoo.datasets`` / ``import zoo.recipes`` cheap.
"""
from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package`` that import ``name`` from ``package.<exports[name]>`` on first use."""

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(f'{package}.{exports[name]}'), name)
            setattr(sys.modules[package], name, value)  # cache: later look-ups skip __getattr__
            return value
        raise AttributeError(f'module {package!r} has no attribute {name!r}')

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
