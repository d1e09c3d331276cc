"""``zoo.create`` and checkpoint loading (the one reader and the one loader of the project)."""
from __future__ import annotations

import pickle
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from ._builder import UnknownArgumentError
from ._hub import FOLDER_PREFIXES
from ._registry import model_info
from ._timm_habits import attach_pretrained_cfg, match_checkpoint_head, no_weights_error

# Wrappers that training code puts around a state dict: the EMA copy's (timm's train.py writes ``state_dict_ema``,
# older timm and DeiT ``model_ema``), then the raw weights'. Prefixes on the keys (and, last, torch.compile's:
# COMPILED_PREFIX).
_EMA_KEYS = ('state_dict_ema', 'model_ema')
_RAW_KEYS = ('state_dict', 'model', 'module')
_PREFIXES = ('module.', 'model.')
# A zoo system (recipes/system.py) keeps the network as ``self.model`` and timm's ModelEmaV3 as ``self.ema``, so a
# ``zoo fit`` checkpoint's state_dict holds ``model.*`` (raw) and, when the run kept an EMA, ``ema.module.*``.
_SYSTEM_PREFIXES = {'ema': 'ema.module.', 'model': 'model.'}
WEIGHTS = ('auto', 'ema', 'model')


def create(name: str, num_classes: int | None = None, in_chans: int | None = None,
           checkpoint: str | Path | None = None, weights: str = 'auto', **overrides) -> nn.Module:
    """Build a registered model (or any timm model as ``'timm/<name>'``, or a published model folder as
    ``'hf-hub:ORG/NAME'`` or ``'local-dir:DIR'``: ``zoo/_hub.py``, docs/sharing.md).

    ``None`` arguments are dropped, so callers can pass optional settings through unchanged.
    ``checkpoint`` loads a state dict (``.pth``/``.pt``/``.bin``, ``.safetensors``, or a file that pickles whole
    models, e.g. an ultralytics ``.pt``: see :func:`read_state_dict`) after the family's key remapping (official
    and timm layouts). When ``num_classes`` is given and differs from the checkpoint's classifier, the classifier
    is left freshly initialised (fine-tuning); every other mismatch is an error. ``weights`` chooses the copy of
    a checkpoint that holds two (a ``zoo fit`` .ckpt with an EMA, timm's ``state_dict_ema``): ``'auto'`` (default)
    the weights that were evaluated, the EMA when there is one, else the raw model; ``'ema'``; ``'model'`` (raw).
    The copy taken is ``model.zoo_weights`` (:func:`read_weights`). ``pretrained=True`` is passed to
    timm for ``'timm/'`` models and is an error for zoo's (no weights ship; use ``checkpoint``). Every zoo
    model gets a timm-style ``pretrained_cfg`` for the input it was built for (``zoo/_timm_habits.py``).
    """
    kwargs = {k: v for k, v in dict(num_classes=num_classes, in_chans=in_chans, **overrides).items()
              if v is not None}
    pretrained = kwargs.pop('pretrained', False)  # timm's habit: passed to timm, an error for zoo models
    check_weights(weights)
    if checkpoint is None and weights != 'auto':
        raise ValueError(f"weights={weights!r} chooses which weights of a checkpoint to load; pass checkpoint= too")
    if not isinstance(name, str):
        raise TypeError(f'model name must be a string, got {type(name).__name__}')
    if name.startswith(FOLDER_PREFIXES):  # a published model folder (zoo publish): its own weights, its own args
        if checkpoint is not None or weights != 'auto' or pretrained:
            raise ValueError(f'{name} carries its own weights (model.safetensors); checkpoint=, weights= and '
                             'pretrained= do not apply')
        from ._hub import create_from_folder
        return create_from_folder(name, **kwargs)
    if name.startswith('timm/'):
        import timm  # lazily: timm's import is heavy
        timm_name = name[len('timm/'):]
        if not timm.is_model(timm_name):
            close = timm.list_models(f'*{timm_name[:6]}*')[:5]
            raise KeyError(f'timm has no model {timm_name!r}' + (f'; close: {", ".join(close)}' if close else ''))
        model = timm.create_model(timm_name, pretrained=pretrained, **kwargs)
    else:
        fn = model_info(name).fn  # KeyError with close matches for an unknown name
        if pretrained:
            raise no_weights_error(name)
        build = dict(kwargs)
        feature_cls, out_indices = _feature_cls(name, build) if 'feature_cls' in build else (None, None)
        try:
            model = fn(**build)
        except UnknownArgumentError as e:  # the same error, worded with the registered name
            raise UnknownArgumentError(e.cls, e.unknown, e.accepted, name) from None
        model.zoo_name = name
        if checkpoint is not None:  # a family with timm's and the official head: the one the file needs
            model = match_checkpoint_head(model, name, build, checkpoint, model_info(name).fn)
        attach_pretrained_cfg(model, name)
        if feature_cls is not None:  # timm's feature wrapper around the whole model, weights loaded first
            if checkpoint is not None:
                load_checkpoint(model, checkpoint, new_head='num_classes' in kwargs, weights=weights)
                checkpoint = None
            loaded = getattr(model, 'zoo_weights', None)
            model = _feature_wrapper(model, name, feature_cls, out_indices)
            if loaded is not None:
                model.zoo_weights = loaded
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, new_head='num_classes' in kwargs, weights=weights)
    # what built it: zoo.create(name, **model.zoo_args) builds the architecture again (zoo bench --db), without the
    # weights a backbone's own checkpoint argument loaded (a run folder that may be gone by then)
    model.zoo_args = _without_checkpoints(kwargs)
    return model


