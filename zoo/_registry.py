"""The model registry: ``@register_model`` on a function whose name is the model name (timm's way).

Metadata lives here, never in test lists: family, task (``zoo.tasks``), paper, official repository, default
input size, published numbers and the name of the tiny CPU variant.
"""
from __future__ import annotations

import difflib
import fnmatch
import importlib
import re
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import tasks as _tasks


@dataclass(frozen=True)
class ReleasedWeights:
    """One checkpoint file the model's authors (or timm) released and ``zoo.create(name, checkpoint=file)`` loads
    (through the family's ``remap_checkpoint``). ``sha256`` only where a source states it: never computed from a
    download we did not make, never guessed (``zoo weights NAME`` prints "hash unknown" without one)."""
    url: str
    sha256: str | None = None
    source: str = ''                 # where the URL is stated (the official README, timm's default_cfgs, ...)
    note: str = ''


@dataclass(frozen=True)
class ModelInfo:
    name: str
    family: str
    task: str = 'classification'
    paper: str = ''
    repo: str = ''
    input_size: tuple = (3, 224, 224)
    params: int | None = None        # published trainable parameters, exact where the paper's code gives it
    macs: int | None = None          # published multiply-adds at input_size (fvcore-style: 1 MAC = 1 multiply-add)
    top1: float | None = None        # published ImageNet-1k top-1 (%)
    coco_ap: float | None = None     # published COCO val2017 box AP@[.5:.95] (%), for detectors
    ade20k_miou: float | None = None  # published ADE20K val mIoU (%, single scale), for segmenters
    capabilities: tuple = ()         # e.g. ('features', 'timm_weights', 'official_weights')
    tiny: str | None = None          # name of the tiny CPU variant of the same family
    is_tiny: bool = False
    # (timm model name, zoo.create overrides) that make this model compute exactly what timm's does,
    # so timm's weights load and reproduce timm's outputs (used by `zoo bench --vs` and the tests).
    timm_equivalent: tuple | None = None
    weights: tuple = ()              # ReleasedWeights of the files zoo loads (`zoo weights NAME`)
    fn: Callable | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop('fn')
        return d


_MODELS: dict[str, ModelInfo] = {}

# The family modules of zoo/, one per family (a new family adds its module here). They register their
# models when imported; the registry imports them on first use, so ``import zoo`` stays light.
FAMILY_MODULES = ('metaformer', 'tnt', 'raftmlp', 'stripmlp', 'resnet', 'vgg', 'dncnn', 'lm', 'piip', 'detection', 'mamba_yolo',
                  'segmentation')
_loaded = False


def _load_families() -> None:
    global _loaded
    if not _loaded:
        _loaded = True  # first: a family module that reads the registry while importing does not recurse
        try:
            for module in FAMILY_MODULES:
                importlib.import_module(f'{__package__}.{module}')
        except BaseException:
            _loaded = False
            raise


def register_model(fn: Callable | None = None, /, *, family: str, task: str = 'classification', **meta):
    """Register a model entrypoint: ``@register_model(family='poolformer', params=11_915_176, ...)``."""
    _tasks.get(task)  # an unknown task: a one-line error with the close names (zoo.tasks.register_task adds one)

    def deco(f: Callable) -> Callable:
        name = f.__name__
        if name in _MODELS:
            raise ValueError(f'model {name!r} is registered twice')
        if 'input_size' in meta:
            meta['input_size'] = tuple(meta['input_size'])
        meta['capabilities'] = tuple(meta.get('capabilities', ()))
        meta['weights'] = tuple(meta.get('weights', ()))
        _MODELS[name] = ModelInfo(name=name, family=family, task=task, is_tiny=name.endswith('_tiny'), fn=f,
                                  **meta)
        return f
    return deco(fn) if fn is not None else deco


def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r'(\d+)', s)]


def list_models(pattern: str = '*', family: str | None = None, task: str | None = None,
                tiny: bool | None = None) -> list[str]:
    """Registered model names matching a glob pattern, naturally sorted (s12 before s24 before s108)."""
    _load_families()
    names = [n for n, info in _MODELS.items()
             if fnmatch.fnmatch(n, pattern)
             and (family is None or info.family == family)
             and (task is None or info.task == task)
             and (tiny is None or info.is_tiny == tiny)]
    return sorted(names, key=_natural_key)


def unknown_model_error(name: str) -> KeyError:
    _load_families()
    close = difflib.get_close_matches(name, list(_MODELS), n=4, cutoff=0.5)
    hint = f' Did you mean {", ".join(map(repr, close))}?' if close else ''
    return KeyError(f'no model named {name!r}.{hint} `zoo.list_models()` lists the {len(_MODELS)} registered '
                    f'models; prefix a timm name with "timm/" to build one of timm\'s.')


def model_info(name: str) -> ModelInfo:
    """The registry record of a model."""
    _load_families()
    if name not in _MODELS:
        raise unknown_model_error(name)
    return _MODELS[name]


def families() -> list[str]:
    _load_families()
    return sorted({info.family for info in _MODELS.values()})
