"""RaftMLP (the hierarchical "version 2" model: RaftMLP-S/M/L).

"RaftMLP: How Much Can Be Done Without Attention and with Less Spatial Locality?", Tatsunami & Taki,
arXiv 2108.04384. Official code: https://github.com/okojoalg/raft-mlp @ 6060d5d (``libs/models.py``,
``libs/modules.py``, ``configs/settings/imagenet-raft-mlp-cross-mlp-emb-{s,m,l}.yaml``).

Four levels, each: cross-scale MLP embedding (patch sizes 4, 2, 2, 2) -> ``depth`` raft blocks -> map.
A raft block is three pre-norm residual sub-blocks: vertical raft mixing, horizontal raft mixing
(``zoo.layers.raft``) and a channel MLP. Head: LayerNorm per token -> mean -> linear.

Faithful to the official code: strided raft grouping, PyTorch default init, LayerNorm eps 1e-5, and
the *same* drop-path rate on every sub-block of every level (no linear schedule).
Other resolutions work as in the code (feature maps are resized, not weights): a level whose input
is not divisible by its patch size resizes it bicubically up to the next multiple, and each block
resizes its tokens bicubically to the trained grid for the two raft mixings and back before the
channel MLP. So one model built for 224 also serves 256. Unlike the official levels, which store the
current grid in their modules at every forward, the grid is read from the input here.

Official checkpoints (``shortcut=False``, the published S/M/L) load with ``zoo.create(name, checkpoint=path)``
through ``RaftMLP.remap_checkpoint`` (which also permutes the raft LayerNorms' weights: the official ones
see channels in (co, r) order); ``to_official`` is the inverse. Same weights, same logits to float rounding
(tests/test_fidelity.py, docs/fidelity.md).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.layers import DropPath
from zoo.layers.onednn import add_tokens, linear
from zoo.layers.raft import RaftMixing, resize_grid

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, select_features
from ._registry import register_model

__all__ = ['RaftMLP', 'RaftBlock', 'CrossScaleEmbedding']


class CrossScaleEmbedding(nn.Module):
    """Cross-scale MLP patch embedding: unfold k x k windows at stride p for every k, concat, Linear.

    (B, C_in, H, W) -> (B, H/p, W/p, C_out). The first kernel is the patch size p (the stride).
    """

    def __init__(self, in_chs: int, out_chs: int, kernels: Sequence[int]):
        super().__init__()
        self.patch = kernels[0]
        if min(kernels) != self.patch:
            raise ValueError(f'the first embedding kernel must be the patch size (the smallest), got {kernels}')
        self.unfolds = nn.ModuleList(nn.Unfold(k, stride=self.patch, padding=(k - self.patch) // 2) for k in kernels)
        self.proj = nn.Linear(in_chs * sum(k * k for k in kernels), out_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """As ``reference``, computed as one strided convolution per kernel (channels-last, so the sum is
        (B, h, w, C_out) in memory): the unfolded k x k windows times their columns of ``proj`` are exactly
        a k x k convolution at stride p with the same zero padding, without materialising the windows."""
        x = x.contiguous(memory_format=torch.channels_last)
        out, start = None, 0
        for u in self.unfolds:
            k = u.kernel_size
            n = x.shape[1] * k * k
            weight = self.proj.weight[:, start:start + n].view(-1, x.shape[1], k, k)  # unfold order (c, ki, kj)
            y = F.conv2d(x, weight, stride=self.patch, padding=u.padding)
            out = y if out is None else out + y
            start += n
        return (out + self.proj.bias[:, None, None]).permute(0, 2, 3, 1)  # (B, h, w, C_out), contiguous

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The official form: unfold every k x k window, concatenate, one Linear."""
        h, w = x.shape[-2] // self.patch, x.shape[-1] // self.patch
        t = torch.cat([u(x) for u in self.unfolds], dim=1)  # (B, C_in * sum(k^2), h*w)
        return self.proj(rearrange(t, 'b f (h w) -> b h w f', h=h, w=w))


