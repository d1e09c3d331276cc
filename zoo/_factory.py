"""``zoo.create`` and checkpoint loading."""
from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from ._builder import UnknownArgumentError
from ._registry import model_info, unknown_model_error, _MODELS
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
        if name not in _MODELS:
            raise unknown_model_error(name)
        if pretrained:
            raise no_weights_error(name)
        try:
            model = model_info(name).fn(**kwargs)
        except UnknownArgumentError as e:
            raise TypeError(f'{name} got unknown argument(s) {", ".join(e.unknown)}. '
                            f'{name} accepts: {", ".join(e.accepted)}') from None
        model.zoo_name = name
        if checkpoint is not None:  # a family with timm's and the official head: the one the file needs
            model = match_checkpoint_head(model, name, kwargs, checkpoint, model_info(name).fn)
        attach_pretrained_cfg(model, name)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, new_head='num_classes' in kwargs)
    return model


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from disk (safetensors or ``torch.load(weights_only=True)``), unwrapped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f'checkpoint not found: {path} (expected a .pth/.pt/.ckpt/.bin or .safetensors file)')
    if path.suffix == '.safetensors':
        from safetensors.torch import load_file
        sd = load_file(str(path), device='cpu')
    else:
        try:
            sd = torch.load(path, map_location='cpu', weights_only=True)
        except Exception as e:  # pickle errors, truncated files, non-checkpoints
            raise ValueError(f'could not read checkpoint {path}: {type(e).__name__}: {e}. Expected a state dict '
                             f'saved with torch.save or safetensors') from None
    for key in _NESTED_KEYS:
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
            break
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f'{path} does not hold a state dict of tensors')
    for prefix in _PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            meta = getattr(sd, '_metadata', None)  # torch's module list, re-keyed too (MetaFormer.checkpoint_head)
            sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items())
            if meta is not None:
                sd._metadata = OrderedDict(('' if m == prefix[:-1] else m[len(prefix):], d) for m, d in meta.items()
                                           if m == prefix[:-1] or m.startswith(prefix))
    return sd


def load_checkpoint(model: nn.Module, path: str | Path, new_head: bool = False) -> nn.Module:
    """Load ``path`` into ``model``, remapping foreign layouts; list the first mismatches on failure."""
    sd = read_state_dict(path)
    remap = getattr(model, 'remap_checkpoint', None)
    if remap is not None:
        sd = remap(sd)
    own = model.state_dict()
    head = getattr(model, 'classifier_prefix', None)
    if new_head and head:
        dropped = [k for k in sd if k.startswith(head + '.') and k in own and sd[k].shape != own[k].shape]
        for k in dropped:
            del sd[k]
        if dropped:
            warnings.warn(f'{path}: classifier {head} has a different number of classes; left it newly initialised')
    missing = [k for k in own if k not in sd and not (new_head and head and k.startswith(head + '.'))]
    unexpected = [k for k in sd if k not in own]
    shapes = [f'{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}'
              for k in sd if k in own and sd[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        name = getattr(model, 'zoo_name', type(model).__name__)
        lines = [f'checkpoint {path} does not fit {name}:']
        for title, items in (('missing keys', missing), ('unexpected keys', unexpected), ('shape mismatches', shapes)):
            if items:
                more = f' (+{len(items) - 8} more)' if len(items) > 8 else ''
                lines.append(f'  {len(items)} {title}: {", ".join(items[:8])}{more}')
        raise ValueError('\n'.join(lines))
    model.load_state_dict(sd, strict=not new_head)
    return model
