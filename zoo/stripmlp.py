"""Strip-MLP (T*, T, S, B).

"Strip-MLP: Efficient Token Interaction for Vision MLP", Cao et al., ICCV 2023, arXiv 2307.11458.
Official code: https://github.com/Med-Process/Strip_MLP @ 492d705 (``models/strip_mlp.py``,
``configs/smlp_*_imagenet1k.yaml``).

A 4x4/s4 conv stem, four stages at widths C, 2C, 4C, 8C (2x2/s2 conv merging between them), plus
grouped 2x2/s2 cross-scale shortcuts from stage 1 to stages 3 and 4 and from stage 2 to stage 4.
A block is ``x + DP(token_mixing(x))``, ``x + DP(channel_mixing(x))``; token mixing is
``zoo.layers.strip.StripTokenMixer`` (DW conv, then the Strip MLP block with CGSMM and LSMM), channel
mixing is DW7x7 -> LN -> Linear(C, 3C) -> GELU -> GRN(3C) -> Linear(3C, C). Head: BN -> mean -> linear.

Official quirks, all kept because the published numbers depend on them:
- channel groups by width: p = 2 when the block width is a multiple of 80, else 4 (T*/T use 2, S/B 4);
  changing it changes the S/B parameter counts;
- drop path is hard-wired to 0.1 on both residuals of every block (no depth schedule; the configs'
  drop-path rate never reaches it): ``drop_path_rate=0.1`` is that constant, and is a real argument here
  so that tiny CPU models can turn it off;
- GRN is as wide as the hidden layer, which the code hard-wires to 3C, so ``mlp_ratio`` is fixed at 3;
- the LSMM reweight MLP's hidden width is a quarter of the full block width (required by the counts);
- GAP before the reweight MLP (the code), not after (the paper's figure);
- PyTorch default init, relative-position tables trunc_normal(.02), GRN gamma = beta = 0.
The weights depend on the input size (strip weights are W x W): the model is built for ``img_size`` and
any other input raises an error naming the size it was built for. Inputs must be square.

Official checkpoints (``StripMLPNet`` state dicts, optionally under ``'model'``) load with
``zoo.create(name, checkpoint=path)`` through ``StripMLP.remap_checkpoint``; ``StripMLP.to_official`` writes
our weights in that layout. With the same weights the logits equal the official model's to float rounding
(tests/test_fidelity.py, docs/fidelity.md).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from einops import rearrange
from torch import nn

from zoo.layers import DropPath
from zoo.layers.onednn import conv_bn_act, eager_inference, exact_gelu, linear
from zoo.layers.strip import StripTokenMixer

from ._builder import ClassifierBase, FeatureInfo, build_model, check_image, run_blocks, select_features
from ._registry import register_model

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')

__all__ = ['StripMLP', 'StripBlock', 'GRN']

_AFTER = 99998  # timm group_matcher suffix: after every block of the stage (99999 is timm's "previous group")


class GRN(nn.Module):
    """Global response norm (ConvNeXt V2) on (B, H, W, C): ``x + gamma * x * N(x) + beta``, gamma = beta = 0."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not eager_inference():  # autograd, compile, export: one op (a loop over the batch would pin its size)
            gx = torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True)  # (B, 1, 1, C): L2 over the grid
        else:  # the same norm; in eager vector_norm over leading dims is 3-10x slower than squares summed per sample
            gx = torch.stack([t.square().sum((0, 1), keepdim=True) for t in x]).sqrt()  # (B, 1, 1, C)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + self.eps)  # relative to the channel mean
        return torch.addcmul(self.beta, x, self.gamma * nx + 1)  # gamma * (x * nx) + beta + x, in one pass


class ChannelMixing(nn.Module):
    """DW7x7 -> LayerNorm -> Linear(C, 3C) -> GELU -> GRN(3C) -> Linear(3C, C), NCHW in and out."""

    def __init__(self, dim: int, mlp_ratio: int = 3):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.act = nn.GELU()
        self.grn = GRN(mlp_ratio * dim)
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = rearrange(conv_bn_act(x, self.dwconv), 'b c h w -> b h w c')
        if exact_gelu(self.act):  # oneDNN in inference, GELU fused
            t = linear(self.grn(linear(self.norm(t), self.fc1, gelu=True)), self.fc2)
        else:
            t = self.fc2(self.grn(self.act(self.fc1(self.norm(t)))))
        return rearrange(t, 'b h w c -> b c h w')


