"""The block registry: building blocks registered by kind with a class decorator.

Kinds and their constructor / shape contracts:

| kind           | constructor                                                   | shape contract                               |
|----------------|---------------------------------------------------------------|----------------------------------------------|
| token_mixer    | ``(dim, **kw)``                                               | x -> x, same shape, in the declared layout   |
| channel_mixer  | ``(in_features, hidden_features, out_features, act_layer, drop)`` | channels in -> out, declared layout       |
| sequence_mixer | ``(dim, **kw)``                                               | (B, L, D) -> (B, L, D), causal               |
| block          | ``(dim, **kw)``                                               | x -> x, same shape: a whole residual block   |
| conv           | like ``nn.Conv2d``                                            | like ``nn.Conv2d``                           |
| norm           | ``(num_channels)``                                            | same shape, declared layout                  |
| act            | ``()``                                                        | same shape                                   |
| downsample     | ``(in_chs, out_chs)``                                         | (B, Cin, H, W) -> (B, Cout, H/s, W/s)        |
| stem           | ``(in_chans, out_chs)``                                       | (B, 3, H, W) -> (B, C, H/s, W/s)             |
| head           | ``(in_features, num_classes)``                                | (B, C, H, W) -> (B, num_classes)             |
| neck           | ``(in_channels: Sequence[int], **kw)``; ``out_channels``      | maps (one per level) -> maps, same strides   |
| dense_head     | ``(in_channels, num_classes, strides, **kw)``                 | maps -> raw outputs; ``loss(out, targets)``, |
|                |                                                               | ``predict(out, metas)`` (see below)          |

Dense kinds take and give lists of maps (B, C_i, H/s_i, W/s_i), coarsest last; their ``example_input`` is a
tuple of shapes, one per level. A ``dense_head`` owns its task's loss and prediction (torchvision's FCOS,
detectron2's dense detectors and mmyolo do the same): ``loss(out, targets) -> (total, {part: value})`` with
one target dict per image, and ``predict(out, metas) -> [dict per image]`` in the pixels of each input file
(``metas``: per image ``orig_size`` (H, W) and the letterbox ``scale``/``pad`` the data applied; ``None``:
input pixels).

Strings are for the edges (CLI, YAML, sweeps); inside Python pass classes or partials.
``get`` turns any of the three into a constructor.
"""
from __future__ import annotations

import difflib
import fnmatch
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

KINDS = ('token_mixer', 'channel_mixer', 'sequence_mixer', 'block', 'conv', 'norm', 'act',
         'downsample', 'stem', 'head', 'canon', 'neck', 'dense_head')
LAYOUTS = ('nchw', 'nlc', 'any')


@dataclass(frozen=True)
class LayerRecord:
    """What the registry knows about one block.

    ``example`` holds keyword arguments that build a small instance and ``example_input``
    the shape of a matching input: the enumerated tests build every block from them.
    ``fixed_size`` marks blocks whose weights depend on the spatial grid (they take the
    grid as a constructor argument).
    """
    kind: str
    name: str
    cls: type
    layout: str = 'nchw'
    fixed_size: bool = False
    example: dict = field(default_factory=dict)
    example_input: tuple = ()
    doc: str = ''


_REGISTRY: dict[str, dict[str, LayerRecord]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str | None = None, *, layout: str = 'nchw', fixed_size: bool = False,
             example: dict | None = None, example_input: tuple = ()) -> Callable[[type], type]:
    """Class decorator: ``@register('token_mixer', 'pooling', layout='nchw')``."""
    if kind not in _REGISTRY:
        raise ValueError(f'unknown block kind {kind!r}; expected one of {", ".join(KINDS)}')
    if layout not in LAYOUTS:
        raise ValueError(f'unknown layout {layout!r}; expected one of {LAYOUTS}')

    def deco(cls: type) -> type:
        key = name or cls.__name__.lower()
        if key in _REGISTRY[kind] and _REGISTRY[kind][key].cls is not cls:
            raise ValueError(f'{kind}/{key} is already registered to {_REGISTRY[kind][key].cls.__qualname__}')
        doc = (cls.__doc__ or '').strip().splitlines()
        _REGISTRY[kind][key] = LayerRecord(kind, key, cls, layout, fixed_size, dict(example or {}),
                                           tuple(example_input), doc[0] if doc else '')
        return cls  # unchanged: the record holds the metadata (torch's own classes are registered too)
    return deco


def _check_kind(kind: str) -> None:
    if kind not in _REGISTRY:
        raise ValueError(f'unknown block kind {kind!r}; expected one of {", ".join(KINDS)}')


def get(kind: str, spec: str | type | functools.partial | Callable | None) -> Callable | None:
    """Resolve a block spec to a constructor.

    ``spec`` is a registered name (``'pooling'``), a class, a ``functools.partial`` or any
    callable; ``None`` stays ``None``. A wrong name raises a ``KeyError`` that lists close matches.
    """
    _check_kind(kind)
    if spec is None or not isinstance(spec, str):
        return spec
    key = spec.strip().lower().replace('-', '_')
    if key not in _REGISTRY[kind]:
        names = sorted(_REGISTRY[kind])
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
        hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
        raise KeyError(f'no {kind} block named {spec!r}.{hint} Registered {kind} blocks: {", ".join(names)}')
    return _REGISTRY[kind][key].cls


def record(kind: str, name: str) -> LayerRecord:
    """The registry record of one block (``get`` resolves the same names)."""
    get(kind, name)  # raises the helpful error
    return _REGISTRY[kind][name.strip().lower().replace('-', '_')]


def name_of(kind: str, spec: Any) -> str | None:
    """The registered name of a block spec (for records and the results database)."""
    if spec is None or isinstance(spec, str):
        return spec
    cls = spec.func if isinstance(spec, functools.partial) else spec
    for rec in _REGISTRY[kind].values():
        if rec.cls is cls:
            return rec.name
    return getattr(cls, '__name__', repr(cls))


def layout_of(kind: str, spec: Any, default: str = 'nchw') -> str:
    """The declared layout of a block spec: its record's, else a ``layout`` attribute of an unregistered
    class (user blocks may declare one), else ``default``."""
    cls = get(kind, spec)
    cls = cls.func if isinstance(cls, functools.partial) else cls
    for rec in _REGISTRY[kind].values():
        if rec.cls is cls:
            return rec.layout
    return getattr(cls, 'layout', default)


def list_layers(kind: str | None = None, pattern: str = '*') -> list[str]:
    """Registered block names as ``kind/name`` (or plain names when ``kind`` is given)."""
    if kind is not None:
        _check_kind(kind)
        return sorted(n for n in _REGISTRY[kind] if fnmatch.fnmatch(n, pattern))
    return sorted(f'{k}/{n}' for k, recs in _REGISTRY.items() for n in recs
                  if fnmatch.fnmatch(n, pattern) or fnmatch.fnmatch(f'{k}/{n}', pattern))


def records(kind: str | None = None) -> list[LayerRecord]:
    """Every registry record (of one kind), for enumerated tests and `zoo list --blocks`."""
    kinds = [kind] if kind else list(_REGISTRY)
    return [rec for k in kinds for _, rec in sorted(_REGISTRY[k].items())]