def _without_checkpoints(kwargs: dict) -> dict:
    """``kwargs`` less every nested ``checkpoint`` (``backbone_kwargs={'checkpoint': ...}``): weights, not shape."""
    return {k: _without_checkpoints(v) if isinstance(v, dict) else v for k, v in kwargs.items() if k != 'checkpoint'}


FEATURE_CLS = ('getter', 'hook')


def _feature_cls(name: str, kwargs: dict) -> tuple[str, tuple | None]:
    """timm's ``feature_cls`` with ``features_only=True``: ``'getter'`` wraps the whole model in timm's
    ``FeatureGetterNet`` (its ``forward_intermediates``, the model pruned after the last level taken), ``'hook'``
    in timm's ``FeatureHookNet`` (forward hooks on the ``feature_info`` modules). Takes ``feature_cls``,
    ``features_only`` and ``out_indices`` (levels of the whole model's ``feature_info``, default all) out of
    ``kwargs``: the model itself is built as a classifier."""
    feature_cls = kwargs.pop('feature_cls')
    if not kwargs.pop('features_only', False):
        raise ValueError(f'{name}: feature_cls={feature_cls!r} chooses how features_only=True extracts the features; '
                         f'pass features_only=True with it')
    if feature_cls not in FEATURE_CLS:
        raise ValueError(f"{name}: feature_cls must be 'getter' (timm's FeatureGetterNet, over forward_intermediates) "
                         f"or 'hook' (timm's FeatureHookNet, over forward hooks), got {feature_cls!r}")
    out_indices = kwargs.pop('out_indices', None)
    return feature_cls, None if out_indices is None else tuple(out_indices)


def _feature_wrapper(model: nn.Module, name: str, feature_cls: str, out_indices: tuple | None) -> nn.Module:
    if not hasattr(model, 'forward_intermediates'):
        raise ValueError(f'{name} is not a classifier with feature levels; feature_cls needs one')
    out_indices = tuple(range(len(model.feature_info))) if out_indices is None else out_indices
    if feature_cls == 'hook':
        if not model.stage_modules_give_maps:
            raise ValueError(f"{name}: feature_cls='hook' reads the outputs of the feature_info modules, which are "
                             f"tokens in this family, not maps; feature_cls='getter' gives the maps")
        from timm.models import FeatureHookNet
        wrapped = FeatureHookNet(model, out_indices=out_indices, no_rewrite=True)
    else:
        from ._timm_compat import feature_getter_net
        wrapped = feature_getter_net()(model, out_indices=out_indices)
    wrapped.zoo_name = name
    wrapped.pretrained_cfg = wrapped.default_cfg = dict(model.pretrained_cfg, pool_size=None)
    return wrapped


