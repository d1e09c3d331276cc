"""What people coming from timm expect of a model: ``pretrained_cfg``, ``pretrained=``, matching heads.

``zoo.create`` calls these for every registered model, so no family repeats them:

- ``attach_pretrained_cfg``: a timm-style ``pretrained_cfg`` (and its ``default_cfg`` alias) describing the
  input the model was BUILT for, so ``timm.data.resolve_model_data_config(model)`` and
  ``timm.data.create_transform`` give the right size (e.g. 32x32 for a ``_tiny`` variant, or the
  ``img_size=`` / ``in_chans=`` it was built with), not timm's 224 default.
- ``no_weights_error``: zoo ships no weights, so ``pretrained=True`` on a zoo model is a clear error.
- ``match_checkpoint_head``: families whose timm port and official code differ only in the classifier head
  (PoolFormer: timm pools then LayerNorms, the official head GroupNorms then pools; same keys, same shapes)
  pick the head the checkpoint was trained with, or warn where the file cannot tell.

Model fields (timm's names): ``fixed_input_size`` and ``min_input_size`` as the model declares them (TNT and
Strip-MLP take only their built size; PIIP's classifier its one size, its detection pyramid any multiple of what
its branches need), ``first_conv`` and ``classifier`` (module paths), ``pool_size`` (``forward_features``' grid at
``input_size``; ``None`` for token features and ``features_only`` models).

Image fields: ``mean``/``std`` are timm's ImageNet defaults unless the family declares its own in a class
attribute ``data_cfg`` (TNT: 0.5/0.5 as its timm and official configs); channels other than 3 get the
3-channel average. ``crop_pct`` is 0.875 (timm's default) for models built for 224-class inputs and 1.0 for
small inputs (<= 64 pixels: CIFAR-style images are not centre-cropped). Detectors and denoisers take
[0, 1] images (``mean`` 0, ``std`` 1, no crop), as ``zoo.datasets`` feeds them.

Language models get a cfg without image fields: ``input_size`` is ``(context,)`` (the registry's token
length, what ``(B, T)`` examples use), ``num_classes`` and ``vocab_size`` are the vocabulary. timm's
resolvers accept it, but its transforms do not apply to token ids.
"""
from __future__ import annotations

import warnings

from torch import nn

from . import tasks
from ._registry import model_info

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875  # timm's DEFAULT_CROP_PCT
SMALL_INPUT = 64          # at or below this side, images are used whole (crop_pct 1.0)


def _per_channel(values: tuple, c: int) -> tuple:
    return tuple(values) if len(values) == c else (round(sum(values) / len(values), 4),) * c


def pretrained_cfg(model: nn.Module, name: str) -> dict:
    """A timm-style ``pretrained_cfg`` for a registered model (see the module docstring for the choices)."""
    info = model_info(name)
    cfg = dict(architecture=name, hf_hub_id=None, url='', tag=None, task=info.task)
    if tasks.get(info.task).takes_tokens:
        vocab = getattr(model, 'vocab_size', None)
        cfg.update(input_size=tuple(info.input_size), num_classes=vocab, vocab_size=vocab)
        return cfg
    # the input the model was built for: the task's input spec applied to the registry's size and the model
    c, h, w = tasks.get(info.task).shape(tuple(info.input_size), model)
    family = dict(getattr(type(model), 'data_cfg', {}))
    pixels = tasks.get(info.task).pixels   # how the task's data feeds images (its Task says; no name branches)
    if pixels == 'imagenet_crop':          # classification: timm's defaults, the family may declare its own
        mean, std = family.pop('mean', IMAGENET_MEAN), family.pop('std', IMAGENET_STD)
        crop = family.pop('crop_pct', DEFAULT_CROP_PCT)
        crop = crop if max(h, w) > SMALL_INPUT else 1.0
        interpolation = family.pop('interpolation', 'bicubic')
    elif pixels == 'imagenet':  # whole images normalised as ImageNet backbones expect (segmentation: mmseg, the data)
        mean, std, crop, interpolation = IMAGENET_MEAN, IMAGENET_STD, 1.0, 'bilinear'
    else:  # 'unit' (detection, denoising): [0, 1] images, used whole
        mean, std, crop, interpolation = (0.0,) * c, (1.0,) * c, 1.0, 'bilinear'
    fixed = getattr(model, 'fixed_input_size', None)  # a classifier says what it is; others: the registry
    cfg.update(input_size=(c, h, w), fixed_input_size=bool('fixed_size' in info.capabilities if fixed is None else fixed),
               interpolation=interpolation, crop_pct=crop, crop_mode='center',
               mean=_per_channel(mean, c), std=_per_channel(std, c),
               num_classes=getattr(model, 'num_classes', 0))
    if getattr(model, 'min_input_size', None) is not None:
        cfg['min_input_size'] = tuple(model.min_input_size)
    if getattr(model, 'first_conv', None):
        cfg['first_conv'] = model.first_conv
    if getattr(model, 'classifier_prefix', None):
        cfg['classifier'] = model.classifier_prefix  # timm's name for it
    if hasattr(model, 'unpooled_size'):  # timm's pool_size: forward_features' grid at input_size (None: tokens)
        cfg['pool_size'] = None if getattr(model, 'features_only', False) else model.unpooled_size(h, w)
    cfg.update(family)
    return cfg