class StripBlock(nn.Module):
    """``x + DP(token_mixing(x))``; ``x + DP(channel_mixing(x))`` on (B, C, s, s)."""

    def __init__(self, dim: int, size: int, drop_path: float = 0.1):
        super().__init__()
        self.token_mixing = StripTokenMixer(dim, (size, size))
        self.channel_mixing = ChannelMixing(dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.token_mixing(x))
        return x + self.drop_path(self.channel_mixing(x))


class StripMLP(ClassifierBase):
    """Strip-MLP with cross-scale shortcuts.

    Args:
        embed_dim: C; the stages have C, 2C, 4C, 8C channels at strides 4, 8, 16, 32.
        depths: blocks per stage (exactly four stages: the cross-scale shortcuts are wired for four).
        drop_path_rate: the constant rate of every residual (official: 0.1, hard-wired).
        img_size: the square input size the weights are built for.
        features_only: return the stage maps of ``out_indices`` instead of logits.
    """

    def __init__(self, embed_dim: int = 80, depths: Sequence[int] = (2, 2, 6, 2), num_classes: int = 1000,
                 in_chans: int = 3, drop_path_rate: float = 0.1, img_size: int = 224, features_only: bool = False,
                 out_indices: Sequence[int] | None = None):
        super().__init__()
        if len(depths) != 4:
            raise ValueError(f'Strip-MLP has four stages (its cross-scale shortcuts are wired for four), got depths '
                             f'{tuple(depths)}')
        if not isinstance(img_size, int):
            if img_size[0] != img_size[1]:
                raise ValueError(f'Strip-MLP needs square inputs, got img_size={tuple(img_size)}')
            img_size = int(img_size[0])
        if img_size % 32:
            raise ValueError(f'Strip-MLP needs img_size divisible by 32 (four halvings after a stride-4 stem), '
                             f'got {img_size}')
        c = embed_dim
        dims = [c, 2 * c, 4 * c, 8 * c]
        self.img_size, self.num_classes, self.in_chans, self.num_features = img_size, num_classes, in_chans, dims[-1]
        self.patch_embed = nn.Conv2d(in_chans, c, 4, stride=4, bias=False)
        self.stages = nn.ModuleList(
            nn.Sequential(*[StripBlock(dims[i], img_size // (4 * 2 ** i), drop_path_rate) for _ in range(depths[i])])
            for i in range(4))
        self.merging = nn.ModuleList(nn.Conv2d(dims[i], dims[i + 1], 2, stride=2, bias=False) for i in range(3))
        # Cross-scale shortcuts (grouped 2x2/s2, no bias): stage-2 input -> stage 3 and 4; stage-3 input -> stage 4.
        self.conv_s1_28 = nn.Conv2d(2 * c, 4 * c, 2, stride=2, groups=2 * c, bias=False)
        self.conv_s1_14 = nn.Conv2d(4 * c, 8 * c, 2, stride=2, groups=4 * c, bias=False)
        self.conv_s2_14 = nn.Conv2d(4 * c, 8 * c, 2, stride=2, groups=4 * c, bias=False)
        info = [FeatureInfo(dims[i], 4 * 2 ** i, f'stages.{i}') for i in range(4)]
        self.features_only = features_only
        self.out_indices, self.feature_info = select_features(info, out_indices, features_only)
        self.norm = None if features_only else nn.BatchNorm2d(dims[-1])
        self.head = None if features_only else nn.Linear(dims[-1], num_classes)

    classifier_prefix = 'head'
    first_conv = 'patch_embed'
    fixed_input_size = True  # the strip mixers' weights depend on the grid

    # -- the stages timm's contract runs (zoo._builder.ClassifierBase) --------------------------------------
    stem_names = ('patch_embed',)

    def forward_stem(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, min_size=32, model=getattr(self, 'zoo_name', 'StripMLP'),
                    fixed_size=(self.img_size, self.img_size))
        # Channels-last memory (logically still NCHW): the convolutions run on oneDNN's NHWC kernels and the
        # channel MLP's (B, H, W, C) view is contiguous (no copy before its LayerNorm).
        return conv_bn_act(x.contiguous(memory_format=torch.channels_last), self.patch_embed)  # (B, C, s/4, s/4)

    def forward_stage(self, i: int, state):
        """Stage ``i`` with the merging before it and the cross-scale shortcuts into it (official dataflow: the
        stage-2 input goes to stages 3 and 4, the stage-3 input to stage 4). The state is (the stage's output,
        the merged inputs of stages 2 and 3 (B, 2C, s/8, s/8) / (B, 4C, s/16, s/16), the shortcut into stage 3)."""
        def run(x: torch.Tensor) -> torch.Tensor:
            return run_blocks(self.stages[i], x, self._checkpointing())

        if i == 0:
            return (run(state),)
        x = state[0]
        if i == 1:
            m1 = conv_bn_act(x, self.merging[0])                       # (B, 2C, s/8, s/8)
            return run(m1), m1
        if i == 2:
            m2 = conv_bn_act(x, self.merging[1])                       # (B, 4C, s/16, s/16)
            s1_16 = conv_bn_act(state[1], self.conv_s1_28)             # (B, 4C, s/16, s/16)
            return run(m2 + s1_16), m2, s1_16
        s1_32 = conv_bn_act(state[2], self.conv_s1_14)                 # (B, 8C, s/32, s/32)
        s2_32 = conv_bn_act(state[1], self.conv_s2_14)                 # (B, 8C, s/32, s/32)
        return (run(conv_bn_act(x, self.merging[2]) + s1_32 + s2_32),)

    def stage_output(self, i: int, state, norm: bool = False) -> torch.Tensor:
        return state[0]  # (B, 2^i C, s/(4 * 2^i), s/(4 * 2^i))

    def forward_final(self, state) -> torch.Tensor:
        """(B, 8C, S/32, S/32) for an input of S = img_size."""
        return state[0]

    def truncate_stages(self, n: int) -> None:
        self.stages, self.merging = self.stages[:n], self.merging[:n - 1]
        for i, names in ((2, ('conv_s1_28',)), (3, ('conv_s1_14', 'conv_s2_14'))):  # the shortcuts into stage i
            if n <= i:
                for name in names:
                    setattr(self, name, None)

    def block_patterns(self):
        # a merging (and the shortcuts) into stage i + 1 after stage i's blocks
        return [(r'^stages\.(\d+)\.(\d+)\.', None), (r'^merging\.(\d+)\.', (_AFTER,)),
                (r'^conv_s1_28\.', (1, _AFTER)), (r'^conv_s(?:1|2)_14\.', (2, _AFTER))]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if not self.global_pool:  # global_pool='': the unpooled maps
            return x
        x = self.norm(x).mean((2, 3))  # BN, then global average pool
        return x if pre_logits else self.head(x)

    # ---- checkpoint key mapping -------------------------------------------------------------------

    @staticmethod
    def remap_checkpoint(state_dict: dict) -> dict:
        """Map an official ``StripMLPNet`` state dict (Med-Process/Strip_MLP) onto ours.

        Official: ``blocks{1..4}.j.token_mixing.{dwsc.conv_merge.{BN,Conv}, smlp_block.*}``,
        ``blocks{k}.j.channel_mixing.{conv_77, layer_norm, fc1, grn, fc2}``, ``merging{1..3}``, ``norm``,
        ``head`` (the checkpoints wrap it in ``{'model': ...}``, which ``zoo.create(checkpoint=...)``
        unwraps). GRN's gamma/beta are stored as (1, 1, 1, C), ours as (C,). Our own layout passes through.
        """
        if 'stages.0.0.token_mixing.dwsc.0.weight' in state_dict:
            return dict(state_dict)
        if not any(k.startswith('blocks1.') for k in state_dict):
            raise KeyError('not a Strip-MLP state dict: expected stages.* (zoo) or blocks1.* (official '
                           f'StripMLPNet) keys; got {list(state_dict)[:6]}...')
        out = {}
        for k, v in state_dict.items():
            for pattern, repl in _FROM_OFFICIAL:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            if k.endswith(('grn.gamma', 'grn.beta')):
                v = v.reshape(-1)  # (1, 1, 1, C) -> (C,)
            out[k] = v
        return out

    @staticmethod
    def to_official(state_dict: dict) -> dict:
        """Our state dict in the official ``StripMLPNet`` layout (the inverse of ``remap_checkpoint``)."""
        out = {}
        for k, v in state_dict.items():
            for pattern, repl in _TO_OFFICIAL:
                k, n = re.subn(pattern, repl, k)
                if n:
                    break
            if k.endswith(('grn.gamma', 'grn.beta')):
                v = v.reshape(1, 1, 1, -1)
            out[k] = v
        return out


# (official, ours) module paths inside one block, and at the top level.
_BLOCK_KEYS = [
    ('token_mixing.dwsc.conv_merge.BN', 'token_mixing.dwsc.0'),
    ('token_mixing.dwsc.conv_merge.Conv', 'token_mixing.dwsc.2'),
    ('token_mixing.smlp_block.mlp.0', 'token_mixing.strip.proj'),
    ('token_mixing.smlp_block.mlp.1', 'token_mixing.strip.norm'),
    ('token_mixing.smlp_block.BN', 'token_mixing.strip.cgsmm.norm'),
    ('token_mixing.smlp_block.proj_h', 'token_mixing.strip.cgsmm.proj_h.proj'),
    ('token_mixing.smlp_block.proj_w', 'token_mixing.strip.cgsmm.proj_w.proj'),
    ('token_mixing.smlp_block.fuse_h', 'token_mixing.strip.cgsmm.fuse_h'),
    ('token_mixing.smlp_block.fuse_w', 'token_mixing.strip.cgsmm.fuse_w'),
    ('token_mixing.smlp_block.relate_pos_h.embeddings_table', 'token_mixing.strip.cgsmm.pos_h.table'),
    ('token_mixing.smlp_block.relate_pos_w.embeddings_table', 'token_mixing.strip.cgsmm.pos_w.table'),
    ('token_mixing.smlp_block.fc_h', 'token_mixing.strip.lsmm.strip_w'),  # the 3x7 strip
    ('token_mixing.smlp_block.fc_w', 'token_mixing.strip.lsmm.strip_h'),  # the 7x3 strip
    ('token_mixing.smlp_block.reweight.fc1', 'token_mixing.strip.lsmm.reweight.0'),
    ('token_mixing.smlp_block.reweight.fc2', 'token_mixing.strip.lsmm.reweight.2'),
    ('token_mixing.smlp_block.fuse', 'token_mixing.strip.fuse'),
    ('channel_mixing.conv_77', 'channel_mixing.dwconv'),
    ('channel_mixing.layer_norm', 'channel_mixing.norm'),
]
# (regex, replacement) pairs, first match wins; every module path is anchored at a dot or the end, so
# that 'fuse' never hits 'fuse_h'.
_FROM_OFFICIAL = (
    [(rf'^blocks([1-4])\.(\d+)\.{re.escape(a)}(\.|$)', lambda m, b=b: f'stages.{int(m[1]) - 1}.{m[2]}.{b}{m[3]}')
     for a, b in _BLOCK_KEYS]
    + [(r'^blocks([1-4])\.', lambda m: f'stages.{int(m[1]) - 1}.'),
       (r'^merging([1-3])\.', lambda m: f'merging.{int(m[1]) - 1}.')])
_TO_OFFICIAL = (
    [(rf'^stages\.([0-3])\.(\d+)\.{re.escape(b)}(\.|$)', lambda m, a=a: f'blocks{int(m[1]) + 1}.{m[2]}.{a}{m[3]}')
     for a, b in _BLOCK_KEYS]
    + [(r'^stages\.([0-3])\.', lambda m: f'blocks{int(m[1]) + 1}.'),
       (r'^merging\.([0-2])\.', lambda m: f'merging{int(m[1]) + 1}.')])


def _create(cfg: dict, kwargs: dict) -> StripMLP:
    return build_model(StripMLP, cfg, kwargs)


_STRIP = dict(family='stripmlp', paper='Strip-MLP: Efficient Token Interaction for Vision MLP (ICCV 2023, '
              'arXiv 2307.11458)', repo='https://github.com/Med-Process/Strip_MLP', input_size=(3, 224, 224),
              capabilities=('features', 'fixed_size', 'official_weights'), tiny='stripmlp_tiny')


# params: counted on the official code at 224 (exact); macs: fvcore total on the official code.
@register_model(**_STRIP, params=18_243_920, macs=2_531_168_640, top1=81.2)
def stripmlp_t_star(**kwargs):
    """Strip-MLP-T* (``smlp_tiny_light``)."""
    return _create(dict(embed_dim=80, depths=(2, 2, 6, 2)), kwargs)


@register_model(**_STRIP, params=24_903_920, macs=3_664_763_520, top1=82.2)
def stripmlp_t(**kwargs):
    """Strip-MLP-T (``smlp_tiny``)."""
    return _create(dict(embed_dim=80, depths=(2, 2, 12, 2)), kwargs)


@register_model(**_STRIP, params=42_568_600, macs=6_827_708_160, top1=83.3)
def stripmlp_s(**kwargs):
    """Strip-MLP-S (``smlp_small``)."""
    return _create(dict(embed_dim=96, depths=(2, 2, 18, 2)), kwargs)


@register_model(**_STRIP, params=57_216_480, macs=9_213_617_280, top1=83.6)
def stripmlp_b(**kwargs):
    """Strip-MLP-B (``smlp_base``)."""
    return _create(dict(embed_dim=112, depths=(2, 2, 18, 2)), kwargs)


@register_model(**{**_STRIP, 'input_size': (3, 32, 32)})
def stripmlp_tiny(**kwargs):
    """A CPU-sized Strip-MLP for tests and digits (32x32 inputs, grids 8/4/2/1, C = 16, p = 4)."""
    return _create(dict(embed_dim=16, depths=(1, 1, 2, 1), drop_path_rate=0.0, img_size=32), kwargs)