def load_failure(e: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words. torch's own message advises
    ``weights_only=False``, which would run whatever code the file holds: never for a file we cannot read."""
    text = str(e)
    if isinstance(e, EOFError) or 'EOF' in text:
        return 'the file is empty or cut short'
    if 'WeightsUnpickler error' in text:
        detail = text.split('WeightsUnpickler error:', 1)[1].strip().splitlines()[0].strip()
        return f'not a torch.save file, or it holds objects other than tensors and plain types: {detail}'
    return f'{type(e).__name__}: {text.splitlines()[0][:120] if text else "unreadable"}'


def safe_torch_load(path) -> object:
    """``torch.load(weights_only=True)`` on the CPU: tensors and plain types only, never arbitrary code."""
    with warnings.catch_warnings():  # torch's note on the pickle protocol of a file we may be about to refuse
        warnings.simplefilter('ignore', UserWarning)
        return torch.load(path, map_location='cpu', weights_only=True)


def check_weights(weights: str) -> str:
    """``weights`` if it is one of :data:`WEIGHTS`, else a one-line ``ValueError``."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)} (auto: the EMA copy when the checkpoint has "
                         f"one, else the raw model), got {weights!r}")
    return weights


def read_weights(checkpoint: str | Path | dict, weights: str = 'auto',
                 where: str | None = None) -> tuple[dict[str, torch.Tensor], str]:
    """The one checkpoint reader: the network weights a checkpoint holds, and which copy they are (``'ema'`` or
    ``'model'``).

    ``weights='auto'`` takes the weights that were evaluated: the EMA copy when the run kept one (a zoo system
    validates, tests and predicts with ``eval_model``, its EMA; timm's ``validate.py`` and ultralytics evaluate the
    EMA too), else the raw model. ``'ema'`` or ``'model'`` asks for one copy; ``'ema'`` of a checkpoint without an
    EMA copy is an error. ``zoo.create(checkpoint=)``, ``zoo.load_checkpoint``, ``zoo export`` and the systems'
    ``checkpoint`` argument all read through here.

    ``checkpoint``: a file, or a checkpoint already loaded (a dict). Files: a Lightning ``.ckpt`` of ``zoo fit``
    (``model.*`` and, with an EMA, ``ema.module.*``), a ``.pth``/``.pt``/``.bin`` read with
    ``torch.load(weights_only=True)`` (a bare state dict, or one wrapped in ``state_dict_ema``/``model_ema``/
    ``state_dict``/``model``/``module``), ``.safetensors``, or a ``torch.save`` file that ``weights_only=True``
    refuses because it pickles objects (an ultralytics ``.pt`` holds the whole ``DetectionModel`` under ``'ema'``
    and ``'model'``; a DeiT-style training checkpoint its ``argparse`` namespace), read by
    :func:`read_pickled_objects`, which executes nothing from the file. A bare state dict is ``'model'``: nothing
    says it is an average. ``where``: how errors name a loaded checkpoint (its file, say).
    """
    check_weights(weights)
    where = where or ('the checkpoint' if isinstance(checkpoint, dict) else str(checkpoint))
    if isinstance(checkpoint, dict):
        obj, lightning = checkpoint, _is_lightning(checkpoint)
    else:
        obj, lightning = _read_file(Path(checkpoint))
    if lightning:
        sd, chosen = _system_weights(obj, where, weights)
    else:
        sd, chosen = _wrapped_weights(obj, where, weights)
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f'{where} does not hold a state dict of tensors')
    from zoo.layers._torch_compat import COMPILED_PREFIX

    for prefix in (*_PREFIXES, COMPILED_PREFIX):
        if sd and all(k.startswith(prefix) for k in sd):
            sd = _strip_prefix(sd, prefix)
    return sd, chosen


