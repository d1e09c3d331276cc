"""Helpers every family uses: argument checking, input checking and the feature-map contract."""
from __future__ import annotations

import inspect
import numbers
import re

import torch
import torch.utils.checkpoint
from einops import rearrange
from torch import nn

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')


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

    Every registered family is built here, so argument checks common to all of them live here too. A classifier
    (a :class:`ClassifierBase`) also takes timm's ``global_pool`` (``''``: no pooling, with ``num_classes=0``)."""
    classifier = isinstance(cls, type) and issubclass(cls, ClassifierBase)
    accepted = accepted_args(cls) + (['global_pool'] if classifier else [])
    unknown = sorted(k for k in overrides if k not in accepted)
    if unknown:
        raise UnknownArgumentError(cls, unknown, accepted)
    overrides = dict(overrides)
    global_pool = overrides.pop('global_pool', None) if classifier else None
    args = {**cfg, **overrides}
    if 'num_classes' in args:
        check_num_classes(args['num_classes'])
    check_no_numeric_strings(cls, overrides)
    model = cls(**args)
    if getattr(model, 'features_only', False):
        return model  # no head: nothing to pool
    if global_pool is not None:
        model.set_global_pool(global_pool, model.num_classes)
    if args.get('num_classes') == 0 and hasattr(model, 'reset_classifier'):
        model.reset_classifier(0)  # the same "no head" everywhere, also where a family would build Linear(d, 0)
    return model


def check_image(x: torch.Tensor, in_chans: int, min_size: int, model: str,
                fixed_size: tuple[int, int] | None = None, size_arg=None) -> None:
    """Raise a clear error for an input the model cannot take, before torch does so deep inside.
    ``size_arg(h, w)``: the constructor argument that builds the model for an ``h`` x ``w`` input, as text
    (default ``img_size=h``)."""
    if isinstance(x, torch.fx.Proxy):
        return  # torch.fx symbolic tracing: no concrete shape to check; the traced graph runs the model's ops
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


class FeatureInfo(dict):
    """One multi-scale output: its channels (``num_chs``), its stride from the input (``reduction``) and the
    module that makes it. A dict, as timm's ``feature_info`` entries are (``timm.models.FeatureGetterNet`` and
    timm's ``FeatureInfo`` read and annotate it), with attribute access."""

    def __init__(self, num_chs: int, reduction: int, module: str):
        super().__init__(num_chs=num_chs, reduction=reduction, module=module)

    num_chs = property(lambda self: self['num_chs'])
    reduction = property(lambda self: self['reduction'])
    module = property(lambda self: self['module'])


def select_features(feature_info: list[FeatureInfo], out_indices, features_only: bool = False):
    """``(out_indices, feature_info)``: the absolute indices of the levels ``out_indices`` picks (``None`` all) and
    their entries. With ``features_only`` the entries come as timm's ``FeatureInfo`` (``channels()``,
    ``reduction()``, ``module_name()``; indexing, slicing, ``len`` and iteration over the levels taken), as timm's
    own ``features_only`` models carry it; a classifier keeps timm's plain list of every level."""
    n = len(feature_info)
    idx = tuple(i % n for i in out_indices) if out_indices is not None else tuple(range(n))
    if any(not -n <= i < n for i in (out_indices or ())):
        raise ValueError(f'out_indices {tuple(out_indices)} out of range for {n} feature levels')
    taken = [feature_info[i] for i in idx]
    if features_only:
        from timm.models import FeatureInfo as TimmFeatureInfo  # lazily: timm's import is heavy
        taken = TimmFeatureInfo(taken, len(taken))
    return idx, taken


def take_indices(num_stages: int, indices) -> tuple[list[int], int]:
    """timm's ``feature_take_indices``: ``None`` all, an int the last n, a list those (negative from the end)."""
    from ._timm_compat import feature_take_indices
    return feature_take_indices(num_stages, indices)


