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

Official weights: ``zoo.create('mamba_yolo_t', checkpoint='best.pt')`` reads the released file itself (the
whole pickled ultralytics model, read without its code by ``zoo.read_state_dict``) or an official state dict
(``DetectionModel.state_dict()``, keys ``model.<i>.``), and :meth:`MambaYOLO.remap_checkpoint` maps the layer
list onto ours; :meth:`MambaYOLO.to_official` is the inverse. The outputs then equal the official model's, but
for the box format of eval mode (official xywh, ours xyxy; ``torchvision.ops.box_convert`` converts).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from zoo.layers.convbn import set_mode
from zoo.layers.detect import SPPF, DetectHead
from zoo.layers.mamba import SimpleStem, VisionClueMerge, VSSBlock, XSSPAFPN
from zoo.layers.weighted_conv import conv_factory

from ._builder import FeatureInfo, UnknownArgumentError, build_model, check_image, run_blocks, select_features
from ._registry import register_model
from .dense import DenseModel

__all__ = ['ODMamba', 'MambaYOLO', 'PUBLISHED_COCO']

# COCO val2017 at 640 px, trained from scratch (official README): AP, AP50, AP75, APs, APm, APl
PUBLISHED_COCO = {
    'mamba_yolo_t': dict(ap=44.5, ap50=61.2, ap75=48.2, aps=24.7, apm=48.8, apl=62.0),
    'mamba_yolo_b': dict(ap=49.1, ap50=66.5, ap75=53.5, aps=30.6, apm=54.0, apl=66.4),
    'mamba_yolo_l': dict(ap=52.1, ap50=69.8, ap75=56.5, aps=34.1, apm=57.3, apl=68.1),
}


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
        self.sppf = SPPF(widths[-1], widths[-1], 5)
        self.out_indices, self.feature_info = select_features(info, out_indices)
        self.num_features = widths[-1]

    grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (``torch.utils.checkpoint``) when training."""
        self.grad_checkpointing = enable

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """A whole detector's checkpoint, official (see :meth:`MambaYOLO.remap_checkpoint`) or zoo's
        (``backbone.*``), -> this backbone's keys; the neck and head are left out."""
        if any(k.startswith('backbone.') for k in state_dict):
            return {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}
        return _remap(state_dict, _official_layers(self, '', neck_head=False), to_official=False,
                      keep=lambda k: _official_index(k) < 9)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        check_image(x, self.in_chans, 32, type(self).__name__)
        if x.shape[-2] % 32 or x.shape[-1] % 32:
            raise ValueError(f'ODMamba needs H and W divisible by 32, got {x.shape[-2]}x{x.shape[-1]}')
        x = self.stem(x)
        feats = []
        checkpointing = self.grad_checkpointing and self.training and torch.is_grad_enabled()
        for i, stage in enumerate(self.stages):
            x = run_blocks(stage, x, checkpointing)  # each block under torch.utils.checkpoint when enabled
            if i == 3:
                x = self.sppf(x)
            if i in self.out_indices:
                feats.append(x)
        return feats