def read_state_dict(path: str | Path, weights: str = 'auto') -> dict[str, torch.Tensor]:
    """The state dict :func:`read_weights` reads from ``path`` (the evaluated weights by default), unwrapped."""
    return read_weights(path, weights)[0]


def _is_lightning(obj) -> bool:
    """A zoo system's Lightning checkpoint: a ``state_dict`` of the system (``model.*``, ``ema.module.*``), not
    timm's training checkpoint (``state_dict`` beside ``state_dict_ema``)."""
    sd = obj.get('state_dict') if isinstance(obj, dict) else None
    return (isinstance(sd, dict) and not any(k in obj for k in _EMA_KEYS)
            and ('pytorch-lightning_version' in obj or any(k.startswith(tuple(_SYSTEM_PREFIXES.values())) for k in sd)))


def _read_file(path: Path) -> tuple[object, bool]:
    """What a checkpoint file holds, and whether it is a Lightning checkpoint."""
    if not path.is_file():
        raise FileNotFoundError(f'checkpoint not found: {path} (expected a .pth/.pt/.bin or .safetensors state dict, '
                                f'or a zoo fit .ckpt)')
    if path.suffix == '.ckpt':
        # zoo fit checkpoints hold only plain types beside the tensors, so weights_only=True reads them.
        try:
            ckpt = safe_torch_load(path)
        except Exception as e:
            raise ValueError(f'could not read checkpoint {path} ({load_failure(e)}); expected a .ckpt written by '
                             f'`zoo fit`') from None
        if not isinstance(ckpt, dict) or not isinstance(ckpt.get('state_dict'), dict):
            raise ValueError(f'{path} is not a Lightning checkpoint (no state_dict)')
        return ckpt, True
    if path.suffix == '.safetensors':
        from safetensors.torch import load_file
        return load_file(str(path), device='cpu'), False
    try:
        obj = safe_torch_load(path)
    except Exception as e:  # pickle errors, truncated files, non-checkpoints
        try:
            obj = read_pickled_objects(path)
        except Exception:
            raise ValueError(f'could not read checkpoint {path} ({load_failure(e)}); expected a state dict '
                             f'saved with torch.save or safetensors') from None
    return obj, _is_lightning(obj)


def _no_ema(where: str) -> ValueError:
    return ValueError(f"weights='ema' but {where} holds no EMA copy (the run kept none); use weights='model' or "
                      f"'auto'")


def _system_weights(ckpt: dict, where: str, weights: str) -> tuple[dict, str]:
    """The ``model.*`` or ``ema.module.*`` weights of a zoo system's Lightning checkpoint."""
    sd = ckpt['state_dict']
    has_ema = any(k.startswith(_SYSTEM_PREFIXES['ema']) for k in sd)
    if weights == 'ema' and not has_ema:
        raise _no_ema(where)
    chosen = 'ema' if has_ema and weights != 'model' else 'model'
    out = _strip_prefix(sd, _SYSTEM_PREFIXES[chosen])
    if not out:
        raise ValueError(f'{where} holds no model.* weights (was it written by a zoo recipe?)')
    return out, chosen