def checkpointed(enabled: bool, fn, *args):
    """``fn(*args)``, under ``torch.utils.checkpoint`` (activations recomputed in the backward pass) if ``enabled``.
    A recomputed block's BatchNorm updates its running statistics a second time, as in timm."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) if enabled else fn(*args)


def run_blocks(blocks, x, checkpointing: bool = False):
    """Run ``blocks`` (a module, or modules in order); a tuple state is passed unpacked (blocks that take and return
    several tensors). With ``checkpointing`` (training with autograd), each block (each child of a Sequential) runs
    under ``torch.utils.checkpoint``: its activations are recomputed in the backward pass instead of stored."""
    if not checkpointing and isinstance(blocks, nn.Module):  # the stage module itself (its hooks fire)
        return blocks(*x) if isinstance(x, tuple) else blocks(x)
    if checkpointing:  # an in-place module (VGG's ReLU) is checkpointed with the module before it, as one unit
        units = []
        for blk in blocks:
            units.append(nn.Sequential(units.pop(), blk) if units and getattr(blk, 'inplace', False) else blk)
        blocks = units
    for blk in blocks:
        args = x if isinstance(x, tuple) else (x,)
        x = checkpointed(checkpointing, blk, *args)
    return x


_FORMATS = ('NCHW', 'NHWC', 'NLC')


def to_format(x: torch.Tensor, output_fmt: str) -> torch.Tensor:
    """A (B, C, H, W) map in timm's ``output_fmt``: NCHW, NHWC or NLC (tokens, (B, H*W, C))."""
    if output_fmt == 'NHWC':
        return rearrange(x, 'b c h w -> b h w c')
    if output_fmt == 'NLC':
        return rearrange(x, 'b c h w -> b (h w) c')
    return x


