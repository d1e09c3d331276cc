"""Mamba-YOLO: the ODMamba backbone, the XSSBlock PAFPN neck and YOLOv8's head, in pure PyTorch.

Paper: Wang et al., "Mamba YOLO: SSMs-Based YOLO For Object Detection" (arXiv 2406.05835); AAAI 2025 as
"Mamba YOLO: A Simple Baseline for Object Detection with State Space Model". Official code:
https://github.com/HZAI-ZJNU/Mamba-YOLO (a fork of an AGPL detector framework that needs a compiled CUDA
selective scan; nothing of it is imported or copied here). Blocks: :mod:`zoo.layers.mamba`; the scan:
:mod:`zoo.layers.selective_scan`; head, loss, post-processing: :mod:`zoo.layers.detect`, :mod:`zoo.detection`.

Layout of the shipped configs (the same for T / B / L but for widths and depths)::

    SimpleStem (/4) -> VSSBlock x d1 -> VisionClueMerge (/8) -> VSSBlock x d2 -> VisionClueMerge (/16)
    -> VSSBlock x d3 -> VisionClueMerge (/32) -> VSSBlock x d4 -> SPPF        (ODMamba backbone)
    neck: up, cat C4, XSS -> up, cat C3, XSS = P3 -> conv s2, cat, XSS = P4 -> conv s2, cat C5', XSS = P5
    head: YOLOv8's decoupled DFL head on P3 / P4 / P5

| variant | widths (stem, P3, P4, P5) | VSS depths | XSS inner n |
|---|---|---|---|
| T | 32, 64, 128, 256 | 1, 1, 3, 1 | 1 |
| B | 64, 128, 256, 512 | 1, 1, 3, 1 | 1 |
| L | 96, 192, 384, 576 | 2, 2, 6, 2 | 2 |

Parameter counts (80 classes) equal the official shipped configs exactly: 6,131,704 / 21,828,000 /
57,631,024 parameters, of which the 16 fixed DFL weights are not trained (trainable 6,131,688 /
21,827,984 / 57,631,008). The paper's and README's 5.8 M (T) and 19.1 M (M = B.yaml) are not what the
released configs build; L's 57.6 M is.

Initialisation as the official code: A_logs zeros (A = -1), Ds ones, dt projections N(0, 1), every
BatchNorm eps 1e-3 and momentum 0.03, PyTorch's defaults elsewhere, the head's biases from the strides.
Every Conv + BatchNorm pair (the head's too) is a :class:`~zoo.layers.convbn.ConvBN`, so
``convbn_mode`` / ``zoo.layers.convbn.set_mode`` switch train / eval / tune / deploy; ``conv_layer``
(``'weighted'`` with ``den``) builds every 3x3 convolution, depthwise ones included.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zoo.layers.convbn import ConvBN, set_mode
from zoo.layers.detect import SPPF, ConvBNAct, DetectHead
from zoo.layers.mamba import BN_EPS, BN_MOMENTUM, SimpleStem, VisionClueMerge, VSSBlock, XSSBlock, conv_bn
from zoo.layers.weighted_conv import conv_factory

from ._builder import FeatureInfo, build_model, check_image, select_features
from ._registry import register_model
from .detection import Detector

__all__ = ['ODMamba', 'XSSPAFPN', 'MambaYOLO', 'PUBLISHED_COCO']

# COCO val2017 at 640 px, trained from scratch (official README): AP, AP50, AP75, APs, APm, APl
PUBLISHED_COCO = {
    'mamba_yolo_t': dict(ap=44.5, ap50=61.2, ap75=48.2, aps=24.7, apm=48.8, apl=62.0),
    'mamba_yolo_b': dict(ap=49.1, ap50=66.5, ap75=53.5, aps=30.6, apm=54.0, apl=66.4),
    'mamba_yolo_l': dict(ap=52.1, ap50=69.8, ap75=56.5, aps=34.1, apm=57.3, apl=68.1),
}


def _as_convbn(module: nn.Module, conv_layer=None) -> nn.Module:
    """Turn every ``ConvBNAct`` (the detection blocks' Conv + BN + SiLU) inside ``module`` into a ConvBN pair.

    The conv and BN of each become one :class:`ConvBN` (same shapes, so the same parameter count; 3x3
    convs rebuilt with ``conv_layer``), so ``set_mode`` switches them without tracing the whole model.
    """
    for m in module.modules():
        if isinstance(m, ConvBNAct) and isinstance(m.bn, nn.BatchNorm2d):
            c = m.conv
            m.conv = conv_bn(c.in_channels, c.out_channels, c.kernel_size[0], c.stride[0], c.groups,
                             conv_layer=conv_layer)
            m.bn = nn.Identity()
    return module


class ODMamba(nn.Module):
    """The ODMamba backbone: SimpleStem, four stages of VSSBlocks joined by VisionClueMerge, then SPPF.

    Returns the maps of the stages in ``out_indices`` (default the strides 8, 16, 32; the last one after
    SPPF, as the neck reads it). ``feature_info`` lists channels and reductions.
    """

    def __init__(self, in_chans: int = 3, widths: Sequence[int] = (32, 64, 128, 256),
                 depths: Sequence[int] = (1, 1, 3, 1), drop_path_rate: float = 0.0, conv_layer=None,
                 scan_method: str = 'chunked', chunk_size: int | None = None, out_indices=(1, 2, 3)):
        super().__init__()
        if len(widths) != 4 or len(depths) != 4:
            raise ValueError(f'ODMamba has four stages: widths and depths need four entries each, got '
                             f'{tuple(widths)} and {tuple(depths)}')
        self.in_chans = in_chans
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist() if drop_path_rate else [0.0] * sum(depths)
        kw = dict(conv_layer=conv_layer, scan_method=scan_method, chunk_size=chunk_size)
        self.stem = SimpleStem(in_chans, widths[0], conv_layer=conv_layer)
        stages, info, prev, j = [], [], widths[0], 0
        for i, (w, d) in enumerate(zip(widths, depths)):
            down = [VisionClueMerge(prev, w)] if i > 0 else []
            blocks = [VSSBlock(w, w, drop_path=dpr[j + k], **kw) for k in range(d)]
            j += d
            stages.append(nn.Sequential(*down, *blocks))
            info.append(FeatureInfo(w, 4 * 2 ** i, f'stages.{i}' if i < 3 else 'sppf'))
            prev = w
        self.stages = nn.ModuleList(stages)
        self.sppf = _as_convbn(SPPF(widths[-1], widths[-1], 5))
        self.out_indices, self.feature_info = select_features(info, out_indices)
        self.num_features = widths[-1]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        check_image(x, self.in_chans, 32, type(self).__name__)
        if x.shape[-2] % 32 or x.shape[-1] % 32:
            raise ValueError(f'ODMamba needs H and W divisible by 32, got {x.shape[-2]}x{x.shape[-1]}')
        x = self.stem(x)
        feats = []
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i == 3:
                x = self.sppf(x)
            if i in self.out_indices:
                feats.append(x)
        return feats


class XSSPAFPN(nn.Module):
    """Mamba-YOLO's neck: YOLOv8's path aggregation with XSSBlocks as the fusion blocks.

    top-down: T4 = XSS(cat(up(C5), C4)); P3 = XSS(cat(up(T4), C3))
    bottom-up: P4 = XSS(cat(conv_s2(P3), T4)); P5 = XSS(cat(conv_s2(P4), C5)), each XSS with ``n`` SS2D.
    """

    def __init__(self, in_channels: Sequence[int], n: int = 1, conv_layer=None, scan_method: str = 'chunked',
                 chunk_size: int | None = None):
        super().__init__()
        c3, c4, c5 = in_channels
        kw = dict(n=n, conv_layer=conv_layer, scan_method=scan_method, chunk_size=chunk_size)
        self.in_channels = self.out_channels = (c3, c4, c5)
        self.up = nn.Upsample(scale_factor=2, mode='nearest')
        self.td4 = XSSBlock(c5 + c4, c4, **kw)
        self.td3 = XSSBlock(c4 + c3, c3, **kw)
        self.down3 = nn.Sequential(conv_bn(c3, c3, 3, 2, conv_layer=conv_layer), nn.SiLU())
        self.bu4 = XSSBlock(c3 + c4, c4, **kw)
        self.down4 = nn.Sequential(conv_bn(c4, c4, 3, 2, conv_layer=conv_layer), nn.SiLU())
        self.bu5 = XSSBlock(c4 + c5, c5, **kw)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        x3, x4, x5 = feats
        t4 = self.td4(torch.cat((self.up(x5), x4), 1))          # stride 16
        p3 = self.td3(torch.cat((self.up(t4), x3), 1))          # stride 8
        p4 = self.bu4(torch.cat((self.down3(p3), t4), 1))       # stride 16
        p5 = self.bu5(torch.cat((self.down4(p4), x5), 1))       # stride 32
        return [p3, p4, p5]


class MambaYOLO(Detector):
    """ODMamba -> XSS PAFPN -> YOLOv8 head; a :class:`zoo.detection.Detector` (same loss, data, recipe).

    Train mode returns the raw maps (B, 4 * 16 + nc, H/s, W/s) for s = 8, 16, 32; eval mode ``(y, maps)``
    with y (B, 4 + nc, A) (boxes xyxy in pixels, class probabilities). Inputs: H, W multiples of 32.
    """

    def __init__(self, num_classes: int = 80, in_chans: int = 3, widths: Sequence[int] = (32, 64, 128, 256),
                 depths: Sequence[int] = (1, 1, 3, 1), neck_depth: int = 1, drop_path_rate: float = 0.0,
                 conv_layer='standard', den=None, trainable_den: bool = False, convbn_mode: str = 'train',
                 scan_method: str = 'chunked', chunk_size: int | None = None, reg_max: int = 16):
        conv = conv_factory(conv_layer, den, trainable_den)
        kw = dict(conv_layer=conv, scan_method=scan_method, chunk_size=chunk_size)
        backbone = ODMamba(in_chans, widths, depths, drop_path_rate, **kw)
        neck = XSSPAFPN([i['num_chs'] for i in backbone.feature_info], neck_depth, **kw)
        head = _as_convbn(DetectHead(neck.out_channels, num_classes, strides=(8, 16, 32), reg_max=reg_max), conv)
        super().__init__(backbone, neck, head)
        self.in_chans = in_chans
        if convbn_mode != 'train':
            set_mode(self, convbn_mode)

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if n.endswith(('A_logs', 'Ds'))}


def _create(cfg: dict, kwargs: dict):
    if kwargs.pop('features_only', False):  # the ODMamba backbone alone, strides 8 / 16 / 32
        allowed = {'in_chans', 'drop_path_rate', 'scan_method', 'chunk_size', 'out_indices', 'conv_layer', 'den',
                   'trainable_den'}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(f'ODMamba (features_only) got unknown argument(s) {", ".join(unknown)}; accepted: '
                            f'{", ".join(sorted(allowed))}')
        conv = conv_factory(kwargs.pop('conv_layer', 'standard'), kwargs.pop('den', None),
                            kwargs.pop('trainable_den', False))
        return ODMamba(widths=cfg['widths'], depths=cfg['depths'], conv_layer=conv, **kwargs)
    return build_model(MambaYOLO, cfg, kwargs)


_MAMBA_YOLO = dict(family='mamba_yolo', task='detection', paper='https://arxiv.org/abs/2406.05835',
                   repo='https://github.com/HZAI-ZJNU/Mamba-YOLO', input_size=(3, 640, 640),
                   capabilities=('features', 'tune_mode', 'weighted_conv', 'detection'), tiny='mamba_yolo_tiny')


@register_model(**_MAMBA_YOLO, params=6_131_688, coco_ap=PUBLISHED_COCO['mamba_yolo_t']['ap'])
def mamba_yolo_t(**kwargs):
    """Mamba-YOLO-T (COCO AP 44.5, official README): 6,131,704 parameters as shipped (16 fixed DFL weights)."""
    return _create(dict(widths=(32, 64, 128, 256), depths=(1, 1, 3, 1), neck_depth=1), kwargs)


@register_model(**_MAMBA_YOLO, params=21_827_984, coco_ap=PUBLISHED_COCO['mamba_yolo_b']['ap'])
def mamba_yolo_b(**kwargs):
    """Mamba-YOLO-B (the README's "M", COCO AP 49.1): 21,828,000 parameters as shipped."""
    return _create(dict(widths=(64, 128, 256, 512), depths=(1, 1, 3, 1), neck_depth=1), kwargs)


@register_model(**_MAMBA_YOLO, params=57_631_008, coco_ap=PUBLISHED_COCO['mamba_yolo_l']['ap'])
def mamba_yolo_l(**kwargs):
    """Mamba-YOLO-L (COCO AP 52.1): 57,631,024 parameters as shipped."""
    return _create(dict(widths=(96, 192, 384, 576), depths=(2, 2, 6, 2), neck_depth=2), kwargs)


@register_model(**{**_MAMBA_YOLO, 'input_size': (3, 64, 64)})
def mamba_yolo_tiny(**kwargs):
    """A CPU-sized Mamba-YOLO for tests and short runs: widths 16/32/48/64, one block per stage, 3 classes."""
    return _create(dict(widths=(16, 32, 48, 64), depths=(1, 1, 1, 1), neck_depth=1, num_classes=3), kwargs)