class ChannelMlp(nn.Sequential):
    """Linear -> GELU -> Dropout -> Linear -> Dropout over the channels of (B, H, W, C) tokens, as the official
    ``nn.Sequential`` (so its checkpoints' keys ``mlp.0``/``mlp.3`` load as they are).

    Called as a module, so hooks see it (``zoo profile`` counts it as the channel mixer); through
    ``zoo.layers.onednn.linear``: oneDNN GEMMs with the GELU fused in CPU inference, plain ops elsewhere."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(drop), nn.Linear(hidden, dim), nn.Dropout(drop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, _, drop1, fc2, drop2 = self
        return drop2(linear(drop1(linear(x, fc1, gelu=True)), fc2))


class RaftBlock(nn.Module):
    """Vertical raft mixing, horizontal raft mixing, channel MLP; each ``x + DropPath(f(LN(x)))``.

    Works on (B, H, W, C) tokens; the raft mixings run at the trained ``grid`` (bicubic resize when needed).
    """

    def __init__(self, dim: int, grid: tuple[int, int], raft_size: int = 2, token_expansion: float = 2.0,
                 channel_expansion: float = 4.0, drop: float = 0.0, drop_path: float = 0.0):
        super().__init__()
        self.grid = grid
        self.norm1 = nn.LayerNorm(dim)
        self.vertical = RaftMixing(dim, grid[0], 'h', raft_size, token_expansion, drop=drop)
        self.norm2 = nn.LayerNorm(dim)
        self.horizontal = RaftMixing(dim, grid[1], 'w', raft_size, token_expansion, drop=drop)
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = ChannelMlp(dim, int(channel_expansion * dim), drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = tuple(x.shape[1:3])
        if size != self.grid:  # RaftShrink: (B, h, w, C) -> trained grid
            x = rearrange(resize_grid(rearrange(x, 'b h w c -> b c h w'), self.grid), 'b c h w -> b h w c')
        # the vertical residual is stored (B, h, w, C) for the horizontal mixing, the block's output (B, w, h, C)
        # for the next block's norm and vertical mixing (in eager inference; see ``add_tokens``)
        x = add_tokens(x, self.drop_path(self.vertical(_token_norm(self.norm1, x))))
        x = x + self.drop_path(self.horizontal(self.norm2(x)))
        if size != self.grid:  # RaftExpansion: back to the input grid before channel mixing
            x = rearrange(resize_grid(rearrange(x, 'b h w c -> b c h w'), size), 'b c h w -> b h w c')
        # stored (B, w, h, C), see above
        return add_tokens(x, self.drop_path(self.mlp(self.norm3(x))), swap_hw=True)


def _token_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A per-token norm of (B, h, w, C) tokens stored either way (per token, so it commutes with h <-> w)."""
    if not x.is_contiguous() and x.transpose(1, 2).is_contiguous():
        return norm(x.transpose(1, 2)).transpose(1, 2)
    return norm(x)