class ClassifierBase(nn.Module):
    """timm's model contract, declared once for every family.

    Classification: ``forward`` returns logits (``forward_head(forward_features(x))``), or the multi-scale maps
    of ``out_indices`` when built with ``features_only``; ``reset_classifier`` swaps the linear head named
    ``head_attr`` (on the model's device and dtype); ``get_classifier`` returns the final linear layer.

    Intermediates (timm's ``forward_intermediates``, ``prune_intermediate_layers``, ``group_matcher``,
    ``set_grad_checkpointing``) are implemented here once, over the stages a family declares: a family says
    how to run its stem (:meth:`forward_stem`), which blocks make stage ``i`` (:meth:`stage_blocks`, default the
    modules of ``getattr(self, stages_attr)[i]``) or how to run it (:meth:`forward_stage`, for stages joined by
    more than a sequence), what map stage ``i`` gives (:meth:`stage_output`, default the state itself) and what
    ``forward_features`` returns after the last stage (:meth:`forward_final`). One stage = one ``feature_info``
    level. The state between stages may be a tensor or a tuple of tensors (TNT: words and sentences).

    Subclasses define ``forward_head``, ``num_features``, ``features_only``, ``feature_info`` and
    ``out_indices``; they override the defaults below where they differ (embeddings and tokens out of weight
    decay, an official checkpoint layout to map, a classifier elsewhere)."""

    head_attr = 'head'              # the attribute reset_classifier replaces
    classifier_prefix = 'head'      # module path of the final linear layer (fine-tuning, checkpoint loading)
    first_conv = 'stem'             # module path(s) of the first layer that sees the image (pretrained_cfg)
    global_pool = 'avg'             # timm's name for the head's pooling; '' = none (forward gives forward_features)
    pool_types: tuple[str, ...] = ('avg', '')  # the global_pool values the family's head implements
    fixed_input_size = False        # the weights depend on the input size (pretrained_cfg; timm's tests honour it)
    stage_modules_give_maps = True  # the feature_info modules output the maps (timm's FeatureHookNet hooks them)
    stages_attr = 'stages'          # the ModuleList / Sequential of stages, one per feature level
    stem_names: tuple[str, ...] = ('stem',)  # modules and parameters before the first stage (group_matcher)
    final_norm_attr: str | None = None  # the norm forward_features ends with, if any (timm's norm=, prune_norm)
    grad_checkpointing = False

    @property
    def head_hidden_size(self) -> int:
        """timm's width of the pre-logits features (``forward_head(x, pre_logits=True)``, the classifier's input):
        ``num_features`` unless the head has hidden layers of its own (VGG's 4096-wide MLP)."""
        return self.__dict__.get('_head_hidden_size', self.num_features)

    @head_hidden_size.setter
    def head_hidden_size(self, value: int) -> None:
        self.__dict__['_head_hidden_size'] = value

    def unpooled_size(self, h: int, w: int) -> tuple[int, int] | None:
        """(H, W) of ``forward_features``' map for an ``h`` x ``w`` input (timm's ``pool_size``): the input over the
        last stage's stride. ``None`` for families whose features are tokens (TNT, PIIP)."""
        r = max(f['reduction'] for f in self.feature_info)
        return -(-h // r), -(-w // r)

    def set_global_pool(self, global_pool: str, num_classes: int) -> None:
        """timm's ``global_pool``: one of the family's ``pool_types``; ``''`` leaves the features unpooled (the
        head then returns ``forward_features``' output unchanged, so the classifier it goes with has
        ``num_classes=0``)."""
        name = getattr(self, 'zoo_name', type(self).__name__)
        if global_pool not in self.pool_types:
            raise ValueError(f'{name}: global_pool must be one of {", ".join(map(repr, self.pool_types))} '
                             f"('' = unpooled features), got {global_pool!r}")
        if global_pool == '' and num_classes > 0:
            raise ValueError(f"{name}: global_pool='' gives the unpooled feature maps; it needs num_classes=0 (a "
                             f'linear classifier reads pooled features), got num_classes={num_classes}')
        self.global_pool = global_pool

    def no_weight_decay(self) -> set[str]:
        """Parameter names kept out of weight decay beyond timm's rule (1-d parameters, biases): none."""
        return set()

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map a foreign (official, timm) checkpoint layout onto this model's keys: ours already."""
        return state_dict

    # -- the stages a family declares ---------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(getattr(self, self.stages_attr))

    def forward_stem(self, x: torch.Tensor):
        """Input check and stem: the state the first stage takes."""
        raise NotImplementedError(f'{type(self).__name__} must define forward_stem')

    def stage_blocks(self, i: int) -> list[nn.Module]:
        """The modules stage ``i`` runs in order (the unit of gradient checkpointing)."""
        stage = getattr(self, self.stages_attr)[i]
        return list(stage) if isinstance(stage, nn.Sequential) else [stage]

    def forward_stage(self, i: int, state):
        """Stage ``i``'s module (so hooks on the ``feature_info`` modules fire), or its blocks one by one under
        gradient checkpointing."""
        if self._checkpointing():
            return run_blocks(self.stage_blocks(i), state, True)
        return run_blocks(getattr(self, self.stages_attr)[i], state)

    def stage_output(self, i: int, state, norm: bool = False) -> torch.Tensor:
        """The (B, C, H, W) map of stage ``i``; ``norm``: through the final norm where the family has one
        (timm's ``norm=True``; convolutional families have none before their head and ignore it)."""
        return state

    def forward_final(self, state):
        """What ``forward_features`` returns from the last stage's state."""
        return state

    def _checkpointing(self) -> bool:
        return self.grad_checkpointing and self.training and torch.is_grad_enabled()

    # -- timm's contract, once ----------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor):
        state = self.forward_stem(x)
        for i in range(self.num_stages):
            state = self.forward_stage(i, state)
        return self.forward_final(state)

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False):
        """timm's ``forward_intermediates``: the maps of the stages in ``indices`` (``None`` all, an int the last
        n, a list those; negative from the end) in ``output_fmt`` (NCHW, NHWC or NLC); ``norm`` through the final
        norm where the family has one; ``stop_early`` runs no stage after the last one taken. Returns the list
        with ``intermediates_only``, else ``(final features, list)`` (the final features as ``forward_features``
        gives them, from the last stage run)."""
        if output_fmt not in _FORMATS:
            raise ValueError(f'output_fmt must be one of {", ".join(_FORMATS)}, got {output_fmt!r}')
        take, max_index = take_indices(self.num_stages, indices)
        state = self.forward_stem(x)
        feats = []
        for i in range(max_index + 1 if stop_early else self.num_stages):
            state = self.forward_stage(i, state)
            if i in take:
                feats.append(to_format(self.stage_output(i, state, norm), output_fmt))
        if intermediates_only:
            return feats
        return self.forward_final(state), feats

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """timm's: drop the stages after the last one in ``indices`` (and the final norm with ``prune_norm``, the
        classifier with ``prune_head``); returns the absolute indices kept."""
        take, max_index = take_indices(self.num_stages, indices)
        prune_end = max_index < self.num_stages - 1
        self.truncate_stages(max_index + 1)
        if prune_norm and self.final_norm_attr and getattr(self, self.final_norm_attr) is not None:
            setattr(self, self.final_norm_attr, nn.Identity())
        if not self.features_only:
            if prune_end:  # the features now end at the last stage kept
                self.num_features = self.feature_info[max_index]['num_chs']
            if prune_head or prune_end:
                self.reset_classifier(0)
        return take

    def truncate_stages(self, n: int) -> None:
        """Keep the first ``n`` stages."""
        setattr(self, self.stages_attr, getattr(self, self.stages_attr)[:n])

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter grouping (``timm.optim.param_groups_layer_decay``): ``stem`` a regex of the stem's
        parameters, ``blocks`` a regex (or timm's list of ``(regex, suffix)``) whose groups order the stages
        (``coarse``) or blocks; parameters matching neither (final norm, head) come last."""
        stem = ('^(?:' + '|'.join(re.escape(n) for n in self.stem_names) + r')(?:\.|$)') if self.stem_names else None
        s = re.escape(self.stages_attr)
        return {'stem': stem, 'blocks': rf'^{s}\.(\d+)' if coarse else self.block_patterns()}

    def block_patterns(self):
        """Block-level ``blocks`` matcher (default: the blocks of Sequential stages, ``<stages>.<i>.<j>``)."""
        s = re.escape(self.stages_attr)
        return [(rf'^{s}\.(\d+)\.(\d+)\.', None), (rf'^{s}\.(\d+)\.', None)]

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (``torch.utils.checkpoint``) when training."""
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module | None:
        """The final linear layer (``None`` for a ``features_only`` model)."""
        if self.features_only:
            return None
        prefixes = self.classifier_prefix
        heads = [_find(self, p) for p in ((prefixes,) if isinstance(prefixes, str) else prefixes)]
        return heads[0] if len(heads) == 1 else nn.ModuleList(heads) if all(heads) else None

    def forward(self, x: torch.Tensor):
        if self.features_only:
            return self.forward_intermediates(x, self.out_indices, stop_early=True, intermediates_only=True)
        return self.forward_head(self.forward_features(x))

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's: a new classifier for ``num_classes`` (0: none, ``forward`` gives the pre-logits features) and,
        when given, a new ``global_pool`` (``''``: no pooling either, ``forward`` gives the unpooled features)."""
        check_num_classes(num_classes)
        self.set_global_pool(self.global_pool if global_pool is None else global_pool, num_classes)
        self.num_classes = num_classes
        self.reset_head(num_classes)

    def reset_head(self, num_classes: int) -> None:
        """Replace the final linear layer (named ``head_attr``) on the model's device and dtype."""
        p = next(self.parameters())
        head = (nn.Linear(self.head_hidden_size, num_classes, device=p.device, dtype=p.dtype) if num_classes > 0
                else nn.Identity())
        setattr(self, self.head_attr, head)


def _find(module: nn.Module, path: str) -> nn.Module | None:
    for name in path.split('.'):
        module = getattr(module, name, None)
        if not isinstance(module, nn.Module):
            return None
    return module
