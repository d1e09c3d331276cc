"""MetaFormer and PoolFormer.

"MetaFormer Is Actually What You Need for Vision", Yu et al., CVPR 2022, arXiv 2111.11418.
Official code: https://github.com/sail-sg/poolformer (``models/poolformer.py``, ``models/metaformer.py``).

A generic MetaFormer: a 7x7/s4 stem, four stages of ``x + ls * mixer(norm(x))`` and
``x + ls * mlp(norm(x))`` blocks with strided 3x3 convolutions between stages, and a
norm-pool-linear head. The token mixer (and the norm) is a registry argument, for all stages
or one per stage, so ``zoo.create('metaformer_s12', token_mixer='attention')`` is the ablation.

Differences from the official code, all numerically neutral:
- module names follow timm's port (``stem.conv``, ``stages.i.downsample``, ``stages.i.blocks.j``),
  so timm checkpoints load unchanged; official checkpoints are remapped by ``remap_checkpoint``;
- the network runs in channels-last memory on CPU (1x1 convs become one GEMM, average pooling
  vectorises over channels); the logical layout stays NCHW.

Dense backbone: ``features_only=True`` returns the four stage outputs (strides 4/8/16/32). The
official detection / segmentation backbone (``fork_feat=True``) also puts a norm on each output
(``norm0/2/4/6``); ``out_norm=True`` adds them (``out_norms.{i}``), so the official detection
checkpoints load (``remap_checkpoint``) and give the official feature maps. See docs/backbones.md.

Head: the official head is GroupNorm(1, C) over the whole map, then mean, then linear; timm's
is mean, then LayerNorm over channels (eps 1e-6), then linear. ``timm_head=True`` selects timm's
so that weights trained in timm reproduce timm's logits exactly.
"""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import nn

from zoo import layers
from zoo.layers import DropPath, LayerScale, linear_drop_path_rates
from zoo.layers._torch_compat import state_dict_metadata

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, select_features
from ._registry import ReleasedWeights, register_model

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')

__all__ = ['MetaFormer', 'MetaFormerBlock']


def _per_stage(value, n: int, what: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f'{what} has {len(value)} entries but the model has {n} stages')
        return list(value)
    return [value] * n