def _wrapped_weights(obj, where: str, weights: str) -> tuple[object, str]:
    """The EMA or raw state dict of a training checkpoint (timm's, DeiT's, ultralytics' pickled modules), or a bare
    state dict (``'model'``)."""
    if isinstance(obj, dict):
        ema = next((obj[k] for k in (*_EMA_KEYS, 'ema') if _is_weights(obj.get(k))), None)
        raw = next((obj[k] for k in _RAW_KEYS if _is_weights(obj.get(k))), None)
        if weights == 'ema' and ema is None:
            raise _no_ema(where)
        if ema is not None and weights != 'model':
            obj, chosen = ema, 'ema'
        else:
            obj, chosen = (raw, 'model') if raw is not None else (obj, 'model')
    elif weights == 'ema':
        raise _no_ema(where)
    else:
        chosen = 'model'
    return (pickled_module_state_dict(obj) if _is_module(obj) else obj), chosen


def _is_weights(obj) -> bool:
    """A state dict or a pickled module (ultralytics keeps its ``'ema'`` and ``'model'`` as whole modules)."""
    return isinstance(obj, dict) or _is_module(obj)


# -- files that pickle whole models (ultralytics' released .pt), read without their code ----------------------

_STORAGE_DTYPES = {'FloatStorage': torch.float32, 'HalfStorage': torch.float16, 'BFloat16Storage': torch.bfloat16,
                   'DoubleStorage': torch.float64, 'LongStorage': torch.int64, 'IntStorage': torch.int32,
                   'ShortStorage': torch.int16, 'CharStorage': torch.int8, 'ByteStorage': torch.uint8,
                   'BoolStorage': torch.bool, 'UntypedStorage': torch.uint8}


class PickledObject:
    """An object of a class the reader does not import (``torch.nn`` modules included): the arguments the file
    constructs it with (``pickled_args``) and its pickled state (its ``__dict__``, or ``state``), as plain data."""

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj.__dict__['pickled_args'] = args
        return obj

    def __init__(self, *args, **kwargs):  # called when the file "calls" the class (REDUCE): nothing to do
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            state = {**(state[0] or {}), **(state[1] or {})}  # (__dict__, __slots__ state)
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__['state'] = state

    def __repr__(self):
        return f'<pickled {type(self).__module__}.{type(self).__qualname__}>'


class _StorageType:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return storage.as_strided(size, stride, offset)  # a view of the flat storage (bounds checked by torch)


