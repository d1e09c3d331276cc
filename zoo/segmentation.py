"""Semantic segmentation on any zoo backbone: ``semfpn_seg`` (Semantic FPN) and ``upernet_seg`` (UperNet).

- Semantic FPN: Kirillov et al., "Panoptic Feature Pyramid Networks" (CVPR 2019, arXiv 1901.02446), the head
  PoolFormer reports ADE20K with (Yu et al., "MetaFormer is Actually What You Need for Vision", CVPR 2022, arXiv
  2111.11418; https://github.com/sail-sg/poolformer, ``segmentation/configs/sem_fpn/PoolFormer``: mmseg's FPN neck
  with 256 channels, ``FPNHead`` with 128, AdamW lr 2e-4, weight decay 1e-4, poly schedule, 40k iterations of 32
  images at 512 x 512).
- UperNet: Xiao et al., "Unified Perceptual Parsing for Scene Understanding" (ECCV 2018, arXiv 1807.10221), the
  head PIIP reports ADE20K with (Zhu et al., NeurIPS 2024, arXiv 2406.04330; https://github.com/OpenGVLab/PIIP,
  ``mmsegmentation/configs/piip``: mmseg's ``UPerHead`` (pool scales 1/2/3/6) with the auxiliary ``FCNHead`` on
  level 2 at weight 0.4, AdamW lr 4e-5, weight decay 0.05, layer decay 0.95, 80k iterations of 16 images, slide
  inference with 512 crops and stride 341).

A segmenter is a :class:`Segmenter`, a :class:`zoo.dense.DenseModel` (backbone with ``features_only`` -> neck ->
head, built by :func:`zoo.dense.dense_model` as ``yolo_det`` is) whose head (:mod:`zoo.layers.segment`) owns the
loss (cross-entropy, 255 ignored) and the prediction. Train mode returns the head's raw outputs (logits at the
finest level, 1/4 of the input for the usual backbones, and UperNet's auxiliary logits); eval mode the class of
every pixel, (B, H, W) at the input's size (or one ``{'mask'}`` per image in its file's pixels with ``model(x,
metas)``), by whole-image or sliding-window inference (``test_mode``), as mmseg's ``EncoderDecoder`` does.

**Generic entrypoints**: ``zoo.create('semfpn_seg', backbone='resnet18', num_classes=21)``, ``zoo.create(
'upernet_seg', backbone='piip_tiny')``; the backbone is any registered model with ``features_only`` (or
``'timm/<name>'``), its last four levels (three for Mamba-YOLO's). The official models are registered with their
published ADE20K mIoU: ``semfpn_poolformer_s12`` ... ``_m48``; ``upernet_piip_tsb`` (PIIP releases no TSB
segmentation result; its ADE20K numbers are for PIIP-H6B, whose InternViT-6B branch zoo does not build).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._builder import build_model
from ._registry import register_model
from .dense import DenseModel, dense_model

__all__ = ['Segmenter', 'semfpn_segmenter', 'upernet_segmenter', 'PUBLISHED_ADE20K']


class Segmenter(DenseModel):
    """A :class:`DenseModel` with a segmentation head and mmseg's test-time inference.

    Args:
        backbone, neck, head: as :class:`DenseModel` (the head from :mod:`zoo.layers.segment`).
        test_mode: ``'whole'`` (the image at once, padded to a multiple of the coarsest stride) or ``'slide'``
            (``crop_size`` windows every ``stride`` pixels, overlapping logits averaged).
        crop_size, stride: the sliding windows (H, W) (ints for squares); default the official 512 and 341.
    """

    def __init__(self, backbone: nn.Module, neck: nn.Module, head: nn.Module, test_mode: str = 'whole',
                 crop_size: int | Sequence[int] | None = None, stride: int | Sequence[int] | None = None):
        super().__init__(backbone, neck, head)
        if test_mode not in ('whole', 'slide'):
            raise ValueError(f"test_mode must be 'whole' or 'slide', got {test_mode!r}")
        pair = lambda v, d: (int(v), int(v)) if isinstance(v, (int, float)) else tuple(int(i) for i in (v or d))
        self.test_mode, self.crop_size, self.stride = test_mode, pair(crop_size, (512, 512)), pair(stride, (341, 341))

    def _whole(self, x: torch.Tensor, forward_raw) -> torch.Tensor:
        """Logits (B, nc, H, W) of a whole image, zero-padded at the bottom and right to the coarsest stride."""
        h, w = x.shape[-2:]
        xp = self._padded(x)
        return self.head.logits(forward_raw(xp), xp.shape[-2:])[..., :h, :w]

    def _padded(self, x: torch.Tensor) -> torch.Tensor:
        s = max(self.strides)
        ph, pw = -x.shape[-2] % s, -x.shape[-1] % s
        return F.pad(x, (0, pw, 0, ph)) if ph or pw else x

    def _windows(self, h: int, w: int) -> list[tuple[int, int, int, int]]:
        """mmseg's sliding windows (y1, y2, x1, x2): ``crop_size`` every ``stride``, the last flush with the border."""
        (ch, cw), (sh, sw) = self.crop_size, self.stride
        rows = max(h - ch + sh - 1, 0) // sh + 1
        cols = max(w - cw + sw - 1, 0) // sw + 1
        out = []
        for r in range(rows):
            for c in range(cols):
                y2, x2 = min(r * sh + ch, h), min(c * sw + cw, w)
                out.append((max(y2 - ch, 0), y2, max(x2 - cw, 0), x2))
        return out

    def _slide(self, x: torch.Tensor, forward_raw) -> torch.Tensor:
        """mmseg's ``slide_inference``: the windows' logits summed and divided by how many windows cover each
        pixel."""
        h, w = x.shape[-2:]
        logits = x.new_zeros((x.shape[0], self.num_classes, h, w))
        count = x.new_zeros((1, 1, h, w))
        for y1, y2, x1, x2 in self._windows(h, w):
            logits[..., y1:y2, x1:x2] += self._whole(x[..., y1:y2, x1:x2], forward_raw)
            count[..., y1:y2, x1:x2] += 1
        return logits / count

    def network_input(self, x: torch.Tensor, test_mode: str | None = None) -> torch.Tensor:
        """What ``forward_raw`` receives when :meth:`logits` runs on ``x``: the (first) window, padded to the
        coarsest stride. A runtime whose graph has a fixed image size is captured on this (``zoo.optimize``)."""
        if (test_mode or self.test_mode) == 'slide':
            y1, y2, x1, x2 = self._windows(*x.shape[-2:])[0]
            x = x[..., y1:y2, x1:x2]
        return self._padded(x)

    def logits(self, x: torch.Tensor, test_mode: str | None = None, forward_raw=None) -> torch.Tensor:
        """Class logits (B, num_classes, H, W) at the input's size, by ``test_mode`` (default the model's).
        ``forward_raw``: the network to run instead of this model's own (a runtime's captured graph)."""
        mode, net = test_mode or self.test_mode, forward_raw or self.forward_raw
        return self._slide(x, net) if mode == 'slide' else self._whole(x, net)

    def predict(self, x: torch.Tensor, metas: Sequence[dict] | None = None, forward_raw=None):
        return self.head.decode(self.logits(x, forward_raw=forward_raw), metas)

    def forward(self, x: torch.Tensor, metas: Sequence[dict] | None = None):
        return self.forward_raw(x) if self.training else self.predict(x, metas)


