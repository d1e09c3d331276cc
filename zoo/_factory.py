"""``zoo.create`` and checkpoint loading (the one reader and the one loader of the project)."""
from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from ._builder import UnknownArgumentError
from ._registry import model_info
from ._timm_habits import attach_pretrained_cfg, match_checkpoint_head, no_weights_error

# Wrappers that training code puts around a state dict or its keys.
_NESTED_KEYS = ('state_dict_ema', 'model_ema', 'state_dict', 'model', 'module')
_PREFIXES = ('module.', 'model.', '_orig_mod.')


def create(name: str, num_classes: int | None = None, in_chans: int | None = None,
           checkpoint: str | Path | None = None, **overrides) -> nn.Module:
    """Build a registered model (or any timm model as ``'timm/<name>'``).

    ``None`` arguments are dropped, so callers can pass optional settings through unchanged.
    ``checkpoint`` loads a state dict (``.pth``/``.pt``/``.bin`` via ``torch.load(weights_only=True)``,
    or ``.safetensors``) after the family's key remapping (official and timm layouts). When
    ``num_classes`` is given and differs from the checkpoint's classifier, the classifier is left
    freshly initialised (fine-tuning); every other mismatch is an error. ``pretrained=True`` is passed to
    timm for ``'timm/'`` models and is an error for zoo's (no weights ship; use ``checkpoint``). Every zoo
    model gets a timm-style ``pretrained_cfg`` for the input it was built for (``zoo/_timm_habits.py``).
    """
    kwargs = {k: v for k, v in dict(num_classes=num_classes, in_chans=in_chans, **overrides).items()
              if v is not None}
    pretrained = kwargs.pop('pretrained', False)  # timm's habit: passed to timm, an error for zoo models
    if not isinstance(name, str):
        raise TypeError(f'model name must be a string, got {type(name).__name__}')
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
        try:
            model = fn(**kwargs)
        except UnknownArgumentError as e:  # the same error, worded with the registered name
            raise UnknownArgumentError(e.cls, e.unknown, e.accepted, name) from None
        model.zoo_name = name
        if checkpoint is not None:  # a family with timm's and the official head: the one the file needs
            model = match_checkpoint_head(model, name, kwargs, checkpoint, model_info(name).fn)
        attach_pretrained_cfg(model, name)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, new_head='num_classes' in kwargs)
    return model


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


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from disk, unwrapped: safetensors, ``torch.load(weights_only=True)`` of a
    ``.pth``/``.pt``/``.bin``, or the network weights (``model.*``) of a Lightning ``.ckpt`` from ``zoo fit``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'checkpoint not found: {path} (expected a .pth/.pt/.bin or .safetensors state dict, '
                                f'or a zoo fit .ckpt)')
    if path.suffix == '.ckpt':
        return _lightning_weights(path)
    if path.suffix == '.safetensors':
        from safetensors.torch import load_file
        sd = load_file(str(path), device='cpu')
    else:
        try:
            sd = safe_torch_load(path)
        except Exception as e:  # pickle errors, truncated files, non-checkpoints
            raise ValueError(f'could not read checkpoint {path} ({load_failure(e)}); expected a state dict '
                             f'saved with torch.save or safetensors') from None
    for key in _NESTED_KEYS:
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f'{path} does not hold a state dict of tensors')
    for prefix in _PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            sd = _strip_prefix(sd, prefix)
    return sd


def _strip_prefix(sd: dict, prefix: str) -> OrderedDict:
    """The entries under ``prefix``, re-keyed without it; torch's module list (``_metadata``) is re-keyed too
    (``MetaFormer.checkpoint_head`` reads it)."""
    meta = getattr(sd, '_metadata', None)
    out = OrderedDict((k[len(prefix):], v) for k, v in sd.items() if k.startswith(prefix))
    if meta is not None:
        out._metadata = OrderedDict(('' if m == prefix[:-1] else m[len(prefix):], d) for m, d in meta.items()
                                    if m == prefix[:-1] or m.startswith(prefix))
    return out


def _lightning_weights(path: Path) -> dict[str, torch.Tensor]:
    # zoo fit checkpoints hold only plain types beside the tensors, so weights_only=True reads them.
    try:
        ckpt = safe_torch_load(path)
    except Exception as e:
        raise ValueError(f'could not read checkpoint {path} ({load_failure(e)}); expected a .ckpt written by '
                         f'`zoo fit`') from None
    sd = ckpt.get('state_dict') if isinstance(ckpt, dict) else None
    if not isinstance(sd, dict):
        raise ValueError(f'{path} is not a Lightning checkpoint (no state_dict)')
    weights = _strip_prefix(sd, 'model.')
    if not weights:
        raise ValueError(f'{path} holds no model.* weights (was it written by a zoo recipe?)')
    return weights


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


def load_checkpoint(model: nn.Module, path: str | Path | dict, new_head: bool | str = False) -> nn.Module:
    """Load ``path`` (or a state dict) into ``model``, remapping foreign layouts; list the first mismatches
    on failure.

    ``new_head``: ``False`` loads everything; ``True`` leaves the classifier newly initialised when its
    shape differs (``zoo.create(..., num_classes=...)``); ``'always'`` never loads the classifier
    (fine-tuning). Returns the model."""
    if new_head not in (False, True, 'always'):
        raise ValueError(f"new_head must be False, True or 'always'; got {new_head!r}")
    sd = remap_checkpoint(model, path if isinstance(path, dict) else read_state_dict(path))
    where = 'the state dict' if isinstance(path, dict) else path
    own = model.state_dict()
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
    return model