class RaftLevel(nn.Module):
    """Embedding (with the official bicubic pad-up to a multiple of the patch) -> blocks -> NCHW map."""

    def __init__(self, in_chs: int, out_chs: int, depth: int, kernels: Sequence[int], grid: tuple[int, int],
                 **block_kwargs):
        super().__init__()
        self.embed = CrossScaleEmbedding(in_chs, out_chs, kernels)
        self.blocks = nn.Sequential(*[RaftBlock(out_chs, grid, **block_kwargs) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_map(self.blocks(self.embed_input(x)))

    def embed_input(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, H/p, W/p, D) tokens, after the official bicubic pad-up to a multiple of p."""
        p = self.embed.patch
        h, w = x.shape[-2:]
        if h % p or w % p:
            x = F.interpolate(x, size=(math.ceil(h / p) * p, math.ceil(w / p) * p), mode='bicubic',
                              align_corners=False)
        return self.embed(x)

    @staticmethod
    def to_map(t: torch.Tensor) -> torch.Tensor:
        return rearrange(t, 'b h w c -> b c h w')


class RaftMLP(ClassifierBase):
    """RaftMLP: four levels of raft blocks with cross-scale MLP embeddings.

    Args:
        dims, depths: channels and blocks per level.
        patch_sizes: stride of each level's embedding; ``kernels`` the embedding's window sizes per level
            (the first of each list is the patch size).
        raft_size: r, channels per raft (every level).
        token_expansion, channel_expansion: hidden ratios of the raft and channel MLPs.
        drop_path_rate: the same rate on every sub-block (the official regularisation).
        img_size: the grid the token MLPs are built for (other sizes are resized, see the module docstring).
        features_only: return the level maps of ``out_indices`` instead of logits.
    """

    def __init__(self, dims: Sequence[int] = (64, 128, 256, 512), depths: Sequence[int] = (2, 2, 6, 2),
                 patch_sizes: Sequence[int] = (4, 2, 2, 2),
                 kernels: Sequence[Sequence[int]] = ((4, 8), (2, 4), (2, 4), (2,)), raft_size: int = 2,
                 token_expansion: float = 2.0, channel_expansion: float = 4.0, num_classes: int = 1000,
                 in_chans: int = 3, drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 img_size: int | Sequence[int] = 224, features_only: bool = False,
                 out_indices: Sequence[int] | None = None):
        super().__init__()
        n = len(dims)
        if not len(depths) == len(patch_sizes) == len(kernels) == n:
            raise ValueError(f'dims, depths, patch_sizes and kernels need one entry per level, got {len(dims)}, '
                             f'{len(depths)}, {len(patch_sizes)}, {len(kernels)}')
        for p, ks in zip(patch_sizes, kernels):
            if ks[0] != p:
                raise ValueError(f'each level\'s first kernel must be its patch size; got kernels {ks} for patch {p}')
        self.num_classes, self.in_chans, self.num_features = num_classes, in_chans, dims[-1]
        self.raft_size = raft_size
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        levels, info, prev, stride = [], [], in_chans, 1
        grid = self.img_size
        for i in range(n):
            stride *= patch_sizes[i]
            grid = (math.ceil(grid[0] / patch_sizes[i]), math.ceil(grid[1] / patch_sizes[i]))
            levels.append(RaftLevel(prev, dims[i], depths[i], kernels[i], grid, raft_size=raft_size,
                                    token_expansion=token_expansion, channel_expansion=channel_expansion,
                                    drop=drop_rate, drop_path=drop_path_rate))
            info.append(FeatureInfo(dims[i], stride, f'levels.{i}'))
            prev = dims[i]
        self.levels = nn.Sequential(*levels)
        self.features_only = features_only
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        self.norm = None if features_only else nn.LayerNorm(dims[-1])
        self.head = None if features_only else nn.Linear(dims[-1], num_classes)

    classifier_prefix = 'head'
    first_conv = 'levels.0.embed.proj'  # the cross-scale embedding's Linear over the unfolded windows

    def _check(self, x: torch.Tensor) -> None:
        check_image(x, self.in_chans, min_size=1, model=getattr(self, 'zoo_name', 'RaftMLP'))

    # -- the stages timm's contract runs (zoo._builder.ClassifierBase): the levels ------------------------
    stages_attr = 'levels'
    stem_names = ()  # each level embeds its own input

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return x

    def stage_blocks(self, i: int) -> list:
        level = self.levels[i]
        return [level.embed_input, *level.blocks, level.to_map]

    def block_patterns(self):
        return [(r'^levels\.(\d+)\.blocks\.(\d+)\.', None), (r'^levels\.(\d+)\.', None)]  # embedding first

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': the unpooled maps
            return x
        x = self.norm(rearrange(x, 'b c h w -> b h w c')).mean((1, 2))  # LN per token, then mean over tokens
        return x if pre_logits else self.head(x)

    # ---- checkpoint key mapping -------------------------------------------------------------------

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """Map an official RaftMLP state dict (okojoalg/raft-mlp, ``shortcut=False``, cross-scale MLP
        embedding: the published S/M/L) onto ours.

        Official: ``levels.i.fn.0.fc`` (embedding), ``levels.i.fn.{2+j}.{1,3,5}`` (block j: vertical,
        horizontal and channel sub-blocks, each ``norm`` + ``fn.{0,3}``), ``heads.0.1`` (final LN),
        ``classifier``. The official vertical/horizontal LayerNorms see a token's channels in (co, r)
        order (raft-major) while ours see them in the natural (r co) order, so their weights are permuted.
        Our own layout passes through.
        """
        if any(k.startswith('levels.0.embed.') for k in state_dict):
            return dict(state_dict)
        if not any(re.match(r'^levels\.\d+\.fn\.', k) for k in state_dict):
            raise KeyError('not a RaftMLP state dict: expected levels.*.embed (zoo) or levels.*.fn.* (official) '
                           f'keys; got {list(state_dict)[:6]}...')
        if any(k.startswith('heads.1.') for k in state_dict):
            raise KeyError('this official RaftMLP was trained with shortcut=True (per-level heads), a different '
                           'model that zoo RaftMLP does not implement')
        out = {}
        for k, v in state_dict.items():
            for pattern, repl in _RAFT_FROM_OFFICIAL:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            if re.search(r'\.norm[12]\.', k):  # official (co r) channel order -> ours (r co)
                v = rearrange(v, '(co r) -> (r co)', r=self.raft_size)
            out[k] = v
        return out

    def to_official(self, state_dict: dict) -> dict:
        """Our state dict in the official layout (the inverse of ``remap_checkpoint``)."""
        out = {}
        for k, v in state_dict.items():
            if re.search(r'\.norm[12]\.', k):
                v = rearrange(v, '(r co) -> (co r)', r=self.raft_size)
            for pattern, repl in _RAFT_TO_OFFICIAL:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            out[k] = v
        return out


# (official, ours) module paths inside block j (official ``levels.i.fn.{2+j}``), and at the top level.
_RAFT_BLOCK_KEYS = [('1.norm.1', 'norm1'), ('1.fn.0', 'vertical.fc1'), ('1.fn.3', 'vertical.fc2'),
                    ('3.norm.1', 'norm2'), ('3.fn.0', 'horizontal.fc1'), ('3.fn.3', 'horizontal.fc2'),
                    ('5.norm', 'norm3'), ('5.fn.0', 'mlp.0'), ('5.fn.3', 'mlp.3')]
_RAFT_TOP_KEYS = [('heads.0.1', 'norm'), ('classifier', 'head')]
# (regex, replacement) pairs, first match wins.
_RAFT_FROM_OFFICIAL = (
    [(r'^levels\.(\d+)\.fn\.0\.fc\.', r'levels.\1.embed.proj.')]
    + [(rf'^levels\.(\d+)\.fn\.(\d+)\.{re.escape(a)}\.', lambda m, b=b: f'levels.{m[1]}.blocks.{int(m[2]) - 2}.{b}.')
       for a, b in _RAFT_BLOCK_KEYS]
    + [(rf'^{re.escape(a)}\.', f'{b}.') for a, b in _RAFT_TOP_KEYS])
_RAFT_TO_OFFICIAL = (
    [(r'^levels\.(\d+)\.embed\.proj\.', r'levels.\1.fn.0.fc.')]
    + [(rf'^levels\.(\d+)\.blocks\.(\d+)\.{re.escape(b)}\.', lambda m, a=a: f'levels.{m[1]}.fn.{int(m[2]) + 2}.{a}.')
       for a, b in _RAFT_BLOCK_KEYS]
    + [(rf'^{re.escape(b)}\.', f'{a}.') for a, b in _RAFT_TOP_KEYS])



def _create(cfg: dict, kwargs: dict) -> RaftMLP:
    return build_model(RaftMLP, cfg, kwargs)


_RAFT = dict(family='raftmlp', paper='RaftMLP: How Much Can Be Done Without Attention and with Less Spatial '
             'Locality? (arXiv 2108.04384)', repo='https://github.com/okojoalg/raft-mlp', input_size=(3, 224, 224),
             capabilities=('features', 'any_resolution', 'official_weights'), tiny='raftmlp_tiny')
_COMMON = dict(depths=(2, 2, 6, 2), patch_sizes=(4, 2, 2, 2), kernels=((4, 8), (2, 4), (2, 4), (2,)), raft_size=2,
               token_expansion=2.0, channel_expansion=4.0, drop_path_rate=0.1)


# params: counted on the official code at 224 (exact); macs: fvcore total on the official code.
@register_model(**_RAFT, params=9_868_768, macs=2_101_456_384, top1=76.1)
def raftmlp_s(**kwargs):
    """RaftMLP-S (``imagenet-raft-mlp-cross-mlp-emb-s``)."""
    return _create(dict(**_COMMON, dims=(64, 128, 256, 512)), kwargs)


@register_model(**_RAFT, params=21_413_632, macs=4_288_972_032, top1=78.8)
def raftmlp_m(**kwargs):
    """RaftMLP-M (``imagenet-raft-mlp-cross-mlp-emb-m``)."""
    return _create(dict(**_COMMON, dims=(96, 192, 384, 768)), kwargs)


@register_model(**_RAFT, params=36_184_672, macs=6_571_320_320, top1=79.4)
def raftmlp_l(**kwargs):
    """RaftMLP-L (``imagenet-raft-mlp-cross-mlp-emb-l``); the level-1 width is 192, not 256, as in the config."""
    return _create(dict(**_COMMON, dims=(128, 192, 512, 1024)), kwargs)


@register_model(**{**_RAFT, 'input_size': (3, 32, 32)})
def raftmlp_tiny(**kwargs):
    """A CPU-sized RaftMLP for tests and digits (32x32 inputs, grids 8/4/2/1, about 0.2 M params)."""
    return _create(dict(**{**_COMMON, 'depths': (1, 1, 2, 1), 'drop_path_rate': 0.0}, dims=(32, 48, 64, 96),
                        img_size=32), kwargs)