def _segmenter(backbone: str, num_classes: int, in_chans: int, backbone_kwargs: dict | None,
               img_size, neck: str, neck_kwargs: dict, head: str, head_kwargs: dict, levels: int | None,
               test_mode: str, crop_size, stride) -> Segmenter:
    return dense_model(backbone, num_classes, in_chans, neck, head, backbone_kwargs, neck_kwargs, head_kwargs,
                       img_size=img_size, levels=levels, model_cls=Segmenter, test_mode=test_mode,
                       crop_size=crop_size, stride=stride)


def semfpn_segmenter(backbone: str = 'poolformer_s12', num_classes: int = 150, in_chans: int = 3,
                     backbone_kwargs: dict | None = None, img_size: int | Sequence[int] | None = None,
                     neck_channels: int = 256, channels: int = 128, dropout: float = 0.1, ignore_index: int = 255,
                     levels: int | None = None, test_mode: str = 'whole', crop_size=None, stride=None,
                     neck_kwargs: dict | None = None, head_kwargs: dict | None = None) -> Segmenter:
    """Semantic FPN on a registered backbone: mmseg's FPN neck (``neck_channels``) and ``FPNHead`` (``channels``).

    Args:
        backbone: a registered model with ``features_only`` (``'timm/<name>'`` too); ``backbone_kwargs`` go to it
            (``{'token_mixer': 'raft'}``, ``{'out_norm': True}`` for PoolFormer's official dense backbone).
        num_classes: classes of the masks (150 for ADE20K with its 0 label reduced away).
        img_size: the input size, for backbones whose weights depend on it; ``zoo fit`` passes the data's.
        levels: how many of the backbone's last levels the neck takes (default: four, or all when fewer).
        test_mode, crop_size, stride: evaluation by the whole image or by sliding windows (:class:`Segmenter`).
    """
    return _segmenter(backbone, num_classes, in_chans, backbone_kwargs, img_size, 'fpn',
                      dict(out_channels=neck_channels, **(neck_kwargs or {})), 'semfpn',
                      dict(channels=channels, dropout=dropout, ignore_index=ignore_index, **(head_kwargs or {})),
                      levels, test_mode, crop_size, stride)


