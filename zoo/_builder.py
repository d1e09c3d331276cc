"""Helpers every family uses: argument checking, input checking and the feature-map contract."""
from __future__ import annotations

import inspect
import numbers
import re
from dataclasses import dataclass

import torch
from torch import nn


class UnknownArgumentError(TypeError):
    """An override the model's constructor does not take (re-raised by ``zoo.create`` with the model name)."""

    def __init__(self, cls: type, unknown: list[str], accepted: list[str], name: str | None = None):
        self.cls, self.unknown, self.accepted = cls, unknown, accepted
        if name is None:
            super().__init__(f'{cls.__name__} got unknown argument(s) {", ".join(unknown)}; '
                             f'accepted: {", ".join(accepted)}')
        else:
            super().__init__(f'{name} got unknown argument(s) {", ".join(unknown)}. {name} accepts: '
                             f'{", ".join(accepted)}')


def accepted_args(cls) -> list[str]:
    """The keyword arguments a model class (its ``__init__``) or builder function takes."""
    params = inspect.signature(cls.__init__ if isinstance(cls, type) else cls).parameters
    return [n for n, p in params.items() if n != 'self' and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_num_classes(num_classes) -> int:
    """``num_classes`` must be a whole number >= 0; 0 means "no classifier head" (timm's convention)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
        raise TypeError(f'num_classes must be an int >= 0 (0 = no classifier head), got '
                        f'{type(num_classes).__name__} {num_classes!r}')
    if num_classes < 0:
        raise ValueError(f'num_classes must be >= 0 (0 = no classifier head), got {num_classes}')
    return num_classes


_SIZES = ('in_chans', 'vocab_size', 'img_size', 'embed_dim', 'depth', 'num_heads')


def check_no_numeric_strings(cls: type, overrides: dict) -> None:
    """``in_chans='3'`` (a number as text, e.g. quoted in YAML) would fail deep in torch with a message about
    something else: say which argument wanted a number. Checked for the well-known size arguments and for
    every argument the constructor annotates as int or float."""
    params = inspect.signature(cls.__init__).parameters
    for name, value in overrides.items():
        if not isinstance(value, str):
            continue
        hint = str(params[name].annotation) if name in params else ''
        wants = ('int' if name in _SIZES or re.fullmatch(r"(<class ')?int('>)?( \| None)?|Optional\[int\]", hint)
                 else 'float' if re.fullmatch(r"(<class ')?float('>)?( \| None)?|Optional\[float\]", hint) else None)
        if wants:
            raise TypeError(f'{cls.__name__}: {name} must be {"an" if wants == "int" else "a"} {wants}, '
                            f'got str {value!r}')


def build_model(cls, cfg: dict, overrides: dict):
    """``cls(**{**cfg, **overrides})`` after checking that every override is an argument of ``cls`` (a model class
    or a builder function).

    Every registered family is built here, so argument checks common to all of them live here too."""
    accepted = accepted_args(cls)
    unknown = sorted(k for k in overrides if k not in accepted)
    if unknown:
        raise UnknownArgumentError(cls, unknown, accepted)
    args = {**cfg, **overrides}
    if 'num_classes' in args:
        check_num_classes(args['num_classes'])
    check_no_numeric_strings(cls, overrides)
    model = cls(**args)
    if args.get('num_classes') == 0 and not getattr(model, 'features_only', False) \
            and hasattr(model, 'reset_classifier'):
        model.reset_classifier(0)  # the same "no head" everywhere, also where a family would build Linear(d, 0)
    return model


def check_image(x: torch.Tensor, in_chans: int, min_size: int, model: str,
                fixed_size: tuple[int, int] | None = None, size_arg=None) -> None:
    """Raise a clear error for an input the model cannot take, before torch does so deep inside.
    ``size_arg(h, w)``: the constructor argument that builds the model for an ``h`` x ``w`` input, as text
    (default ``img_size=h``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{model} expects a tensor of shape (B, {in_chans}, H, W), got {type(x).__name__}')
    if x.ndim != 4:
        raise ValueError(f'{model} expects a 4-d image batch (B, {in_chans}, H, W), got shape {tuple(x.shape)}')
    if x.shape[1] != in_chans:
        raise ValueError(f'{model} was built for in_chans={in_chans} but the input has {x.shape[1]} channels '
                         f'(shape {tuple(x.shape)}); build it with zoo.create(..., in_chans={x.shape[1]})')
    h, w = x.shape[-2:]
    if fixed_size is not None and (h, w) != tuple(fixed_size):
        raise ValueError(f'{model} was built for {fixed_size[0]}x{fixed_size[1]} inputs (its weights depend on '
                         f'the size) but got {h}x{w}; build it with {size_arg(h, w) if size_arg else f"img_size={h}"} '
                         f'or resize the input')
    if min(h, w) < min_size:
        raise ValueError(f'{model} needs inputs of at least {min_size}x{min_size}, got {h}x{w}')


@dataclass(frozen=True)
class FeatureInfo:
    """One multi-scale output: its channels, its stride from the input and the module that makes it."""
    num_chs: int
    reduction: int
    module: str

    def __getitem__(self, key):  # timm-style dict access: info['num_chs']
        return getattr(self, key)


def collect_features(x: torch.Tensor, stages, keep) -> list[torch.Tensor]:
    """Run ``stages`` in order on ``x`` and return the outputs of the stages whose index is in ``keep``."""
    feats = []
    for i, stage in enumerate(stages):
        x = stage(x)
        if i in keep:
            feats.append(x)
    return feats


def select_features(feature_info: list[FeatureInfo], out_indices) -> tuple[tuple[int, ...], list[FeatureInfo]]:
    n = len(feature_info)
    idx = tuple(i % n for i in out_indices) if out_indices is not None else tuple(range(n))
    if any(not -n <= i < n for i in (out_indices or ())):
        raise ValueError(f'out_indices {tuple(out_indices)} out of range for {n} feature levels')
    return idx, [feature_info[i] for i in idx]


class ClassifierBase(nn.Module):
    """timm's classification contract, declared once for every family: ``forward`` returns the multi-scale
    maps when built with ``features_only`` and logits otherwise; ``reset_classifier`` swaps the linear
    head named ``head_attr`` (on the model's device and dtype). Subclasses define ``forward_features``,
    ``forward_intermediates``, ``forward_head``, ``num_features``, ``features_only`` and ``feature_info``;
    they override the defaults below where they differ (embeddings and tokens out of weight decay, an
    official checkpoint layout to map, a classifier elsewhere)."""

    head_attr = 'head'              # the attribute reset_classifier replaces
    classifier_prefix = 'head'      # module path of the final linear layer (fine-tuning, checkpoint loading)

    def no_weight_decay(self) -> set[str]:
        """Parameter names kept out of weight decay beyond timm's rule (1-d parameters, biases): none."""
        return set()

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map a foreign (official, timm) checkpoint layout onto this model's keys: ours already."""
        return state_dict

    def forward_intermediates(self, x: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError(f'{type(self).__name__} must define forward_intermediates (features_only)')

    def forward(self, x: torch.Tensor):
        if self.features_only:
            return self.forward_intermediates(x)
        return self.forward_head(self.forward_features(x))

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        p = next(self.parameters())
        head = (nn.Linear(self.num_features, num_classes, device=p.device, dtype=p.dtype) if num_classes > 0
                else nn.Identity())
        setattr(self, self.head_attr, head)