class MambaYOLO(DenseModel):
    """ODMamba -> XSS PAFPN (``neck/xss_pafpn``) -> YOLOv8 head; a :class:`zoo.dense.DenseModel` (same loss, data,
    recipe as every detector) with the official checkpoint layout.

    Train mode returns the raw maps (B, 4 * 16 + nc, H/s, W/s) for s = 8, 16, 32; eval mode one dict of
    detections per image (boxes xyxy). Inputs: H, W multiples of 32.
    """

    def __init__(self, num_classes: int = 80, in_chans: int = 3, widths: Sequence[int] = (32, 64, 128, 256),
                 depths: Sequence[int] = (1, 1, 3, 1), neck_depth: int = 1, drop_path_rate: float = 0.0,
                 conv_layer='standard', den=None, trainable_den: bool = False, convbn_mode: str = 'train',
                 scan_method: str = 'chunked', chunk_size: int | None = None, reg_max: int = 16):
        conv = conv_factory(conv_layer, den, trainable_den)
        kw = dict(conv_layer=conv, scan_method=scan_method, chunk_size=chunk_size)
        backbone = ODMamba(in_chans, widths, depths, drop_path_rate, **kw)
        neck = XSSPAFPN([i['num_chs'] for i in backbone.feature_info], depth=neck_depth, **kw)
        head = DetectHead(neck.out_channels, num_classes, strides=(8, 16, 32), reg_max=reg_max, conv_layer=conv)
        super().__init__(backbone, neck, head)
        self.in_chans = in_chans
        if convbn_mode != 'train':
            set_mode(self, convbn_mode)

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if n.endswith(('A_logs', 'Ds'))}

    def remap_checkpoint(self, state_dict: dict) -> dict:
        """The official layout (ultralytics' ``DetectionModel``: the yaml's layer list ``model.<i>.``, with or
        without the ``model.`` prefix) -> ours; keys already in our layout pass unchanged.

        Per layer: SimpleStem ``conv.{0,1,3,4}`` -> ``stem.conv.{0,2}.{conv,bn}``; a VSSBlock stage
        (``model.<i>.<j>.`` when it has several blocks) ``proj_conv.{0,1}`` -> ``proj.0.{conv,bn}``, ``op`` ->
        ``ssm``, ``norm.norm`` / ``norm2.norm`` -> ``norm`` / ``norm2``, ``lsblock.{fc1,norm}`` ->
        ``lsblock.fc1.{conv,bn}``; XSSBlock likewise with ``in_proj`` and ``ss2d.<k>``; VisionClueMerge
        ``pw_linear`` -> ``pw.0``; SPPF, the stride-2 Convs and Detect's Conv+BN pairs -> our ConvBN pairs.
        """
        return _remap(state_dict, _official_layers(self.backbone, 'backbone.'), to_official=False)

    def to_official(self, state_dict: dict | None = None) -> dict:
        """Our keys (this model's state dict by default) -> the official ``DetectionModel.state_dict()`` keys."""
        sd = self.state_dict() if state_dict is None else state_dict
        return _remap(sd, _official_layers(self.backbone, 'backbone.'), to_official=True)


# -- the official layout ----------------------------------------------------------------------------------
# (official module prefix, ours) per kind of layer, most specific first; the rest of a key is unchanged.
_COMMON_SS = (('norm.norm.', 'norm.'), ('norm2.norm.', 'norm2.'), ('lsblock.fc1.', 'lsblock.fc1.conv.'),
              ('lsblock.norm.', 'lsblock.fc1.bn.'), ('lsblock.', 'lsblock.'), ('mlp.', 'mlp.'))
_RULES = {
    'stem': (('conv.0.', 'conv.0.conv.'), ('conv.1.', 'conv.0.bn.'), ('conv.3.', 'conv.2.conv.'),
             ('conv.4.', 'conv.2.bn.')),
    'vss': (('proj_conv.0.', 'proj.0.conv.'), ('proj_conv.1.', 'proj.0.bn.'), ('op.', 'ssm.'), *_COMMON_SS),
    'xss': (('in_proj.0.', 'proj.0.conv.'), ('in_proj.1.', 'proj.0.bn.'), ('ss2d.', 'ssm.'), *_COMMON_SS),
    'merge': (('pw_linear.0.', 'pw.0.conv.'), ('pw_linear.1.', 'pw.0.bn.')),
    'sppf': tuple((f'{cv}.{p}.', f'{cv}.conv.{p}.') for cv in ('cv1', 'cv2') for p in ('conv', 'bn')),
    'conv': (('conv.', 'conv.conv.'), ('bn.', 'conv.bn.')),
    'detect': (*((f'{cv}.{i}.{j}.{p}.', f'{cv}.{i}.{j}.conv.{p}.') for cv in ('cv2', 'cv3') for i in range(3)
                 for j in range(2) for p in ('conv', 'bn')),
               *((f'{cv}.{i}.2.', f'{cv}.{i}.2.') for cv in ('cv2', 'cv3') for i in range(3)), ('dfl.', 'dfl.')),
}
# the neck and head of the shipped yamls: official layer index -> (our module, kind)
_NECK_HEAD = {11: ('neck.td4.', 'xss'), 14: ('neck.td3.', 'xss'), 15: ('neck.down3.', 'conv'),
              17: ('neck.bu4.', 'xss'), 18: ('neck.down4.', 'conv'), 20: ('neck.bu5.', 'xss'), 21: ('head.', 'detect')}


