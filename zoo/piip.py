"""PIIP: Parameter-Inverted Image Pyramid Networks, on pure-PyTorch deformable interactions (runs on a CPU).

"Parameter-Inverted Image Pyramid Networks", Zhu, Yang, Wang et al., NeurIPS 2024, arXiv 2406.04330;
"... for Visual Perception and Multimodal Understanding", Wang, Zhu, Yang et al., arXiv 2501.07783.
Official code: https://github.com/OpenGVLab/PIIP (``classification/piip_3branch.py``, ``piip_modules.py``;
detection: ``mmdetection/mmdet/models/backbones/piip_3branch.py``). The official deformable attention is a
CUDA extension with no CPU path; ours is ``zoo.layers.deform_attn`` (one ``grid_sample`` per direction).

Branch order (the official one, easy to get backwards): ``branch1`` is the LARGEST model on the SMALLEST
image, the last branch the SMALLEST model on the LARGEST image. ``embed_dims`` must not increase and
``img_sizes`` must not decrease along the branches. PIIP-TSB 368/192/128 is branch1 = ViT-B @ 128,
branch2 = ViT-S @ 192, branch3 = ViT-T @ 368 (names list models small -> large, sizes large -> small).

Data flow: ONE image at the last (largest) branch's size; branch i gets it bilinearly resized
(``align_corners=False``) to round(size * s_i / s_last). Each branch patch-embeds its image (patch 16) and
adds its own position embedding. Then ``num_interactions`` stages (12 in all released configs): each branch
runs its blocks of the stage (``interaction_indexes``: every block for 12-layer ViTs, every second for 24-layer
ones), class tokens included, then the interaction units between neighbouring branches run from the
high-resolution pair inward (``zoo.layers.piip.InteractionBlock``; class tokens never interact).
Classification: each branch keeps its final LayerNorm and linear head; the logits are averaged
(``separate_head=True``, every released classification config).
``features_only=True`` (detection, ``with_simple_fpn``): each branch's token map -> Conv3x3 -> GN -> ReLU ->
Conv3x3 -> GN -> ReLU to the widest width D1, resized to the last branch's grid (stride 16 of the input),
weighted sum with learnable scalars (init 1), then ViTDet's simple pyramid (2x ConvT / ConvT / identity /
max-pool) -> strides 4, 8, 16, 32 with D1 channels each.

Choices, stated:
- Branches are timm's ``VisionTransformer`` (not a copy): DeiT-style branches use ``no_embed_class=True`` (the
  position embedding has no class slot, as in PIIP's ``deit.py``) and LayerScale with init 1.0 (PIIP's
  ``Layer_scale_init_Block`` with ``init_scale=1.0``; DeiT weights have no LayerScale, so those gammas stay 1
  and the block computes what DeiT does); AugReg-style branches are timm's plain ViT (class slot in the
  position embedding, no LayerScale). ``load_branch_weights`` reads timm DeiT / AugReg state dicts into a
  branch, dropping or keeping the class slot and resizing the position grid bicubically (official).
- Drop path is one rate for every block of a branch (official ``dpr = [rate] * depth``), not timm's ramp.
- Which token the heads read. The official 3-branch classifier splits the class tokens off after the blocks
  and then reads ``norm(x)[:, 0]``, i.e. each branch's first PATCH token; the released classification
  checkpoints were trained that way, and ``piip_tsb`` / ``piip_sbl`` / ``piip_tsbl`` do the same
  (``head_token='first_patch'``; an official ``piip_tsb`` checkpoint read through the class token gives logits
  0.48 off, relative). ``head_token='class'`` reads the class token instead (the ``PIIP`` class default and
  ``piip_tiny``'s): a branch at initialisation is then exactly its standalone ViT, at the price that the patch
  tokens after the LAST interaction step no longer reach the logits (that step's units get zero gradients in
  classification; they serve ``features_only``).
- AugReg branches keep the class slot of their position embedding (the official checkpoints hold it, and the
  branch's own timm forward adds it), but PIIP's embedding, like the official one, does not add it to the class
  token: the official ``augreg`` branch embeds ``pos_embed[:, 1:]`` into the patches only.
- Detection branches of the official code use window attention (14 or 28 tokens) and no class token. Here,
  ``features_only`` branches have no class token, no final norm and no head; ``window_size`` gives them the
  official window attention (``windowed_attention``; the ``PIIP`` default is global attention). The published
  variants with ``features_only=True`` are the official Mask R-CNN backbones: resolutions, window size,
  drop-path rates (the detection configs', not the classification ones) and branch style of the first config of
  each (``_DETECTION``), so ``zoo.create('piip_tsb', checkpoint=<official detection backbone or detector>)``
  builds and loads it with no other argument (the file's layout decides, ``checkpoint_head``).
- Position embeddings are stored on the patch grid of ``pos_embed_size`` (default: each branch's own size, as the
  official classifier). The official detection backbone keeps them on the 224-px pretraining grid (14 x 14) and
  resizes them bicubically to the branch's grid in every forward; the published variants with
  ``features_only=True`` do the same (``pos_embed_size=224``), so their parameters equal the official detection
  backbone's.
- TSBL: the official ``piip_4branch.py`` builds its fourth branch with the THIRD branch's settings, so the
  released TSBL has two ViT-S branches. ``piip_tsbl`` is that model (the released weights load into it);
  ``piip_tsbl_config`` the T/S/B/L its configs and the paper describe.
- Known differences in the forward: the official detection attention runs on float16 (its flash path casts qkv),
  ours in the input's dtype; the official non-flash ``WindowedAttention`` pads the token grid after the qkv
  projection, ours before it as the flash path the configs use does (the padded tokens' q, k, v are the qkv
  bias here and in the flash path, zeros in that fallback).
- No fp32 islands: the official code runs the injector residuals in fp32 under autocast; we leave dtype
  policy to the caller.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.layers.drop import DropPath
from zoo.layers.piip import InteractionBlock

from ._builder import (ClassifierBase, FeatureInfo, build_model, check_image, checkpointed, select_features, take_indices,
                       to_format)
from ._registry import register_model

__all__ = ['PIIP', 'default_interaction_indexes', 'load_branch_weights', 'windowed_attention']

BRANCH_STYLES = ('deit', 'augreg')


def default_interaction_indexes(depth: int, num_interactions: int) -> list[list[int]]:
    """Equal [start, end] block groups: 12 layers / 12 interactions -> [[0, 0], ..., [11, 11]];
    24 / 12 -> [[0, 1], [2, 3], ..., [22, 23]] (the released configs)."""
    if depth % num_interactions:
        raise ValueError(f'PIIP: depth {depth} is not a multiple of num_interactions={num_interactions}; '
                         f'pass interaction_indexes explicitly')
    k = depth // num_interactions
    return [[i * k, i * k + k - 1] for i in range(num_interactions)]


def _make_branch(style: str, img_size: int, patch_size: int, in_chans: int, num_classes: int, embed_dim: int,
                 depth: int, num_heads: int, drop_path_rate: float, class_token: bool):
    """timm ViT branch; ``img_size`` sets the patch grid its position embedding is stored on."""
    from timm.models.vision_transformer import VisionTransformer  # lazily: timm's import is heavy

    if style not in BRANCH_STYLES:
        raise ValueError(f'PIIP: unknown branch style {style!r}; expected one of {BRANCH_STYLES}')
    deit = style == 'deit'
    branch = VisionTransformer(
        img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes, embed_dim=embed_dim,
        depth=depth, num_heads=num_heads, mlp_ratio=4.0, qkv_bias=True, class_token=class_token,
        global_pool='token' if class_token else '', no_embed_class=deit, init_values=1.0 if deit else None,
        final_norm=class_token)
    for blk in branch.blocks:  # one rate for every block (official), not timm's linear ramp
        blk.drop_path1 = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        blk.drop_path2 = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
    branch.patch_embed.strict_img_size = False  # other input sizes resize the position grid (detection)
    return branch


def windowed_attention(attn: nn.Module, x: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """timm's ``Attention`` ((B, N, C) -> (B, N, C)) inside non-overlapping window x window blocks of the token
    grid. As the official detection branches (``WindowedFlashAttention``): the map is zero-padded to a multiple
    of the window BEFORE the qkv projection, padded tokens take part unmasked, and the output projection runs
    after the crop (it is per token, so only the padded tokens' cost is saved)."""
    b = x.shape[0]
    h, w = grid
    ph, pw = (-h) % window, (-w) % window
    x = F.pad(rearrange(x, 'b (h w) c -> b h w c', h=h, w=w), (0, 0, 0, pw, 0, ph))
    nh, nw = (h + ph) // window, (w + pw) // window
    x = rearrange(x, 'b (nh s) (nw t) c -> (b nh nw) (s t) c', nh=nh, nw=nw)  # (B*windows, window^2, C)
    q, k, v = rearrange(attn.qkv(x), 'n l (three m d) -> three n m l d', three=3, m=attn.num_heads)
    q, k = attn.q_norm(q), attn.k_norm(k)
    x = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if attn.training else 0.0)
    x = attn.norm(rearrange(x, 'n m l d -> n l (m d)'))  # timm's scale_norm (Identity in ViTs)
    x = rearrange(x, '(b nh nw) (s t) c -> b (nh s) (nw t) c', b=b, nh=nh, nw=nw, s=window)
    x = rearrange(x[:, :h, :w], 'b h w c -> b (h w) c')
    return attn.proj_drop(attn.proj(x))