def upernet_segmenter(backbone: str = 'piip_tsb', num_classes: int = 150, in_chans: int = 3,
                      backbone_kwargs: dict | None = None, img_size: int | Sequence[int] | None = None,
                      channels: int = 512, pool_scales: Sequence[int] = (1, 2, 3, 6), aux_channels: int | None = 256,
                      aux_index: int = 2, aux_weight: float = 0.4, dropout: float = 0.1, ignore_index: int = 255,
                      levels: int | None = None, test_mode: str = 'whole', crop_size=None, stride=None,
                      neck: str = 'identity', neck_kwargs: dict | None = None,
                      head_kwargs: dict | None = None) -> Segmenter:
    """UperNet on a registered backbone: mmseg's ``UPerHead`` (``channels``, ``pool_scales``) on the backbone's
    maps (no neck), with the auxiliary ``FCNHead`` (``aux_channels``; 0 or None: none) on level ``aux_index`` at
    ``aux_weight``. Other arguments: :func:`semfpn_segmenter`."""
    return _segmenter(backbone, num_classes, in_chans, backbone_kwargs, img_size, neck, dict(neck_kwargs or {}),
                      'upernet', dict(channels=channels, pool_scales=tuple(pool_scales), aux_channels=aux_channels,
                                      aux_index=aux_index, aux_weight=aux_weight, dropout=dropout,
                                      ignore_index=ignore_index, **(head_kwargs or {})),
                      levels, test_mode, crop_size, stride)


# ---------------------------------------------------------------------------------------------------------
# Registered entrypoints

# Published ADE20K val mIoU (%, single scale). PoolFormer: sail-sg/poolformer segmentation/README.md (Semantic FPN,
# 40k iterations). PIIP: OpenGVLab/PIIP README (UperNet 80k, PIIP-H6B only; not buildable here, for the docs).
PUBLISHED_ADE20K = {'semfpn_poolformer_s12': 37.2, 'semfpn_poolformer_s24': 40.3, 'semfpn_poolformer_s36': 42.0,
                    'semfpn_poolformer_m36': 42.4, 'semfpn_poolformer_m48': 42.7}

_SEMFPN = dict(family='semfpn_seg', task='segmentation', paper='https://arxiv.org/abs/1901.02446',
               repo='https://github.com/sail-sg/poolformer', capabilities=('segmentation',), tiny='semfpn_seg_tiny')
_UPERNET = dict(family='upernet_seg', task='segmentation', paper='https://arxiv.org/abs/1807.10221',
                repo='https://github.com/OpenGVLab/PIIP', capabilities=('segmentation',), tiny='upernet_seg_tiny')
# The CPU models of the shapes_seg target (about 3.5 M parameters at 256 px).
_CPU_POOLFORMER = dict(backbone='poolformer_tiny', backbone_kwargs=dict(dims=(32, 64, 160, 256), depths=(2, 2, 6, 2)),
                       neck_channels=64, channels=64)


