"""Semantic-segmentation blocks: the Semantic FPN neck and head, UperNet's head (PPM + FPN) and its auxiliary FCN.

Written from the papers and from MMSegmentation's module definitions, which the official segmentation code of
PoolFormer (sail-sg/poolformer, ``segmentation/``, mmseg v0.19 ``fpn_r50`` base) and PIIP (OpenGVLab/PIIP,
``mmsegmentation/``, mmseg v0.27 ``upernet_r50`` base) configure; parameter counts equal theirs:

- Semantic FPN: Kirillov et al., "Panoptic Feature Pyramid Networks" (CVPR 2019, arXiv 1901.02446). The neck is
  :class:`FPN` (Lin et al., CVPR 2017; mmseg's ``FPN``: 1x1 laterals and 3x3 outputs, both with bias, top-down
  nearest upsampling), the head :class:`SemFPNHead` (mmseg's ``FPNHead``): per level ``log2(stride / 4)``
  3x3 Conv-BN-ReLU blocks (at least one), each followed by a 2x bilinear upsampling, until stride 4; the levels are
  summed, then dropout 0.1 and a 1x1 classifier. Channels 128 (the official config: neck 256, head 128).
- UperNet: Xiao et al., "Unified Perceptual Parsing for Scene Understanding" (ECCV 2018, arXiv 1807.10221);
  :class:`UperNetHead` (mmseg's ``UPerHead``): a pyramid pooling module (PSPNet, Zhao et al. CVPR 2017; scales
  1/2/3/6) on the coarsest map, 1x1 laterals on the others, top-down bilinear sums, 3x3 output convolutions, every
  level resized to stride 4 and concatenated, a 3x3 fusion, dropout 0.1 and a 1x1 classifier (channels 512). The
  optional auxiliary :class:`FCNHead` (Long et al., CVPR 2015; mmseg's ``FCNHead`` with one 3x3 conv, 256 channels,
  no input concat) on the third level is trained with weight 0.4, as the official configs do.

Every Conv-BN-ReLU is one :class:`~zoo.layers.convbn.ConvBN` (no conv bias, BatchNorm eps 1e-5, momentum 0.1) and a
ReLU, mmseg's ``ConvModule`` with ``norm_cfg=BN``.

A segmentation head owns its loss and its prediction (the ``dense_head`` contract): ``forward(maps)`` gives its
raw outputs, a list whose first entry is the class logits at the finest level's resolution (stride 4 for the
usual backbones), (B, num_classes, H/4, W/4), and, in training mode with an auxiliary head, the auxiliary logits
second; ``loss(out, masks)`` is the cross-entropy of the logits bilinearly upsampled to the masks' size, pixels
equal to ``ignore_index`` (255) left out, plus ``aux_weight`` times the auxiliary one (mmseg); ``predict(out,
metas)`` the class of every pixel: the logits upsampled to the input (``size``) and, given ``metas``, cut to each
file's content and resized to the file's size (bilinear on the logits, then argmax, as mmseg does).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from .convbn import ConvBN

__all__ = ['ConvBNReLU', 'FPN', 'IdentityNeck', 'PPM', 'SegHead', 'SemFPNHead', 'UperNetHead', 'FCNHead',
           'resize_logits', 'IGNORE_INDEX']

IGNORE_INDEX = 255  # mmseg's and the datasets' "not labelled" value


class ConvBNReLU(nn.Sequential):
    """Conv (no bias) + BatchNorm + ReLU: mmseg's ``ConvModule(norm_cfg=BN, act_cfg=ReLU)``."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, conv_layer=None):
        super().__init__(ConvBN(in_chs, out_chs, kernel_size, padding=kernel_size // 2,
                                conv_layer=conv_layer if kernel_size > 1 else None), nn.ReLU(inplace=True))


def resize_logits(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Bilinear resize (``align_corners=False``, mmseg's ``resize``) of (B, C, h, w) maps to ``size``; a no-op at
    that size already."""
    size = tuple(int(s) for s in size)
    return x if tuple(x.shape[-2:]) == size else F.interpolate(x, size=size, mode='bilinear', align_corners=False)


@register('neck', 'fpn', example=dict(in_channels=(8, 16, 32, 32), out_channels=16),
          example_input=((2, 8, 16, 16), (2, 16, 8, 8), (2, 32, 4, 4), (2, 32, 2, 2)))
class FPN(nn.Module):
    """Feature pyramid network (Lin et al. 2017) as mmseg's ``FPN`` neck: every level -> ``out_channels``.

    ``lateral_i = Conv1x1(C_i -> out, bias)``; top-down ``lateral_{i-1} += nearest_resize(lateral_i)``; ``out_i =
    Conv3x3(out -> out, bias)(lateral_i)``. Same number of levels and strides; ``out_channels`` one width per level.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int = 256, conv_layer=None):
        super().__init__()
        self.in_channels = tuple(in_channels)
        self.out_channels = (int(out_channels),) * len(self.in_channels)
        self.lateral_convs = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in self.in_channels)
        conv = conv_layer or nn.Conv2d
        self.fpn_convs = nn.ModuleList(conv(out_channels, out_channels, 3, padding=1) for _ in self.in_channels)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        lat = [conv(x) for conv, x in zip(self.lateral_convs, feats)]
        for i in range(len(lat) - 1, 0, -1):  # coarse to fine
            lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], size=lat[i - 1].shape[-2:], mode='nearest')
        return [conv(x) for conv, x in zip(self.fpn_convs, lat)]