def _rebuild_parameter(data, requires_grad=False, hooks=None, state=None):
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` of a ``torch.save`` zip. Every global the stream names goes through
    ``find_class``: a short list of tensor-rebuilding and plain-data names maps to functions of this module,
    everything else to an inert :class:`PickledObject` subclass of that name. So no code of the file's classes
    is imported or run, whatever the stream asks for; storages come from the zip's records."""

    _SAFE = {('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
             ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
             ('torch._utils', '_rebuild_parameter_with_state'): _rebuild_parameter,
             ('collections', 'OrderedDict'): OrderedDict, ('torch', 'Size'): torch.Size,
             ('builtins', 'set'): set, ('builtins', 'frozenset'): frozenset,
             ('_codecs', 'encode'): lambda text, encoding='latin1': text.encode('latin1')}  # protocol-2 bytes

    def __init__(self, file, records: zipfile.ZipFile, root: str):
        super().__init__(file)
        self.records, self.root, self.stand_ins = records, root, {}

    def find_class(self, module: str, name: str):
        module = {'__builtin__': 'builtins', 'copy_reg': 'copyreg'}.get(module, module)  # protocol 2's names
        if (module, name) in self._SAFE:
            return self._SAFE[module, name]
        if module == 'torch' and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if module == 'torch' and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        key = (module, name)
        if key not in self.stand_ins:
            self.stand_ins[key] = type(name.rpartition('.')[2] or 'Object', (PickledObject,),
                                       {'__module__': module, '__qualname__': name})
        return self.stand_ins[key]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
                and isinstance(pid[1], _StorageType) and str(pid[2]).isalnum()):
            raise pickle.UnpicklingError(f'unsupported persistent id {pid!r:.80}')
        _, kind, key, _, numel = pid
        raw = self.records.read(f'{self.root}data/{key}')
        if len(raw) != numel * kind.dtype.itemsize:
            raise pickle.UnpicklingError(f'storage {key}: {len(raw)} bytes for {numel} x {kind.dtype}')
        return torch.frombuffer(bytearray(raw), dtype=kind.dtype) if raw else torch.empty(0, dtype=kind.dtype)


def read_pickled_objects(path: str | Path):
    """The object a ``torch.save`` (zip) file pickles, read without importing or running any of its classes:
    tensors rebuilt from their storages, plain containers kept, every other object (modules included) a
    :class:`PickledObject` holding its state. For files ``torch.load(weights_only=True)`` refuses."""
    with zipfile.ZipFile(path) as records:
        names = records.namelist()
        pkl = [n for n in names if n == 'data.pkl' or n.endswith('/data.pkl') and n.count('/') == 1]
        if len(pkl) != 1 or any(n.endswith('/constants.pkl') for n in names):  # TorchScript archives hold code
            raise ValueError(f'{path} is not a torch.save archive')
        root = pkl[0][:-len('data.pkl')]
        if f'{root}byteorder' in names and records.read(f'{root}byteorder').strip() != b'little':
            raise ValueError(f'{path}: big-endian storages are not supported')
        with records.open(pkl[0]) as f:
            return _RestrictedUnpickler(f, records, root).load()


def _is_module(obj) -> bool:
    state = getattr(obj, '__dict__', {}) if isinstance(obj, PickledObject) else {}
    return isinstance(state.get('_modules'), dict) and isinstance(state.get('_parameters'), dict)


def pickled_module_state_dict(module: PickledObject) -> OrderedDict:
    """``nn.Module.state_dict()`` of a pickled module: its and its children's parameters and persistent
    buffers, under the same dotted names."""
    out = OrderedDict()

    def visit(m, prefix):
        state = m.__dict__
        skip = state.get('_non_persistent_buffers_set') or set()
        skip = skip if isinstance(skip, (set, frozenset)) else set()
        for name, t in [*state['_parameters'].items(), *((n, b) for n, b in state.get('_buffers', {}).items()
                                                          if n not in skip)]:
            if t is not None:
                if not isinstance(t, torch.Tensor):
                    raise ValueError(f'{prefix}{name} is a {type(t).__name__}, not a tensor')
                out[prefix + name] = t
        for name, child in state['_modules'].items():
            if _is_module(child):
                visit(child, f'{prefix}{name}.')
    visit(module, '')
    return out


def _strip_prefix(sd: dict, prefix: str) -> OrderedDict:
    """The entries under ``prefix``, re-keyed without it; torch's module list (``_metadata``) is re-keyed too
    (``MetaFormer.checkpoint_head`` reads it)."""
    from zoo.layers._torch_compat import set_state_dict_metadata, state_dict_metadata

    meta = state_dict_metadata(sd)
    out = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
    if meta is not None:
        set_state_dict_metadata(out, OrderedDict(('' if m == prefix[:-1] else m[len(prefix):], d)
                                                 for m, d in meta.items() if m == prefix[:-1] or m.startswith(prefix)))
    return out


def create_with_optional(name: str, optional: dict, **kwargs) -> nn.Module:
    """``create(name, **optional, **kwargs)``, leaving out the ``optional`` arguments the model does not take
    (a size the data knows, passed only to models whose weights depend on it). The argument check runs
    before anything is built, so a refused argument costs nothing."""
    optional = {k: v for k, v in optional.items() if v is not None and k not in kwargs}
    try:
        return create(name, **optional, **kwargs)
    except UnknownArgumentError as e:
        if not optional or not set(e.unknown) <= set(optional):
            raise
        return create(name, **{k: v for k, v in optional.items() if k not in e.unknown}, **kwargs)


def classifier_prefix(model: nn.Module) -> tuple[str, ...]:
    """The module paths of a model's classifier(s): zoo's ``classifier_prefix``, timm's ``pretrained_cfg``.

    A tuple, as in timm's ``pretrained_cfg['classifier']``: multi-head models (PIIP's one head per branch,
    timm's distilled ViTs) name several; a model that names none gives ``()``."""
    prefix = getattr(model, 'classifier_prefix', None)  # zoo.ClassifierBase declares it; timm models do not
    prefix = prefix or (getattr(model, 'pretrained_cfg', None) or {}).get('classifier')
    return (prefix,) if isinstance(prefix, str) else tuple(prefix or ())


def remap_checkpoint(model: nn.Module, state_dict: dict) -> dict:
    """``state_dict`` in the model's own key layout (zoo families map official and timm layouts)."""
    remap = getattr(model, 'remap_checkpoint', None)  # timm models and non-classifiers have none
    return remap(state_dict) if remap is not None else dict(state_dict)


def load_checkpoint(model: nn.Module, path: str | Path | dict, new_head: bool | str = False,
                    weights: str = 'auto') -> nn.Module:
    """Load ``path`` (or a state dict) into ``model``, remapping foreign layouts; list the first mismatches
    on failure.

    ``new_head``: ``False`` loads everything; ``True`` leaves the classifier newly initialised when its
    shape differs (``zoo.create(..., num_classes=...)``); ``'always'`` never loads the classifier
    (fine-tuning). ``weights``: which copy of a checkpoint that holds two (``'auto'``: the EMA when there is
    one, the weights that were evaluated; ``'ema'``; ``'model'``: the raw ones), see :func:`read_weights`; the
    copy taken is recorded as ``model.zoo_weights``. Returns the model."""
    if new_head not in (False, True, 'always'):
        raise ValueError(f"new_head must be False, True or 'always'; got {new_head!r}")
    check_weights(weights)
    if isinstance(path, dict) and not _is_lightning(path):  # a state dict (another model's, say): as it is
        if weights != 'auto':
            raise ValueError(f"weights={weights!r} chooses a copy in a checkpoint; a state dict has only one "
                             f"(pass weights='auto')")
        sd, chosen = path, None
    else:
        sd, chosen = read_weights(path, weights)
    sd = remap_checkpoint(model, sd)
    where = 'the state dict' if isinstance(path, dict) else path
    own = model.state_dict()
    if getattr(model, 'features_only', False):
        # a dense backbone has no head: a classification checkpoint's classifier, pre-logits and final norm are
        # modules it does not have (timm loads features_only models non-strictly); a module it has must match
        tops = {k.split('.')[0] for k in own}
        sd = {k: v for k, v in sd.items() if k.split('.')[0] in tops}
    head = classifier_prefix(model)
    if new_head == 'always' and not head:
        raise ValueError(f'{type(model).__name__} does not name its classifier (classifier_prefix); cannot fine-tune')
    in_head = tuple(h + '.' for h in head)
    if new_head and head:
        dropped = [k for k in sd if k.startswith(in_head) and (new_head == 'always' or (
            k in own and sd[k].shape != own[k].shape))]
        for k in dropped:
            del sd[k]
        if dropped and new_head is True:
            warnings.warn(f'{where}: classifier {", ".join(head)} has a different number of classes; left it newly '
                          f'initialised')
    missing = [k for k in own if k not in sd and not (new_head and head and k.startswith(in_head))]
    unexpected = [k for k in sd if k not in own]
    shapes = [f'{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}'
              for k in sd if k in own and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        name = getattr(model, 'zoo_name', type(model).__name__)
        lines = [f'checkpoint {where} does not fit {name}:']
        for title, items in (('missing keys', missing), ('unexpected keys', unexpected), ('shape mismatches', shapes)):
            if items:
                more = f' (+{len(items) - 8} more)' if len(items) > 8 else ''
                lines.append(f'  {len(items)} {title}: {", ".join(items[:8])}{more}')
        raise ValueError('\n'.join(lines))
    model.load_state_dict(sd, strict=not new_head)
    if chosen is not None:
        model.zoo_weights = chosen
    return model
