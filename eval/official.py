"""An official implementation as a benchmark reference: ``zoo bench NAME --vs official:SOURCE[:CALLABLE]``.

The official code is never a dependency of zoo and is never shipped: the user points at a copy they have
(a clone of the official repository, or any module on ``sys.path``), and this module

1. imports it: ``SOURCE`` is a path to a ``.py`` file (its package root is put on ``sys.path``, so the
   file's own absolute imports such as ``from libs.consts import ...`` work) or a dotted module name;
2. builds the official model with the zoo model's configuration (``CALLABLE`` defaults to the official
   class name of the family, e.g. ``RaftMLP`` or ``StripMLPNet``);
3. copies the zoo model's weights into it through the family's ``to_official`` key mapping (strict:
   every official key must be filled) and checks that both compute the same logits, first with every weight
   and statistic perturbed off its initial value (``perturbed``: a LayerNorm weight of ones, a zero GRN gamma
   or fresh BatchNorm statistics would hide a wrong mapping of that tensor), then with the model's own.

Examples (with the official repositories cloned to /src)::

    zoo bench raftmlp_s --vs official:/src/raft-mlp/libs/models.py --batch-size 1 16
    zoo bench stripmlp_t_star --vs official:/src/Strip_MLP/models/strip_mlp.py:StripMLPNet

The tests run the same path against the independent re-statements in ``tests/reference_*.py``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import zoo

PREFIX = 'official:'


def _raftmlp_kwargs(m) -> dict:
    """``libs/models.py: RaftMLP`` arguments (okojoalg/raft-mlp, the published cross-scale S/M/L)."""
    layers = []
    for level in m.levels:
        block = level.blocks[0]
        layers.append(dict(depth=len(level.blocks), dim=level.embed.proj.out_features, patch_size=level.embed.patch,
                           raft_size=m.raft_size, embedding_kernels=[u.kernel_size for u in level.embed.unfolds]))
    v, mlp = block.vertical, block.mlp
    return dict(layers=layers, in_channels=m.in_chans, pretrained_image_size=m.img_size[0],
                num_classes=m.num_classes, token_expansion_factor=v.fc1.out_features // v.fc1.in_features,
                channel_expansion_factor=mlp[0].out_features // mlp[0].in_features, dropout=0.0,
                token_mixing_type='ser_pm', embedding_type='emb_cross_mlp', shortcut=False,
                drop_path_rate=_drop_path(m))


def _stripmlp_kwargs(m) -> dict:
    """``models/strip_mlp.py: StripMLPNet`` arguments (Med-Process/Strip_MLP); drop path is 0.1 there."""
    return dict(img_size=m.img_size, patch_size=4, in_chans=m.in_chans, num_classes=m.num_classes,
                embed_dim=m.patch_embed.out_channels, layers=[len(s) for s in m.stages], drop_rate=0.0, alpha=3)


def _drop_path(m) -> float:
    return next((float(d.drop_prob) for d in m.modules() if hasattr(d, 'drop_prob')), 0.0)


# family -> (official callable's default name, the official constructor's arguments for a zoo model)
FAMILIES: dict[str, tuple[str, Callable[[nn.Module], dict]]] = {
    'raftmlp': ('RaftMLP', _raftmlp_kwargs),
    'stripmlp': ('StripMLPNet', _stripmlp_kwargs),
}


def parse(spec: str) -> tuple[str, str | None]:
    """``official:SOURCE[:CALLABLE]`` -> (SOURCE, CALLABLE or None)."""
    if not spec.startswith(PREFIX) or len(spec) == len(PREFIX):
        raise ValueError(f'expected official:SOURCE[:CALLABLE] (SOURCE a .py file or a module name), got {spec!r}')
    rest = spec[len(PREFIX):]
    source, sep, name = rest.rpartition(':')
    if not sep or not name.isidentifier():  # no callable given (or the colon belongs to a Windows drive)
        return rest, None
    return source, name


def import_source(source: str):
    """Import a ``.py`` file (with its package root on ``sys.path``) or a dotted module name."""
    if source.endswith('.py') or '/' in source or '\\' in source:
        path = Path(source).expanduser().resolve()
        if not path.is_file():
            raise FileNotFoundError(f'official implementation not found: {source} (expected a .py file)')
        parts, root = [path.stem], path.parent
        while (root / '__init__.py').is_file():  # climb to the top package so absolute imports resolve
            parts.insert(0, root.name)
            root = root.parent
        # official repositories reuse package names (``models``, ``libs``): one imported earlier from another
        # checkout would be found in sys.modules and its file silently used instead of this one
        for key in [k for k in sys.modules if k == parts[0] or k.startswith(parts[0] + '.')]:
            if not _inside(sys.modules[key], root):
                del sys.modules[key]
        if str(root) in sys.path:
            sys.path.remove(str(root))
        sys.path.insert(0, str(root))
        source = '.'.join(parts)
    else:
        path = None
    try:
        module = importlib.import_module(source)
    except ImportError as e:  # a ValueError, so that the command line exits with 2 and this message
        raise ValueError(f'could not import the official implementation {source!r}: {e}') from e
    if path is not None and Path(getattr(module, '__file__', '') or '').resolve() != path:
        raise ValueError(f'{source!r} was imported from {module.__file__}, not from {path}')
    return module


def _inside(module, root: Path) -> bool:
    """Whether an imported module (or namespace package) comes from under ``root``."""
    files = [getattr(module, '__file__', None), *getattr(module, '__path__', [])]
    return any(f and Path(f).resolve().is_relative_to(root) for f in files)


def build_official(spec: str, model: nn.Module, atol_rel: float = 1e-4) -> nn.Module:
    """The official model for zoo ``model`` (same configuration and weights), from ``official:...``.

    Raises a ValueError naming the problem if the family has no official mapping, a key does not match
    or the outputs differ (relative max |Δ| above ``atol_rel`` of the largest logit)."""
    name = getattr(model, 'zoo_name', type(model).__name__)
    family = zoo.model_info(name).family if hasattr(model, 'zoo_name') else None
    if family not in FAMILIES:
        raise ValueError(f'--vs official: is available for the families {", ".join(sorted(FAMILIES))}; '
                         f'{name} is {family or "not a registered model"}')
    default_name, kwargs_of = FAMILIES[family]
    source, attr = parse(spec)
    module = import_source(source)
    attr = attr or default_name
    if not hasattr(module, attr):
        raise ValueError(f'{source} has no {attr!r}; name the official class as official:{source}:<Class>')
    kwargs = kwargs_of(model)
    try:
        official = getattr(module, attr)(**kwargs)
    except Exception as e:  # noqa: BLE001 (whatever the foreign constructor raises, say what was asked of it)
        raise ValueError(f'{attr} from {source} could not be built as {name} ({kwargs}): {e}') from e
    state = {k: v.clone() for k, v in model.state_dict().items()}
    # first with every weight and statistic moved off its initial value (a LayerNorm's weight of ones, a zero GRN
    # gamma, BatchNorm's running mean 0 and variance 1 hide a wrong mapping of that tensor), then the model's own
    size = zoo.model_info(name).input_size
    x = torch.randn(2, *size, generator=torch.Generator().manual_seed(0))
    official.eval()
    model.eval()
    try:
        for what, weights in (('perturbed weights', perturbed(state)), ('weights', state)):
            model.load_state_dict(weights)
            _load(official, model.to_official(weights), attr, source, name)
            with torch.inference_mode():
                ours, ref = model(x), official(x)
            diff = (ours - ref).abs().max().item()
            if not diff <= atol_rel * ref.abs().max().item() + 1e-6:
                raise ValueError(f'{attr} from {source} with {name}\'s {what} gives other logits (max |Δ| '
                                 f'{diff:.3g}); not the same network')
    finally:
        model.load_state_dict(state)  # the model keeps its own weights whatever happened
    return official


def _load(official: nn.Module, state: dict, attr: str, source: str, name: str) -> None:
    missing, unexpected = official.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f'{attr} from {source} does not take {name}\'s weights: missing {missing[:4]}, '
                         f'unexpected {unexpected[:4]}')


def perturbed(state: dict, scale: float = 0.2, seed: int = 0) -> dict:
    """``state`` with every floating tensor moved by seeded noise (``scale`` times its spread, or ``scale`` for a
    constant tensor such as a norm's weight of ones); running variances multiplied by factors in [0.5, 1.5] so
    they stay positive. Integer buffers (``num_batches_tracked``) are kept."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        if not v.is_floating_point():
            out[k] = v
        elif k.endswith('running_var'):
            out[k] = v * (0.5 + torch.rand(v.shape, generator=g, dtype=v.dtype))
        else:
            spread = v.float().std().item() if v.numel() > 1 else 0.0
            noise = torch.randn(v.shape, generator=g, dtype=v.dtype)
            out[k] = v + scale * (spread if spread > 0 else 1.0) * noise
    return out