def _run_block(blk: nn.Module, x: torch.Tensor, grid: tuple[int, int], window: int | None) -> torch.Tensor:
    """timm's Block.forward, with its attention in windows when ``window`` is set."""
    if not window:
        return blk(x)
    x = x + blk.drop_path1(blk.ls1(windowed_attention(blk.attn, blk.norm1(x), grid, window)))
    return x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))


def _resize_grid(pos: torch.Tensor, old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """(1, Ho*Wo, D) position embedding -> (1, Hn*Wn, D), bicubic, align_corners=False (official)."""
    if tuple(old) == tuple(new):
        return pos
    grid = rearrange(pos, '1 (h w) d -> 1 d h w', h=old[0], w=old[1])
    grid = F.interpolate(grid.float(), size=tuple(new), mode='bicubic', align_corners=False).to(pos.dtype)
    return rearrange(grid, '1 d h w -> 1 (h w) d')


class PIIP(ClassifierBase):
    """N ViT branches on one image at N resolutions, with bidirectional deformable interactions.

    N = 1 is the single-branch baseline: one ViT with the same heads (or detection pyramid) and no interactions.

    Args:
        img_sizes: input size of each branch, branch1 (smallest image, widest model) first. The model takes
            images of the last size.
        embed_dims, depths, num_heads: per branch (non-increasing widths).
        branch_style: 'deit' (LayerScale, position embedding without class slot) or 'augreg' (plain timm ViT),
            one for all branches or one per branch.
        drop_path_rates: per branch, one rate for all its blocks.
        num_interactions / interaction_indexes: the stage schedule; indexes are per branch lists of
            [start, end] block ranges of equal length (default: equal groups).
        deform_num_heads, n_points, deform_ratio, cffn_ratio, interaction_drop_path_rate: the interaction units
            (released: 16, 4, 0.5, 0.25, 0.4).
        head_token: 'first_patch' (the official classifier's reading, which the published variants use) or
            'class' (each head reads its class token; identity with the standalone ViTs at initialisation).
        window_size: window attention (tokens per side) in every block, one for all branches or one per branch
            (None = global); ``features_only`` only. Official detection configs: 14 (TSB), 28 (SBL, TSBL).
        pos_embed_size: image size (px) whose patch grid each branch's position embedding is stored on, resized
            bicubically to the actual grid in every forward; one for all branches or one per branch (None = the
            branch's own img_size). The official detection backbone: 224 (its ``pretrain_img_size``).
        features_only / out_indices: return the 4-level detection pyramid (strides 4/8/16/32, D1 channels).
    """

    def __init__(self, img_sizes: Sequence[int] = (128, 192, 368), embed_dims: Sequence[int] = (768, 384, 192),
                 depths: Sequence[int] = (12, 12, 12), num_heads: Sequence[int] = (12, 6, 3),
                 branch_style: str | Sequence[str] = 'deit', num_classes: int = 1000, in_chans: int = 3,
                 patch_size: int = 16, drop_path_rates: Sequence[float] | None = None,
                 num_interactions: int = 12, interaction_indexes: Sequence[Sequence[Sequence[int]]] | None = None,
                 deform_num_heads: int = 16, n_points: int = 4, deform_ratio: float = 0.5, cffn_ratio: float = 0.25,
                 interaction_drop_path_rate: float = 0.4, head_token: str = 'class',
                 window_size: int | Sequence[int | None] | None = None,
                 pos_embed_size: int | Sequence[int | None] | None = None, features_only: bool = False,
                 out_indices: Sequence[int] | None = None):
        super().__init__()
        n = len(img_sizes)
        for name, v in (('embed_dims', embed_dims), ('depths', depths), ('num_heads', num_heads)):
            if len(v) != n:
                raise ValueError(f'PIIP: {name} has {len(v)} entries but img_sizes has {n} (one per branch)')
        if n < 1:
            raise ValueError('PIIP needs at least one branch (img_sizes is empty)')
        if any(a < b for a, b in zip(embed_dims, embed_dims[1:])):
            raise ValueError(f'PIIP: embed_dims must not increase from branch1 (widest model, smallest image) '
                             f'to the last branch, got {tuple(embed_dims)}')
        if any(a > b for a, b in zip(img_sizes, img_sizes[1:])):
            raise ValueError(f'PIIP: img_sizes must not decrease from branch1 (smallest image) to the last '
                             f'branch (largest image), got {tuple(img_sizes)}')
        if any(s % patch_size for s in img_sizes):
            raise ValueError(f'PIIP: every img_size must be a multiple of patch_size={patch_size}, '
                             f'got {tuple(img_sizes)}')
        if head_token not in ('class', 'first_patch'):
            raise ValueError(f"PIIP: head_token must be 'class' or 'first_patch', got {head_token!r}")
        self.head_token = head_token
        windows = [window_size] * n if window_size is None or isinstance(window_size, int) else list(window_size)
        if len(windows) != n:
            raise ValueError(f'PIIP: window_size needs one entry per branch ({n}), got {window_size!r}')
        if any(windows) and not features_only:
            raise ValueError('PIIP: window_size (window attention, the official detection branches) needs '
                             'features_only=True: the classification branches attend globally with a class token')
        self.window_sizes = [int(w) if w else None for w in windows]
        pos_sizes = ([pos_embed_size] * n if pos_embed_size is None or isinstance(pos_embed_size, int)
                     else list(pos_embed_size))
        if len(pos_sizes) != n:
            raise ValueError(f'PIIP: pos_embed_size needs one entry per branch ({n}), got {pos_embed_size!r}')
        pos_sizes = [s if p is None else p for p, s in zip(pos_sizes, img_sizes)]
        if any(p <= 0 or p % patch_size for p in pos_sizes):
            raise ValueError(f'PIIP: pos_embed_size must be positive multiples of patch_size={patch_size}, '
                             f'got {pos_embed_size!r}')
        styles = [branch_style] * n if isinstance(branch_style, str) else list(branch_style)
        drop_path_rates = [0.0] * n if drop_path_rates is None else list(drop_path_rates)
        if interaction_indexes is None:
            interaction_indexes = [default_interaction_indexes(d, num_interactions) for d in depths]
        if len(styles) != n or len(drop_path_rates) != n:
            raise ValueError(f'PIIP: branch_style and drop_path_rates need one entry per branch ({n}), got '
                             f'{branch_style!r} and {drop_path_rates!r}')
        if len(interaction_indexes) != n or len({len(ix) for ix in interaction_indexes}) != 1:
            raise ValueError('PIIP: interaction_indexes needs one list of [start, end] ranges per branch, all of '
                             'the same length')
        for i, (ix, d) in enumerate(zip(interaction_indexes, depths)):
            if [b for s, e in ix for b in range(s, e + 1)] != list(range(d)):
                raise ValueError(f'PIIP: the interaction_indexes of branch{i + 1} ({ix}) must cover its {d} blocks '
                                 f'in order, each once')
        self.img_sizes, self.embed_dims, self.patch_size = tuple(img_sizes), tuple(embed_dims), patch_size
        self.num_branches, self.in_chans, self.num_classes = n, in_chans, num_classes
        self.interaction_indexes = [[list(r) for r in ix] for ix in interaction_indexes]
        self.features_only = features_only
        for i in range(n):
            self.add_module(f'branch{i + 1}', _make_branch(
                styles[i], pos_sizes[i], patch_size, in_chans, 0 if features_only else num_classes, embed_dims[i],
                depths[i], num_heads[i], drop_path_rates[i], class_token=not features_only))
        # one branch: no interactions, a plain ViT (with the same heads / pyramid): PIIP's single-branch baseline
        self.interactions = nn.Sequential(*[
            InteractionBlock(embed_dims, num_heads=deform_num_heads, num_points=n_points, deform_ratio=deform_ratio,
                             cffn_ratio=cffn_ratio, drop_path=interaction_drop_path_rate)
            for _ in range(len(self.interaction_indexes[0]))] if n > 1 else [])
        self.num_features = sum(embed_dims)  # pre-logits: the branches' pooled tokens, concatenated
        d1 = embed_dims[0]
        if not features_only:
            # the classifier's stages are the interaction stages; each gives the last branch's patch tokens (the
            # full-size image, stride = patch) as a map, made by that stage's interaction units (one branch: its
            # last block of the stage)
            self.feature_info = [FeatureInfo(embed_dims[-1], patch_size, f'interactions.{s}' if n > 1 else
                                             f'branch1.blocks.{end}')
                                 for s, (_, end) in enumerate(self.interaction_indexes[-1])]
        else:
            self.feature_info = [FeatureInfo(d1, 4, 'fpn1'), FeatureInfo(d1, 8, 'fpn2'),
                                 FeatureInfo(d1, 16, 'fpn3'), FeatureInfo(d1, 32, 'fpn4')]
            if d1 % 32:
                raise ValueError(f'PIIP features_only: the widest branch ({d1}) must be a multiple of 32 '
                                 f'(GroupNorm(32) in the branch merge and the pyramid)')
            self.out_indices, self.feature_info = select_features(self.feature_info, out_indices, True)
            for i, d in enumerate(embed_dims):
                self.add_module(f'merge_branch{i + 1}', nn.Sequential(
                    nn.Conv2d(d, d1, 3, padding=1, bias=False), nn.GroupNorm(32, d1), nn.ReLU(inplace=True),
                    nn.Conv2d(d1, d1, 3, padding=1, bias=False), nn.GroupNorm(32, d1), nn.ReLU(inplace=True)))
                self.register_parameter(f'w{i + 1}', nn.Parameter(torch.tensor(1.0)))
            self.fpn1 = nn.Sequential(nn.ConvTranspose2d(d1, d1, 2, 2), nn.GroupNorm(32, d1), nn.GELU(),
                                      nn.ConvTranspose2d(d1, d1, 2, 2))
            self.fpn2 = nn.ConvTranspose2d(d1, d1, 2, 2)
            self.fpn3 = nn.Identity()
            self.fpn4 = nn.MaxPool2d(2, 2)
            self._levels = 4
            for m in [getattr(self, f'merge_branch{i + 1}') for i in range(n)] + [self.fpn1, self.fpn2]:
                m.apply(_init_dense)

    # -- structure ------------------------------------------------------------------------------------------
    @property
    def branches(self) -> list[nn.Module]:
        return [getattr(self, f'branch{i + 1}') for i in range(self.num_branches)]

    def no_weight_decay(self) -> set[str]:
        return {f'branch{i + 1}.{k}' for i in range(self.num_branches) for k in ('pos_embed', 'cls_token')}

    # -- what the model takes (pretrained_cfg) -------------------------------------------------------------
    global_pool = 'token'  # each head's token (``head_token``: the class token or the first patch token)
    pool_types = ('token', '')
    stage_modules_give_maps = False  # the interaction units give every branch's tokens

    @property
    def first_conv(self) -> tuple[str, ...]:
        return tuple(f'branch{i + 1}.patch_embed.proj' for i in range(self.num_branches))

    @property
    def fixed_input_size(self) -> bool:
        """The classifier takes its one size (position embeddings at each branch's grid); the detection pyramid any."""
        return not self.features_only

    @property
    def min_input_size(self) -> tuple[int, int, int]:
        """The smallest square input every branch can take: each branch image (``branch_inputs``) at least one patch
        and a multiple of the patch size. The classifier: its one size."""
        p, last = self.patch_size, self.img_sizes[-1]
        side = last
        if self.features_only:
            side = p
            while not all(round(side * s / last) >= p and round(side * s / last) % p == 0 for s in self.img_sizes):
                side += p  # ends at img_sizes[-1] at the latest: the sizes are multiples of p
        return self.in_chans, side, side

    def unpooled_size(self, h: int, w: int) -> None:
        return None  # forward_features gives each branch's tokens

    # -- forward --------------------------------------------------------------------------------------------
    def _img_sizes_for(self, h: int, w: int) -> str:
        """The ``img_sizes`` argument that builds this pyramid for an ``h`` x ``w`` input: the same ratios,
        each a multiple of the patch size."""
        p, last = self.patch_size, self.img_sizes[-1]
        side = max(p, round(max(h, w) / p) * p)  # the largest branch takes the input itself
        sizes = tuple(max(p, round(side * s / last / p) * p) for s in self.img_sizes[:-1]) + (side,)
        note = [] if h == w else ['PIIP takes square inputs']
        if side != max(h, w):
            note.append(f'sides must be multiples of patch_size={p}')
        return f'img_sizes={sizes}' + (f" and a {side}x{side} input ({'; '.join(note)})" if note else '')

    def branch_inputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """One image -> one image per branch: bilinear resize to round(side * s_i / s_last)."""
        h, w = x.shape[-2:]
        last = self.img_sizes[-1]
        out = []
        for s in self.img_sizes:
            size = (round(h * s / last), round(w * s / last))
            out.append(x if size == (h, w) else F.interpolate(x, size=size, mode='bilinear', align_corners=False))
        return out

    def _embed(self, branch, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, int]]:
        """Patch + position embedding of one branch: tokens (B, H*W, D), class token (B, 1, D) or None, grid."""
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        tokens = branch.patch_embed(x)  # (B, H*W, D)
        pos = branch.pos_embed
        if not branch.no_embed_class and branch.cls_token is not None:
            pos = pos[:, 1:]  # AugReg's class slot: the official PIIP embedding never adds it (see the docstring)
        tokens = tokens + _resize_grid(pos, branch.patch_embed.grid_size, grid)
        if branch.cls_token is None:
            return branch.norm_pre(branch.pos_drop(tokens)), None, grid
        cls = branch.cls_token.expand(x.shape[0], -1, -1)
        seq = branch.norm_pre(branch.pos_drop(torch.cat([cls, tokens], 1)))  # as timm's _pos_embed + norm_pre
        return seq[:, 1:], seq[:, :1], grid

    def forward_branches(self, x: torch.Tensor, num_stages: int | None = None,
                         taps: list | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor | None], list]:
        """Blocks and interactions: per branch the patch tokens (B, H_i*W_i, D_i), class token and grid, after the
        first ``num_stages`` stages (default all); ``taps`` collects the last branch's patch tokens after each."""
        # detection takes any size whose smallest branch image holds a patch (the official pipeline resizes the
        # long side to the largest branch size, so the short side is smaller); classification its one size
        smallest = math.ceil(self.patch_size * self.img_sizes[-1] / self.img_sizes[0])
        check_image(x, self.in_chans, smallest if self.features_only else 0, type(self).__name__,
                    None if self.features_only else (self.img_sizes[-1],) * 2, size_arg=self._img_sizes_for)
        inputs = self.branch_inputs(x)
        if any(s % self.patch_size for xi in inputs for s in xi.shape[-2:]):
            raise ValueError(f'PIIP: an input of {tuple(x.shape[-2:])} gives branch images of '
                             f'{[tuple(xi.shape[-2:]) for xi in inputs]}, which must be multiples of the patch size '
                             f'{self.patch_size}; pad the input (the official detection pipeline pads to 224)')
        n = self.num_branches
        xs, clss, grids = [], [], []
        for branch, xi in zip(self.branches, inputs):
            t, c, g = self._embed(branch, xi)
            xs.append(t)
            clss.append(c)
            grids.append(g)
        for stage in range(len(self.interaction_indexes[0]) if num_stages is None else num_stages):
            for i, branch in enumerate(self.branches):
                start, end = self.interaction_indexes[i][stage]
                seq = xs[i] if clss[i] is None else torch.cat([clss[i], xs[i]], 1)  # (B, [1+]N, D)
                for blk in branch.blocks[start:end + 1]:  # set_grad_checkpointing: the official configs' with_cp
                    seq = checkpointed(self._checkpointing(), _run_block, blk, seq, grids[i], self.window_sizes[i])
                xs[i], clss[i] = (seq, None) if clss[i] is None else (seq[:, 1:], seq[:, :1])
            if n > 1:
                xs = checkpointed(self._checkpointing(), self.interactions[stage], xs, grids)
            if taps is not None:
                taps.append(xs[-1])
        return xs, clss, grids

    def forward_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, C, S, S) -> per branch its normed tokens (B, 1 + H_i*W_i, D_i), class token first
        (``head_token='first_patch'``: the patch tokens alone, (B, H_i*W_i, D_i), as the official head sees them)."""
        if self.features_only:
            raise RuntimeError('PIIP built with features_only=True has no classification path; call forward')
        xs, clss, _ = self.forward_branches(x)
        return self._final_tokens(xs, clss)

    def _final_tokens(self, xs: list[torch.Tensor], clss: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.head_token == 'first_patch':
            return [b.norm(t) for b, t in zip(self.branches, xs)]
        return [b.norm(torch.cat([c, t], 1)) for b, c, t in zip(self.branches, clss, xs)]

    def forward_head(self, x: list[torch.Tensor], pre_logits: bool = False) -> torch.Tensor:
        """Mean of the branches' logits; ``pre_logits``: their pooled tokens (``head_token``), concatenated
        (``global_pool=''``: the tokens of ``forward_features`` unchanged)."""
        if not self.global_pool:
            return x
        if pre_logits or self.num_classes == 0:  # no head (timm's num_classes=0): the pooled features
            return torch.cat([b.forward_head(f, pre_logits=True) for b, f in zip(self.branches, x)], -1)
        return torch.stack([b.forward_head(f) for b, f in zip(self.branches, x)]).mean(0)

    @property
    def classifier_prefix(self) -> tuple[str, ...]:
        """One linear head per branch (the logits are their mean)."""
        return tuple(f'branch{i + 1}.head' for i in range(self.num_branches))

    def reset_head(self, num_classes: int) -> None:
        for b in self.branches:
            b.reset_classifier(num_classes)

    # -- timm's contract (zoo._builder.ClassifierBase) ---------------------------------------------------------
    # The classifier's stages are its interaction stages; the detection model's (features_only) its pyramid's
    # four levels.
    @property
    def num_stages(self) -> int:
        return self._levels if self.features_only else len(self.interaction_indexes[0])

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = 'NCHW', intermediates_only: bool = False):
        """timm's signature. The classifier: after each interaction stage, the last branch's patch tokens (the
        full-size image) as a map (B, D_last, S/p, S/p) (``norm``: through that branch's final norm); the final
        features are ``forward_features``'. ``features_only``: the pyramid levels (B, D1, S/s, S/s), s = 4, 8, 16,
        32, all made from the branches' merged stride-16 map (the final features): ``stop_early`` saves nothing,
        ``norm`` has no norm to apply."""
        if output_fmt not in ('NCHW', 'NHWC', 'NLC'):
            raise ValueError(f'output_fmt must be one of NCHW, NHWC, NLC, got {output_fmt!r}')
        take, max_index = take_indices(self.num_stages, indices)
        if not self.features_only:
            taps = []
            xs, clss, grids = self.forward_branches(x, max_index + 1 if stop_early else None, taps)
            (h, w), last = grids[-1], self.branches[-1]
            feats = [to_format(rearrange(last.norm(taps[i]) if norm else taps[i], 'b (h w) d -> b d h w', h=h, w=w),
                               output_fmt) for i in take]
            return feats if intermediates_only else (self._final_tokens(xs, clss), feats)
        xs, _, grids = self.forward_branches(x)
        target = grids[-1]
        out = 0
        for i, (t, g) in enumerate(zip(xs, grids)):
            f = getattr(self, f'merge_branch{i + 1}')(rearrange(t, 'b (h w) d -> b d h w', h=g[0], w=g[1]))
            if tuple(g) != tuple(target):
                f = F.interpolate(f, size=target, mode='bilinear', align_corners=False)
            out = out + f * getattr(self, f'w{i + 1}')
        feats = [to_format(getattr(self, f'fpn{i + 1}')(out), output_fmt) for i in take]
        return feats if intermediates_only else (out, feats)

    def truncate_stages(self, n: int) -> None:
        if not self.features_only:  # the first n interaction stages: their blocks in every branch, their units
            for i, branch in enumerate(self.branches):
                branch.blocks = branch.blocks[:self.interaction_indexes[i][n - 1][1] + 1]
            self.interaction_indexes = [ix[:n] for ix in self.interaction_indexes]
            self.interactions = self.interactions[:n]
            return
        for i in range(n, self._levels):
            setattr(self, f'fpn{i + 1}', None)
        self._levels = n

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        num_features = self.num_features
        take = super().prune_intermediate_layers(indices, prune_norm, prune_head)
        self.num_features = num_features  # forward_features still gives every branch's tokens
        return take

    def group_matcher(self, coarse: bool = False) -> dict:
        """Layer ids by interaction stage: the blocks every branch runs in stage s, then that stage's interaction
        units (PIIP's stages are already coarse, so ``coarse`` changes nothing)."""
        blocks = [(rf'^branch{k + 1}\.blocks\.(?:{"|".join(str(j) for j in range(a, b + 1))})\.', (s,))
                  for k, ix in enumerate(self.interaction_indexes) for s, (a, b) in enumerate(ix)]
        return {'stem': r'^branch\d+\.(?:cls_token|pos_embed|patch_embed)(?:\.|$)',
                'blocks': blocks + [(r'^interactions\.(\d+)\.', (99998,))]}

    # -- checkpoints ----------------------------------------------------------------------------------------
    # zoo.create(name, checkpoint=...) builds what an official file holds: classification heads, or (an official
    # detection backbone's state dict) the detection pyramid, i.e. the variant with features_only=True.
    checkpoint_head_arg = 'features_only'

    @staticmethod
    def checkpoint_head(state_dict: dict) -> bool:
        """Whether ``state_dict`` is a detection backbone's (branch merges and pyramid), official or ours."""
        return any(k.startswith(('merge_branch1.', 'fpn1.', 'backbone.merge_branch1.', 'backbone.fpn1.'))
                   for k in state_dict)

    @staticmethod
    def remap_checkpoint(state_dict: dict) -> dict:
        """Official PIIP keys -> ours: DeiT LayerScale ``gamma_1/2`` -> timm's ``ls1/ls2.gamma``; the detection
        backbone's ``fpn2.0`` (a one-layer Sequential there) -> ``fpn2``; from a whole mmdet detector's state dict
        (``backbone.*`` beside ``neck.*`` and the heads), its backbone."""
        if any(k.startswith('backbone.') for k in state_dict):
            state_dict = {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
        out = {}
        for k, v in state_dict.items():
            k = k.replace('.gamma_1', '.ls1.gamma').replace('.gamma_2', '.ls2.gamma')
            if k.startswith('fpn2.0.'):
                k = 'fpn2.' + k[len('fpn2.0.'):]
            out[k] = v
        return out

    def to_official(self, state_dict: dict | None = None) -> dict:
        """Our keys (this model's state dict by default) -> the official ``PIIPThreeBranch`` / ``PIIPFourBranch``
        keys (the inverse of :meth:`remap_checkpoint`)."""
        sd = self.state_dict() if state_dict is None else state_dict
        return {('fpn2.0.' + k[len('fpn2.'):] if k.startswith('fpn2.') else k)
                .replace('.ls1.gamma', '.gamma_1').replace('.ls2.gamma', '.gamma_2'): v for k, v in sd.items()}


def _init_dense(m: nn.Module) -> None:
    """Official init of the merge and pyramid modules: He-normal over fan-out, zero bias, unit GroupNorm."""
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.GroupNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def load_branch_weights(model: PIIP, index: int, state_dict: dict, strict: bool = True) -> None:
    """Load a timm-layout ViT state dict (DeiT, DeiT III, AugReg; e.g. ``vit_base_patch16_224``) into branch
    ``index`` (0-based; 0 = branch1, the widest model).

    The position embedding's patch grid is resized bicubically (``align_corners=False``, official) to the
    branch's grid; a class slot is dropped for DeiT-style branches (no slot) and kept for AugReg ones;
    LayerScale gammas missing from a checkpoint without LayerScale stay at 1 (identity, as in PIIP). The
    classifier is loaded when its shape fits and skipped otherwise (a new number of classes).
    """
    branch = model.branches[index]
    own = branch.state_dict()
    sd = dict(state_dict)
    pos = sd.get('pos_embed')
    if pos is not None:
        n_ckpt = pos.shape[1]
        side = math.isqrt(n_ckpt)
        prefix = n_ckpt - side * side  # 1 with a class slot, 0 without
        if prefix not in (0, 1) or (prefix == 1 and side * side + 1 != n_ckpt):
            raise ValueError(f'branch{index + 1}: cannot read a square patch grid from pos_embed of shape '
                             f'{tuple(pos.shape)}')
        cls_pos, grid_pos = pos[:, :prefix], pos[:, prefix:]
        grid_pos = _resize_grid(grid_pos, (side, side), branch.patch_embed.grid_size)
        if branch.no_embed_class:
            sd['pos_embed'] = grid_pos
        else:
            if prefix == 0:
                raise ValueError(f'branch{index + 1} (AugReg style) needs a pos_embed with a class slot')
            sd['pos_embed'] = torch.cat([cls_pos, grid_pos], 1)
    for k in [k for k in own if k.endswith('.gamma') and k not in sd]:
        sd[k] = torch.ones_like(own[k])
    for k in ('head.weight', 'head.bias'):
        if k in sd and (k not in own or sd[k].shape != own[k].shape):
            del sd[k]
    if model.features_only:
        for k in [k for k in sd if k.startswith(('head.', 'norm.', 'cls_token', 'fc_norm.'))]:
            del sd[k]
    missing, unexpected = branch.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith('head.')]
    if strict and (missing or unexpected):
        raise ValueError(f'branch{index + 1}: checkpoint does not fit; missing {missing[:8]}, unexpected '
                         f'{unexpected[:8]}')


# -- registered variants ------------------------------------------------------------------------------------
_PAPER = 'Parameter-Inverted Image Pyramid Networks (Zhu et al., NeurIPS 2024, arXiv 2406.04330)'
_REPO = 'https://github.com/OpenGVLab/PIIP'
_META = dict(family='piip', paper=_PAPER, repo=_REPO, capabilities=('features', 'timm_weights'), tiny='piip_tiny')

_T, _S, _B, _L = (192, 12, 3), (384, 12, 6), (768, 12, 12), (1024, 24, 16)  # (dim, depth, heads)

# The official Mask R-CNN backbones (OpenGVLab/PIIP mmdetection/configs/piip/{3,4}branch/
# mask_rcnn_deit_{tsb_1120_896_448, sbl_1120_672_448, tsbl_1344_896_672_448}_fpn_1x_coco_bs16.py): what the
# published variants build with features_only=True. Their drop-path rates are not the classification ones.
_DETECTION = {
    'tsb': dict(img_sizes=(448, 896, 1120), window_size=14, drop_path_rates=(0.15, 0.05, 0.05)),
    'sbl': dict(img_sizes=(448, 672, 1120), window_size=28, drop_path_rates=(0.4, 0.15, 0.05), branch_style='deit'),
    'tsbl': dict(img_sizes=(448, 672, 896, 1344), window_size=28, drop_path_rates=(0.4, 0.15, 0.05, 0.05)),
}


def _create(branches, cfg: dict, kwargs: dict, detection: dict | None = None) -> PIIP:
    """``cfg``: the classification settings; with ``features_only=True`` the official detection settings
    ``detection`` replace them, position grids on the 224-px pretraining grid (``pos_embed_size=224``) as the
    official detection backbone keeps them. Explicit arguments win over both."""
    cfg = dict(cfg, embed_dims=[b[0] for b in branches], depths=[b[1] for b in branches],
               num_heads=[b[2] for b in branches])
    if detection and kwargs.get('features_only'):
        cfg.update(detection, pos_embed_size=224)
    return build_model(PIIP, cfg, kwargs)


@register_model(**_META, input_size=(3, 368, 368), params=144_031_416, macs=17_400_000_000,
                top1=82.1)
def piip_tsb(**kwargs):
    """PIIP-TSB 368/192/128 (DeiT v1 B / S / T), ImageNet-1k 82.1 (README: 144M, 17.4G); as the official
    classifier, each head reads its branch's first patch token (``head_token='first_patch'``).
    ``features_only=True``: the official Mask R-CNN backbone 1120/896/448 (window 14, drop path 0.15 / 0.05 /
    0.05; 175,043,715 parameters); other released resolutions with ``img_sizes=(448, 896, 1568)`` or
    ``(672, 1120, 1568)``. ``zoo.create('piip_tsb', checkpoint=...)`` builds whichever an official file holds."""
    return _create([_B, _S, _T], dict(img_sizes=(128, 192, 368), branch_style='deit', head_token='first_patch',
                                      drop_path_rates=(0.2, 0.05, 0.05)), kwargs, _DETECTION['tsb'])


@register_model(**_META, input_size=(3, 384, 384), params=488_925_880, macs=61_200_000_000,
                top1=85.9)
def piip_sbl(**kwargs):
    """PIIP-SBL 384/192/128 (AugReg L / B / S), ImageNet-1k 85.9 (README: 489M, 61.2G), first-patch-token heads
    as the official classifier; 320/160/96 (85.2): ``img_sizes=(96, 160, 320)``. ``features_only=True``: the
    official DeiT III Mask R-CNN backbone 1120/672/448 (``branch_style='deit'``, window 28, drop path 0.4 / 0.15 /
    0.05; 547,810,051 parameters); ``img_sizes=(448, 896, 1344)``, ``(672, 896, 1568)``, ``(672, 1120, 1568)``
    for the other released resolutions."""
    return _create([_L, _B, _S], dict(img_sizes=(128, 192, 384), branch_style='augreg', head_token='first_patch',
                                      drop_path_rates=(0.4, 0.2, 0.05)), kwargs, _DETECTION['sbl'])


@register_model(**_META, input_size=(3, 1344, 1344), params=527_411_488)
def piip_tsbl(**kwargs):
    """PIIP-TSBL as the official code builds it and as its released Mask R-CNN weights hold it: ``piip_4branch.py``
    builds branch4 with ``vit_models(**branch3)``, so the fourth branch is a second ViT-S (384 wide), not the ViT-T
    its configs name (that one is :func:`piip_tsbl_config`). A detection backbone in the paper:
    ``features_only=True`` is the official backbone 1344/896/672/448 (window 28, drop path 0.4 / 0.15 / 0.05 /
    0.05; 593,216,388 parameters), the one the released checkpoints load into; by default, classification heads
    (first patch token) at those resolutions, which the official code does not have."""
    return _create([_L, _B, _S, _S], dict(img_sizes=(448, 672, 896, 1344), branch_style='deit',
                                          head_token='first_patch', drop_path_rates=(0.4, 0.15, 0.05, 0.05)),
                   kwargs, _DETECTION['tsbl'])


@register_model(**_META, input_size=(3, 1344, 1344), params=505_521_376)
def piip_tsbl_config(**kwargs):
    """PIIP-TSBL as its configs describe it (ViT L / B / S / T; the paper's T/S/B/L, README 506M): branch4 is the
    ViT-T of the config. The official code builds a second ViT-S there instead (:func:`piip_tsbl`), so no
    released weights fit this one. ``features_only=True``: 571,066,500 parameters at 1344/896/672/448."""
    return _create([_L, _B, _S, _T], dict(img_sizes=(448, 672, 896, 1344), branch_style='deit',
                                          head_token='first_patch', drop_path_rates=(0.4, 0.15, 0.05, 0.05)),
                   kwargs, _DETECTION['tsbl'])


@register_model(**{**_META, 'input_size': (3, 64, 64)})
def piip_tiny(**kwargs):
    """A 3-branch CPU variant: widths 128 / 64 / 32 on 32 / 48 / 64 px, depth 2, 2 interactions. Its heads read
    the class token (``head_token='class'``), so at initialisation each branch is exactly its standalone ViT."""
    return _create([(128, 2, 4), (64, 2, 2), (32, 2, 2)], dict(img_sizes=(32, 48, 64), branch_style='deit',
                                                               drop_path_rates=(0.0, 0.0, 0.0), num_interactions=2),
                   kwargs)