@register_model(**{**_SEMFPN, 'input_size': (3, 256, 256)}, params=3_311_478)
def semfpn_seg(**kwargs):
    """Semantic FPN on any zoo backbone: ``zoo.create('semfpn_seg', backbone='resnet18', num_classes=21)``.

    Default: a PoolFormer of about 2.9 M parameters (dims 32/64/160/256, depths 2/2/6/2) with a 64-wide FPN and
    head, 150 classes: the CPU model. Naming another ``backbone`` drops these defaults (official widths: neck 256,
    head 128).
    """
    cfg = {} if 'backbone' in kwargs else dict(_CPU_POOLFORMER)
    return build_model(semfpn_segmenter, cfg, kwargs)


@register_model(**{**_SEMFPN, 'input_size': (3, 64, 64)})
def semfpn_seg_tiny(**kwargs):
    """The CPU test variant: PoolFormer-tiny (16/32/64/96), neck and head 32 wide, 3 classes."""
    return build_model(semfpn_segmenter, dict(backbone='poolformer_tiny', num_classes=3, neck_channels=32,
                                              channels=32), kwargs)


def _official_semfpn(size: str):
    def fn(**kwargs):
        return build_model(semfpn_segmenter, dict(backbone=f'poolformer_{size}', backbone_kwargs=dict(out_norm=True)),
                           kwargs)
    fn.__name__ = f'semfpn_poolformer_{size}'
    fn.__doc__ = (f'PoolFormer-{size.upper()} + Semantic FPN as the official ADE20K model (sail-sg/poolformer '
                  f'fpn_poolformer_{size}_ade20k_40k.py: the fork_feat backbone with a norm on each output, FPN 256, '
                  f'FPNHead 128, 150 classes): {PUBLISHED_ADE20K[fn.__name__]} mIoU.')
    return fn


# Parameters: the official models' (mmseg v0.19 FPN + FPNHead, num_classes 150, on the fork_feat PoolFormer;
# derived module by module in tests/test_segmentation.py).
for _size, _params in (('s12', 15_669_846), ('s24', 25_143_638), ('s36', 34_617_430),
                       ('m36', 59_778_006), ('m48', 77_078_934)):
    _name = f'semfpn_poolformer_{_size}'
    register_model(**{**_SEMFPN, 'input_size': (3, 512, 512)}, params=_params,
                   ade20k_miou=PUBLISHED_ADE20K[_name])(_official_semfpn(_size))


@register_model(**{**_UPERNET, 'input_size': (3, 256, 256)}, params=3_559_308)
def upernet_seg(**kwargs):
    """UperNet on any zoo backbone: ``zoo.create('upernet_seg', backbone='piip_tiny', num_classes=3)``.

    Default: the CPU model on the same PoolFormer as ``semfpn_seg`` (64 channels, auxiliary head 32), 150 classes.
    Naming another ``backbone`` drops these defaults (mmseg's widths: 512, auxiliary 256).
    """
    cfg = {} if 'backbone' in kwargs else dict(backbone=_CPU_POOLFORMER['backbone'],
                                               backbone_kwargs=_CPU_POOLFORMER['backbone_kwargs'], channels=64,
                                               aux_channels=32)
    return build_model(upernet_segmenter, cfg, kwargs)


@register_model(**{**_UPERNET, 'input_size': (3, 64, 64)})
def upernet_seg_tiny(**kwargs):
    """The CPU test variant: PIIP-tiny's pyramid (128 channels at strides 4/8/16/32), UperNet 32 wide, auxiliary
    head 16, 3 classes."""
    return build_model(upernet_segmenter, dict(backbone='piip_tiny', num_classes=3, channels=32, aux_channels=16),
                       kwargs)


# Parameters: zoo's piip_tsb dense backbone (175,043,715, the official detection backbone's) + mmseg's UPerHead and
# FCNHead as configured (derived in tests/test_segmentation.py).
@register_model(**{**_UPERNET, 'input_size': (3, 512, 512)}, params=209_185_199)
def upernet_piip_tsb(**kwargs):
    """PIIP-TSB (DeiT T/S/B on 512/384/256 px; the official dense backbone: window 14, position grids of 224 px)
    with UperNet (512 channels) and the auxiliary FCN head (256), 150 classes, slide inference 512/341 as PIIP's
    ADE20K configs. PIIP publishes no TSB segmentation result (its ADE20K table is PIIP-H6B's)."""
    cfg = dict(backbone='piip_tsb', backbone_kwargs=dict(img_sizes=(256, 384, 512)), test_mode='slide')
    return build_model(upernet_segmenter, cfg, kwargs)