def _official_layers(backbone: ODMamba, prefix: str, neck_head: bool = True) -> list[tuple[str, str, str]]:
    """(official prefix ``model.<i>.[<j>.]``, ours, kind) for every module of the official layer list.

    Layers 0-8 are the backbone (stem; per stage s a VisionClueMerge at 2s and the VSSBlocks at 2s + 1, as
    ``model.<2s+1>.<j>.`` when the stage has several, the module itself when one; SPPF at 8), 9-20 the neck
    (upsample and concat layers hold no weights), 21 the head."""
    rows = [('model.0.', f'{prefix}stem.', 'stem')]
    for s, stage in enumerate(backbone.stages):
        if s:
            rows.append((f'model.{2 * s}.', f'{prefix}stages.{s}.0.', 'merge'))
        blocks = [i for i, m in enumerate(stage) if isinstance(m, VSSBlock)]
        for j, i in enumerate(blocks):
            rows.append((f'model.{2 * s + 1}.' + (f'{j}.' if len(blocks) > 1 else ''), f'{prefix}stages.{s}.{i}.',
                         'vss'))
    rows.append(('model.8.', f'{prefix}sppf.', 'sppf'))
    return rows + [(f'model.{i}.', ours, kind) for i, (ours, kind) in _NECK_HEAD.items() if neck_head]


def _official_index(key: str) -> int:
    """The official layer index of a key (``model.<i>.`` or ``<i>.``), -1 for other keys."""
    head = key[len('model.'):] if key.startswith('model.') else key
    first = head.split('.', 1)[0]
    return int(first) if first.isdigit() else -1


def _remap(state_dict: dict, rows, to_official: bool, keep=lambda k: True) -> dict:
    """Rename keys module by module (``rows`` from :func:`_official_layers`) and within a module by its
    kind's rules; keys that match no row pass unchanged (so a wrong checkpoint is reported key by key)."""
    rows = sorted(rows, key=lambda r: -len(r[1 if to_official else 0]))  # longest (innermost) prefix first
    out = {}
    for key, value in state_dict.items():
        if not keep(key):
            continue
        if not to_official and _official_index(key) >= 0 and not key.startswith('model.'):
            key = 'model.' + key  # the reader strips a prefix every key shares
        for official, ours, kind in rows:
            src, dst = (ours, official) if to_official else (official, ours)
            if key.startswith(src):
                rest = key[len(src):]
                for a, b in _RULES[kind]:
                    a, b = (b, a) if to_official else (a, b)
                    if rest.startswith(a):
                        key = dst + b + rest[len(a):]
                        break
                break
        out[key] = value
    return out


def _create(cfg: dict, kwargs: dict):
    if kwargs.pop('features_only', False):  # the ODMamba backbone alone, strides 8 / 16 / 32
        allowed = {'in_chans', 'drop_path_rate', 'scan_method', 'chunk_size', 'out_indices', 'conv_layer', 'den',
                   'trainable_den'}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:  # the house's error, so that zoo.create_with_optional can leave out a size it does not take
            raise UnknownArgumentError(ODMamba, unknown, sorted(allowed), name='ODMamba (features_only)')
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