class MetaFormerBlock(nn.Module):
    """``x + DropPath(ls1 * mixer(norm1(x)))`` then ``x + DropPath(ls2 * mlp(norm2(x)))`` on NCHW maps."""

    def __init__(self, dim: int, token_mixer=layers.token_mixers.Pooling, norm_layer=layers.norm.GroupNorm1,
                 mlp_layer=layers.mlp.ConvMlp, mlp_ratio: float = 4.0, act_layer=nn.GELU, drop: float = 0.0,
                 drop_path: float = 0.0, layer_scale_init_value: float | None = 1e-5,
                 input_resolution: tuple[int, int] | None = None):
        super().__init__()
        mixer_cls = layers.get('token_mixer', token_mixer)
        mixer_kwargs = {}
        if 'input_resolution' in inspect.signature(mixer_cls).parameters:
            mixer_kwargs['input_resolution'] = input_resolution  # mixers whose weights depend on the grid
        self.norm1 = layers.get('norm', norm_layer)(dim)
        self.token_mixer = mixer_cls(dim, **mixer_kwargs)
        # A mixer declared 'nlc' works on (B, H*W, C) tokens; the block converts around it.
        self.mixer_tokens = layers.layout_of('token_mixer', mixer_cls) == 'nlc'
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.layer_scale1 = LayerScale(dim, layer_scale_init_value) if layer_scale_init_value else nn.Identity()
        self.norm2 = layers.get('norm', norm_layer)(dim)
        self.mlp = layers.get('channel_mixer', mlp_layer)(dim, int(mlp_ratio * dim), act_layer=act_layer, drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.layer_scale2 = LayerScale(dim, layer_scale_init_value) if layer_scale_init_value else nn.Identity()
        # ConvMlp adds the (layer-scaled) residual itself, fused into its second convolution on CPU inference
        self.mlp_takes_residual = isinstance(self.mlp, layers.mlp.ConvMlp) and isinstance(self.layer_scale2, LayerScale)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        if not self.mixer_tokens:
            return self.token_mixer(x)
        h, w = x.shape[-2:]
        t = self.token_mixer(rearrange(x, 'b c h w -> b (h w) c'))
        return rearrange(t, 'b (h w) c -> b c h w', h=h, w=w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._residual(x, self.mix(self.norm1(x)), self.layer_scale1, self.drop_path1)
        if self.mlp_takes_residual and not (self.training and isinstance(self.drop_path2, DropPath)):
            # residual + ls * mlp(norm(x)) inside the MLP: on CPU inference the add runs as a post-op of its
            # second convolution (zoo.layers.onednn.conv_add); plain convolutions elsewhere
            return self.mlp(self.norm2(x), residual=x, scale=self.layer_scale2.scale)
        return self._residual(x, self.mlp(self.norm2(x)), self.layer_scale2, self.drop_path2)

    def _residual(self, x: torch.Tensor, y: torch.Tensor, ls: nn.Module, drop_path: nn.Module) -> torch.Tensor:
        """``x + drop_path(ls(y))``; x + ls * y as one addcmul where drop path is the identity."""
        if isinstance(ls, LayerScale) and not (self.training and isinstance(drop_path, DropPath)):
            return torch.addcmul(x, ls.scale.view(1, -1, 1, 1), y)
        return x + drop_path(ls(y))


class MetaFormerStage(nn.Module):
    """Optional downsampling (the first stage has none) followed by ``depth`` blocks."""

    def __init__(self, in_chs: int, out_chs: int, depth: int, downsample_layer, drop_path_rates: list[float],
                 **block_kwargs):
        super().__init__()
        ds = layers.get('downsample', downsample_layer)
        self.downsample = ds(in_chs, out_chs) if in_chs != out_chs else nn.Identity()
        self.blocks = nn.Sequential(*[MetaFormerBlock(out_chs, drop_path=dp, **block_kwargs)
                                      for dp in drop_path_rates])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


class MetaFormer(ClassifierBase):
    """A four-stage MetaFormer with interchangeable token mixers.

    Args:
        depths, dims: blocks and channels per stage.
        token_mixer, norm_layer: a block spec (name, class or partial) or one per stage.
        layer_scale_init_value: layer-scale init (``None`` disables layer scale).
        drop_path_rate: stochastic depth, rising linearly over all blocks.
        timm_head: timm's head order (pool, LayerNorm, fc) instead of the official one.
        img_size: used only by token mixers whose weights depend on the grid.
        features_only: return the multi-scale maps of ``out_indices`` instead of logits.
        out_norm: with ``features_only``, normalise each returned map with the stage's norm layer, as the
            official dense backbone (``fork_feat=True``) does; needed for its detection checkpoints.
    """

    def __init__(self, depths: Sequence[int] = (2, 2, 6, 2), dims: Sequence[int] = (64, 128, 320, 512),
                 num_classes: int = 1000, in_chans: int = 3, token_mixer='pooling', norm_layer='groupnorm1',
                 mlp_layer='mlp', mlp_ratio: float = 4.0, act_layer='gelu', stem_layer='patch_embed',
                 downsample_layer='conv', layer_scale_init_value: float | None = 1e-5, drop_rate: float = 0.0,
                 proj_drop_rate: float = 0.0, drop_path_rate: float = 0.0, timm_head: bool = False,
                 img_size: int | Sequence[int] = 224, channels_last: bool = True, features_only: bool = False,
                 out_indices: Sequence[int] | None = None, out_norm: bool = False):
        super().__init__()
        if out_norm and not features_only:
            raise ValueError('out_norm=True normalises the multi-scale outputs; it needs features_only=True')
        n = len(depths)
        if len(dims) != n:
            raise ValueError(f'depths {tuple(depths)} and dims {tuple(dims)} must have the same length')
        mixers = _per_stage(token_mixer, n, 'token_mixer')
        norms = _per_stage(norm_layer, n, 'norm_layer')
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.channels_last = channels_last
        self.timm_head = timm_head
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.num_features = dims[-1]
        act = layers.get('act', act_layer)

        self.stem = layers.get('stem', stem_layer)(in_chans, dims[0])
        stride = self.stem.stride
        rates = linear_drop_path_rates(drop_path_rate, list(depths))
        stages, info = [], []
        prev = dims[0]
        for i in range(n):
            stride *= 1 if i == 0 else 2
            grid = (self.img_size[0] // stride, self.img_size[1] // stride)
            stages.append(MetaFormerStage(prev, dims[i], depths[i], downsample_layer, rates[i],
                                          token_mixer=mixers[i], norm_layer=norms[i], mlp_layer=mlp_layer,
                                          mlp_ratio=mlp_ratio, act_layer=act, drop=proj_drop_rate,
                                          layer_scale_init_value=layer_scale_init_value, input_resolution=grid))
            info.append(FeatureInfo(dims[i], stride, f'stages.{i}'))
            prev = dims[i]
        self.stages = nn.Sequential(*stages)
        self.features_only = features_only
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        self.out_norm = out_norm
        if out_norm:  # official fork_feat: one norm per returned map (its norm0/2/4/6), keyed by level
            self.out_norms = nn.ModuleDict({str(i): layers.get('norm', norms[i])(dims[i]) for i in self.out_indices})
        if features_only:
            self.head = None
        else:
            self.head = layers.get('head', 'classifier')(
                dims[-1], num_classes, norm_layer=layers.norm.LayerNorm2d if timm_head else norms[-1],
                pool_first=timm_head, drop_rate=drop_rate)
        self.apply(self._init_weights)
        if channels_last:  # weights in the layout the convolutions want, once, not at every call
            self.to(memory_format=torch.channels_last)

    classifier_prefix = 'head.fc'
    first_conv = 'stem.conv'
    # timm's and the official head have the same keys and shapes: zoo.create picks the one a checkpoint needs
    checkpoint_head_arg = 'timm_head'
    data_cfg = dict(crop_pct=0.9)  # the official and timm evaluation crop

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # Official init: trunc_normal(.02) on Linear layers (and, inside ConvMlp, the 1x1 convs);
        # stem and downsampling convs keep PyTorch's default.
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, layers.mlp.ConvMlp):
            for conv in (m.fc1, m.fc2):
                nn.init.trunc_normal_(conv.weight, std=0.02)
                if conv.bias is not None:
                    nn.init.zeros_(conv.bias)

    # -- the stages timm's contract runs (zoo._builder.ClassifierBase) --------------------------------------
    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, min_size=3, model=getattr(self, 'zoo_name', 'MetaFormer'))
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.stem(x)

    def stage_blocks(self, i: int) -> list[nn.Module]:
        return [self.stages[i].downsample, *self.stages[i].blocks]

    def stage_output(self, i: int, x: torch.Tensor, norm: bool = False) -> torch.Tensor:
        """Stage ``i``'s map (B, dims[i], H/(4*2^i), W/(4*2^i)), through its own norm when built with
        ``out_norm`` (the official dense backbone; applied to the output only, not to the trunk)."""
        return self.out_norms[str(i)](x) if self.out_norm and str(i) in self.out_norms else x

    def block_patterns(self):
        return [(r'^stages\.(\d+)\.blocks\.(\d+)\.', None), (r'^stages\.(\d+)\.', None)]  # downsample first

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': the unpooled maps
            return x
        return self.head(x, pre_logits=pre_logits)

    def reset_head(self, num_classes: int) -> None:
        self.head.reset(num_classes)

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map the official PoolFormer layout onto ours; timm's layout is ours already.

        Official: ``patch_embed.proj``, ``network.{0,2,4,6}.j.*`` (stages), ``network.{1,3,5}.proj``
        (downsampling), ``layer_scale_1`` (a bare parameter), ``norm``, ``head``; its dense backbone
        (``fork_feat=True``) has ``norm{0,2,4,6}`` on the outputs instead of ``norm``/``head``: they become
        ``out_norms.{0..3}``. A detector's checkpoint (mmdet: ``backbone.*``, ``neck.*``, ...) gives its
        backbone. For a ``features_only`` model the classifier (``head.*``) is dropped, and output norms the
        checkpoint lacks (an ImageNet checkpoint) are left newly initialised, as the official code does.
        """
        if any(k.startswith('backbone.') for k in state_dict):  # a whole detector / segmentor
            state_dict = {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
        if 'stem.conv.weight' not in state_dict:
            state_dict = self._remap_official(state_dict)
        if any(k.startswith('out_norms.') for k in state_dict) and not self.out_norm:
            raise ValueError('the checkpoint is an official dense backbone (fork_feat) with a norm on each output; '
                             'build the model with features_only=True, out_norm=True to load it')
        if self.features_only:
            own = {k: v for k, v in self.state_dict().items() if k.startswith('out_norms.')}
            # the classifier, and the output norms of levels not in out_indices, are not part of this model
            state_dict = {k: v for k, v in state_dict.items()
                          if not k.startswith('head.') and (not k.startswith('out_norms.') or k in own)}
            fresh = sorted(k for k in own if k not in state_dict)
            if fresh:
                warnings.warn(f'the checkpoint has no output norms for {", ".join(fresh)}; left newly initialised')
                state_dict = {**state_dict, **{k: own[k] for k in fresh}}
        return state_dict

    def checkpoint_head(self, state_dict: dict) -> bool | None:
        """Which head ``state_dict`` was trained with: ``False`` official (its ``network.*`` layout), ``True``
        timm's, ``None`` when the file cannot tell.

        timm's keys and shapes equal ours, so the tell is the module list that ``torch.save`` keeps with a
        state dict (``_metadata``): timm's head has a ``head.global_pool`` module, zoo's none. A zoo state dict
        does not record which head it had; it is taken to match this model (the usual save-and-reload). Files
        without the list (safetensors, re-keyed dicts) give ``None``."""
        if any(k.startswith('network.') for k in state_dict):
            return False
        modules = state_dict_metadata(state_dict) or {}
        if any(m == 'head.global_pool' or m.endswith('.head.global_pool') for m in modules):
            return True
        if any(m == 'head.norm' or m.endswith('.head.norm') for m in modules):
            return self.timm_head  # zoo's own layout
        return None

    @staticmethod
    def _remap_official(state_dict: dict) -> dict:
        out = {}
        for k, v in state_dict.items():
            parts = k.split('.')
            if parts[0] == 'patch_embed':
                k = 'stem.conv.' + '.'.join(parts[2:])
            elif parts[0] == 'network':
                idx = int(parts[1])
                if idx % 2 == 0:  # a stage: network.{2i}.{j}.rest -> stages.i.blocks.j.rest
                    rest = '.'.join(parts[3:])
                    rest = rest.replace('layer_scale_1', 'layer_scale1.scale').replace('layer_scale_2',
                                                                                         'layer_scale2.scale')
                    k = f'stages.{idx // 2}.blocks.{parts[2]}.{rest}'
                else:  # downsampling before stage (idx + 1) / 2
                    k = f'stages.{(idx + 1) // 2}.downsample.conv.' + '.'.join(parts[3:])
            elif parts[0] == 'norm':
                k = 'head.norm.' + '.'.join(parts[1:])
            elif parts[0] in ('norm0', 'norm2', 'norm4', 'norm6'):  # fork_feat output norms, one per stage
                k = f'out_norms.{int(parts[0][4:]) // 2}.' + '.'.join(parts[1:])
            elif parts[0] == 'head':
                k = 'head.fc.' + '.'.join(parts[1:])
            out[k] = v
        return out


def _create(cfg: dict, kwargs: dict) -> MetaFormer:
    return build_model(MetaFormer, cfg, kwargs)


_POOLFORMER = dict(family='poolformer', paper='MetaFormer Is Actually What You Need for Vision (arXiv 2111.11418)',
                   repo='https://github.com/sail-sg/poolformer', input_size=(3, 224, 224),
                   capabilities=('features', 'official_weights', 'timm_weights'), tiny='poolformer_tiny')
# The official release (sail-sg/poolformer README, "PoolFormer Models"; the same URLs are timm's default_cfgs of
# poolformerv1_*). The README states no hashes.
_RELEASE = 'https://github.com/sail-sg/poolformer/releases/download/v1.0/{}.pth.tar'


def _released(name: str) -> tuple:
    return (ReleasedWeights(_RELEASE.format(name), source='sail-sg/poolformer README (ImageNet-1k, 224)'),)


_S = dict(dims=(64, 128, 320, 512))
_M = dict(dims=(96, 192, 384, 768))


@register_model(**_POOLFORMER, timm_equivalent=('poolformer_s12', {'timm_head': True}),
                weights=_released('poolformer_s12'),
                params=11_915_176, macs=1_822_678_528, top1=77.2)
def poolformer_s12(**kwargs):
    return _create(dict(depths=(2, 2, 6, 2), **_S, layer_scale_init_value=1e-5, drop_path_rate=0.1), kwargs)


@register_model(**_POOLFORMER, timm_equivalent=('poolformer_s24', {'timm_head': True}),
                weights=_released('poolformer_s24'),
                params=21_388_968, macs=3_412_906_496, top1=80.3)
def poolformer_s24(**kwargs):
    return _create(dict(depths=(4, 4, 12, 4), **_S, layer_scale_init_value=1e-5, drop_path_rate=0.1), kwargs)


@register_model(**_POOLFORMER, timm_equivalent=('poolformer_s36', {'timm_head': True}),
                weights=_released('poolformer_s36'),
                params=30_862_760, macs=5_003_134_464, top1=81.4)
def poolformer_s36(**kwargs):
    return _create(dict(depths=(6, 6, 18, 6), **_S, layer_scale_init_value=1e-6, drop_path_rate=0.2), kwargs)


@register_model(**_POOLFORMER, timm_equivalent=('poolformer_m36', {'timm_head': True}),
                weights=_released('poolformer_m36'),
                params=56_172_520, macs=8_801_876_736, top1=82.1)
def poolformer_m36(**kwargs):
    return _create(dict(depths=(6, 6, 18, 6), **_M, layer_scale_init_value=1e-6, drop_path_rate=0.3), kwargs)


@register_model(**_POOLFORMER, timm_equivalent=('poolformer_m48', {'timm_head': True}),
                weights=_released('poolformer_m48'),
                params=73_473_448, macs=11_590_708_992, top1=82.5)
def poolformer_m48(**kwargs):
    return _create(dict(depths=(8, 8, 24, 8), **_M, layer_scale_init_value=1e-6, drop_path_rate=0.4), kwargs)


@register_model(**{**_POOLFORMER, 'input_size': (3, 32, 32)})
def poolformer_tiny(**kwargs):
    """A CPU-sized PoolFormer for tests and built-in data (32x32 inputs, about 0.1 M params)."""
    return _create(dict(depths=(1, 1, 2, 1), dims=(16, 32, 64, 96), layer_scale_init_value=1e-5, img_size=32),
                   kwargs)


_METAFORMER = dict(family='metaformer', paper=_POOLFORMER['paper'], repo=_POOLFORMER['repo'],
                   capabilities=('features',), tiny='metaformer_tiny')


@register_model(**_METAFORMER, params=11_915_176, macs=1_822_678_528)
def metaformer_s12(**kwargs):
    """PoolFormer-S12 geometry with any token mixer (``token_mixer=...``, one spec or one per stage).

    With the default pooling mixer this is ``poolformer_s12``; published numbers are for that.
    """
    return _create(dict(depths=(2, 2, 6, 2), **_S, layer_scale_init_value=1e-5, drop_path_rate=0.1), kwargs)


@register_model(**{**_METAFORMER, 'input_size': (3, 32, 32)})
def metaformer_tiny(**kwargs):
    """The tiny geometry with any token mixer: the CPU testbed for mixer ablations.

    Built for 32x32 inputs (``img_size=32``), so mixers whose weights depend on the grid (raft, strip)
    get the grids they will see (8/4/2/1).
    """
    return _create(dict(depths=(1, 1, 2, 1), dims=(16, 32, 64, 96), layer_scale_init_value=1e-5, img_size=32), kwargs)