def attach_pretrained_cfg(model: nn.Module, name: str) -> nn.Module:
    """Set ``model.pretrained_cfg`` and its alias ``model.default_cfg`` (the same dict, as in timm)."""
    model.pretrained_cfg = model.default_cfg = pretrained_cfg(model, name)
    return model


def no_weights_error(name: str) -> ValueError:
    """``pretrained=True`` on a zoo model: zoo ships no weights; say what to do instead."""
    timm_eq = model_info(name).timm_equivalent
    alt = f", or timm's weights with zoo.create('timm/{timm_eq[0]}', pretrained=True)" if timm_eq else ''
    return ValueError(f'zoo ships no pretrained weights for {name}: pass checkpoint="path/to/weights.pth" '
                      f'(official and timm layouts are remapped){alt}')


def match_checkpoint_head(model: nn.Module, name: str, kwargs: dict, path, build) -> nn.Module:
    """For families with a timm head and an official head (``checkpoint_head_arg``, e.g. ``'timm_head'``):
    return a model whose head matches the checkpoint at ``path``.

    The family's ``checkpoint_head(state_dict)`` says which head the file was trained with (``True``
    timm's, ``False`` the official one, ``None`` unknown). Not chosen by the caller: the model is rebuilt
    with the matching head (``build(**kwargs)``). Chosen by the caller and contradicted by the file, or
    unknown and not chosen: a warning, because the other head computes a different function with the same
    keys and shapes, which would load silently.
    """
    arg = getattr(model, 'checkpoint_head_arg', None)
    if arg is None or getattr(model, 'features_only', False):
        return model
    from ._factory import read_state_dict  # the one checkpoint reader
    wanted = model.checkpoint_head(read_state_dict(path))
    built = getattr(model, arg)
    if wanted is None:
        if arg not in kwargs:
            warnings.warn(f'{path}: cannot tell whether this {name} checkpoint was trained with timm\'s head '
                          f'(pool -> LayerNorm) or the official one (norm -> pool); they load alike but compute '
                          f'different logits. Built with {arg}={built}; pass {arg}=True for weights from timm, '
                          f'{arg}=False for official or zoo weights, to choose (and silence this).', stacklevel=3)
        return model
    if wanted == built:
        return model
    if arg in kwargs:
        warnings.warn(f"{path}: this checkpoint was trained with {'timm' if wanted else 'the official'} head "
                      f'but {name} was built with {arg}={built}: its logits will differ from the original '
                      f"model's. Drop {arg}= to let zoo.create pick the head.", stacklevel=3)
        return model
    rebuilt = build(**{**kwargs, arg: wanted})
    rebuilt.zoo_name = name
    return rebuilt