@register('neck', 'identity', example=dict(in_channels=(8, 16)), example_input=((2, 8, 8, 8), (2, 16, 4, 4)))
class IdentityNeck(nn.Module):
    """No neck: the backbone's maps go to the head unchanged (UperNet's own FPN is in its head)."""

    def __init__(self, in_channels: Sequence[int]):
        super().__init__()
        self.in_channels = self.out_channels = tuple(in_channels)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(feats)


class PPM(nn.ModuleList):
    """Pyramid pooling module (PSPNet): per scale s, adaptive average pooling to s x s, a 1x1 Conv-BN-ReLU, and a
    bilinear resize back to the input's size."""

    def __init__(self, pool_scales: Sequence[int], in_chs: int, channels: int):
        super().__init__(nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvBNReLU(in_chs, channels, 1)) for s in pool_scales)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [resize_logits(m(x), x.shape[-2:]) for m in self]


class SegHead(nn.Module):
    """What every segmentation head shares: the classifier (dropout + 1x1 conv), the loss and the prediction.

    Subclasses build their layers and define ``features(maps) -> (B, channels, H0, W0)`` on the finest level.
    ``aux`` is an optional auxiliary head (``forward(maps) -> logits``) trained with weight ``aux_weight``.
    ``class_weight`` (one float per class) weights each class's pixels in the cross-entropy, as mmseg's
    ``CrossEntropyLoss(class_weight=...)``: the loss is the weighted mean over the labelled pixels.
    """

    fused = True  # one output map for all levels (the dense-block tests read this)

    def __init__(self, in_channels: Sequence[int], num_classes: int, strides: Sequence[int], channels: int,
                 dropout: float = 0.1, ignore_index: int = IGNORE_INDEX, aux: nn.Module | None = None,
                 aux_weight: float = 0.4, class_weight: Sequence[float] | None = None):
        super().__init__()
        if len(in_channels) != len(strides):
            raise ValueError(f'{type(self).__name__}: {len(in_channels)} input levels but {len(strides)} strides')
        if num_classes < 1:
            raise ValueError(f'{type(self).__name__}: num_classes must be >= 1, got {num_classes}')
        self.in_channels, self.strides = tuple(in_channels), tuple(int(s) for s in strides)
        self.num_classes, self.channels, self.ignore_index = num_classes, channels, ignore_index
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)
        self.aux, self.aux_weight = aux, aux_weight
        if class_weight is not None and (len(class_weight) != num_classes or any(w < 0 for w in class_weight)):
            raise ValueError(f'{type(self).__name__}: class_weight needs one weight >= 0 per class ({num_classes}), '
                             f'got {list(class_weight)}')
        self.class_weight = None if class_weight is None else tuple(float(w) for w in class_weight)

    def features(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError(f'{type(self).__name__} must define features (its fusion of the levels)')

    def forward(self, maps: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """[logits at the finest level (B, nc, H0, W0)] + [auxiliary logits] in training mode with an aux head."""
        out = [self.conv_seg(self.dropout(self.features(maps)))]
        if self.aux is not None and self.training:
            out.append(self.aux(maps)[0])
        return out

    def logits(self, out: Sequence[torch.Tensor], size: Sequence[int] | None = None) -> torch.Tensor:
        """The class logits resized to ``size`` (default: the input, ``strides[0]`` times the finest map)."""
        main = out[0]
        return resize_logits(main, size or [d * self.strides[0] for d in main.shape[-2:]])

    def loss(self, out: Sequence[torch.Tensor], targets) -> tuple[torch.Tensor, dict]:
        """Cross-entropy (mean over labelled pixels) of the logits upsampled to the masks, plus ``aux_weight`` x the
        auxiliary head's. (mmseg before 1.0 divides by every pixel, ignored ones included, unless its
        ``avg_non_ignore=True``: the same gradient direction, scaled by the labelled fraction.) ``targets``: (B, H, W) class ids, ``ignore_index`` where unlabelled (or a list of dicts
        with ``'mask'``). Returns ``(total, {'ce': ..., 'aux': ...})``, the parts detached."""
        masks = _masks(targets, out[0].device)
        bad = (masks >= self.num_classes) & (masks != self.ignore_index)
        if bad.any():  # cross-entropy would fail with a device-side assert on CUDA instead
            raise ValueError(f'a mask holds class {int(masks[bad][0])} >= num_classes={self.num_classes} '
                             f'(the ignore value {self.ignore_index} aside)')
        weight = None if self.class_weight is None else torch.tensor(self.class_weight, device=masks.device)
        ce = lambda logits: _ce(resize_logits(logits, masks.shape[-2:]), masks, self.ignore_index, weight)
        main = ce(out[0])
        parts = {'ce': main.detach()}
        total = main
        if len(out) > 1:
            aux = ce(out[1])
            total = total + self.aux_weight * aux
            parts['aux'] = aux.detach()
        return total, parts

    @torch.no_grad()
    def predict(self, out: Sequence[torch.Tensor], metas: Sequence[dict] | None = None,
                size: Sequence[int] | None = None):
        """Class ids per pixel: (B, H, W) in input pixels when ``metas`` is None, else one ``{'mask': (H_i, W_i)}``
        per image in its file's pixels (see :meth:`decode`)."""
        return self.decode(self.logits(out, size), metas)

    @staticmethod
    def decode(logits: torch.Tensor, metas: Sequence[dict] | None = None):
        """(B, nc, H, W) logits in input pixels -> (B, H, W) class ids, or with ``metas`` one ``{'mask': (h, w)}``
        per image: the padding the data added cut off (``pad`` (left, top) and ``scale`` (sx, sy): input = file
        x scale + pad, as the detection letterbox writes it), the logits resized to ``orig_size`` (H, W)
        bilinearly, then the argmax."""
        if metas is None:
            return logits.argmax(1)
        out = []
        for lg, meta in zip(logits, metas):
            meta = meta or {}
            h, w = meta.get('orig_size', lg.shape[-2:])
            sx, sy = meta.get('scale', (lg.shape[-1] / w, lg.shape[-2] / h))
            px, py = meta.get('pad', (0, 0))
            content = lg[:, int(py):int(py) + max(1, round(h * sy)), int(px):int(px) + max(1, round(w * sx))]
            out.append({'mask': resize_logits(content[None].float(), (h, w))[0].argmax(0)})
        return out


def _masks(targets, device) -> torch.Tensor:
    if isinstance(targets, torch.Tensor):
        return targets.to(device=device, dtype=torch.long).as_subclass(torch.Tensor)
    return torch.stack([t['mask'] for t in targets]).to(device=device, dtype=torch.long).as_subclass(torch.Tensor)


def _ce(logits: torch.Tensor, masks: torch.Tensor, ignore_index: int, weight: torch.Tensor | None = None
        ) -> torch.Tensor:
    """Mean cross-entropy over the labelled pixels (weighted by their classes' ``weight``); 0 (keeping the graph)
    when a batch has none."""
    if not (masks != ignore_index).any():
        return logits.sum() * 0
    return F.cross_entropy(logits.float(), masks, weight=weight, ignore_index=ignore_index)


@register('dense_head', 'semfpn', example=dict(in_channels=(8, 8, 8, 8), num_classes=3, strides=(4, 8, 16, 32),
                                               channels=8),
          example_input=((2, 8, 16, 16), (2, 8, 8, 8), (2, 8, 4, 4), (2, 8, 2, 2)))
class SemFPNHead(SegHead):
    """Semantic FPN's head (mmseg ``FPNHead``) on an FPN neck's maps; see the module docstring.

    Args:
        in_channels: the neck's widths, one per level (256 each in the official configs).
        num_classes, strides: classes (no background class unless the data has one) and each level's stride.
        channels: the head's width (128).
        dropout, ignore_index: before the classifier (0.1); the unlabelled value of the masks (255).
        class_weight: one cross-entropy weight per class (None: all 1), as mmseg's ``class_weight``.
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int, strides: Sequence[int], channels: int = 128,
                 dropout: float = 0.1, ignore_index: int = IGNORE_INDEX, conv_layer=None,
                 class_weight: Sequence[float] | None = None):
        super().__init__(in_channels, num_classes, strides, channels, dropout, ignore_index,
                         class_weight=class_weight)
        self.scale_heads = nn.ModuleList()
        for c, s in zip(self.in_channels, self.strides):
            n = max(1, int(math.log2(s) - math.log2(self.strides[0])))
            blocks = []
            for k in range(n):
                blocks.append(ConvBNReLU(c if k == 0 else channels, channels, 3, conv_layer=conv_layer))
                if s != self.strides[0]:
                    blocks.append(nn.Upsample(scale_factor=2, mode='bilinear', align_corners=False))
            self.scale_heads.append(nn.Sequential(*blocks))

    def features(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        out = self.scale_heads[0](maps[0])
        for head, x in zip(self.scale_heads[1:], maps[1:]):
            out = out + resize_logits(head(x), out.shape[-2:])  # a no-op when the sizes divide evenly
        return out


class FCNHead(SegHead):
    """FCN's head (mmseg ``FCNHead``, ``concat_input=False``) on one level (``in_index``): ``num_convs`` 3x3
    Conv-BN-ReLU blocks, dropout, 1x1 classifier: UperNet's auxiliary head (level 2, 256 channels, one conv). Its
    logits are at that level's resolution; the loss resizes them to the masks."""

    def __init__(self, in_channels: Sequence[int], num_classes: int, strides: Sequence[int], channels: int = 256,
                 in_index: int = -1, num_convs: int = 1, dropout: float = 0.1, ignore_index: int = IGNORE_INDEX,
                 conv_layer=None):
        super().__init__(in_channels, num_classes, strides, channels, dropout, ignore_index)
        self.in_index = in_index % len(self.in_channels)
        self.convs = nn.Sequential(*(ConvBNReLU(self.in_channels[self.in_index] if i == 0 else channels, channels,
                                                3, conv_layer=conv_layer) for i in range(num_convs)))

    def features(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.convs(maps[self.in_index])


@register('dense_head', 'upernet', example=dict(in_channels=(8, 8, 16, 16), num_classes=3, strides=(4, 8, 16, 32),
                                                channels=8, aux_channels=8),
          example_input=((2, 8, 16, 16), (2, 8, 8, 8), (2, 16, 4, 4), (2, 16, 2, 2)))
class UperNetHead(SegHead):
    """UperNet's head (mmseg ``UPerHead``) with the optional auxiliary FCN head; see the module docstring.

    Args:
        in_channels: the backbone's widths, one per level (UperNet takes the backbone maps: neck ``identity``).
        num_classes, strides: classes and each level's stride.
        channels: the head's width (512 in mmseg's UperNet configs; PIIP-H6B's use 1536).
        pool_scales: the PPM's output grids (1, 2, 3, 6).
        aux_channels: width of the auxiliary FCN head on level ``aux_index`` (256; 0 or None: no auxiliary head),
            trained with weight ``aux_weight`` (0.4).
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int, strides: Sequence[int], channels: int = 512,
                 pool_scales: Sequence[int] = (1, 2, 3, 6), dropout: float = 0.1, ignore_index: int = IGNORE_INDEX,
                 aux_channels: int | None = 256, aux_index: int = 2, aux_weight: float = 0.4, conv_layer=None,
                 class_weight: Sequence[float] | None = None):
        aux = None
        if aux_channels:
            aux = FCNHead(in_channels, num_classes, strides, aux_channels, in_index=aux_index, dropout=dropout,
                          ignore_index=ignore_index, conv_layer=conv_layer)
        super().__init__(in_channels, num_classes, strides, channels, dropout, ignore_index, aux, aux_weight,
                         class_weight)
        *lower, top = self.in_channels
        self.psp_modules = PPM(pool_scales, top, channels)
        self.bottleneck = ConvBNReLU(top + len(pool_scales) * channels, channels, 3, conv_layer=conv_layer)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(c, channels, 1) for c in lower)
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3, conv_layer=conv_layer) for _ in lower)
        self.fpn_bottleneck = ConvBNReLU(len(self.in_channels) * channels, channels, 3, conv_layer=conv_layer)

    def features(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        top = maps[-1]
        lat = [conv(x) for conv, x in zip(self.lateral_convs, maps)]
        lat.append(self.bottleneck(torch.cat([top, *self.psp_modules(top)], 1)))  # (B, top + n_scales * ch, h, w)
        for i in range(len(lat) - 1, 0, -1):  # top-down
            lat[i - 1] = lat[i - 1] + resize_logits(lat[i], lat[i - 1].shape[-2:])
        outs = [conv(x) for conv, x in zip(self.fpn_convs, lat)] + [lat[-1]]
        size = outs[0].shape[-2:]
        return self.fpn_bottleneck(torch.cat([resize_logits(o, size) for o in outs], 1))  # (B, n_levels * ch, H0, W0)
