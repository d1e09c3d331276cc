"""Detection blocks: the YOLOv8-style neck parts and the anchor-free decoupled head with DFL.

Written from the descriptions in Jocher et al., Ultralytics YOLOv8 (2023, https://github.com/ultralytics/
ultralytics; AGPL-3.0, so nothing is imported or copied from it) and in Mamba-YOLO (Wang et al., AAAI 2025,
https://github.com/HZAI-ZJNU/Mamba-YOLO), whose published parameter counts include this head. Distribution
focal loss: Li et al., "Generalized Focal Loss" (NeurIPS 2020, arXiv 2006.04388).

Blocks (all NCHW; every Conv + BatchNorm pair is one :class:`~zoo.layers.convbn.ConvBN`, so ``set_mode``
switches it, and ``conv_layer`` builds every convolution wider than 1x1, e.g. the weighted convolution):

- :class:`ConvBNAct` -- Conv (no bias) + BatchNorm (eps 1e-3, momentum 0.03) + SiLU ("Conv" in YOLOv8).
- :class:`Bottleneck` -- two 3x3 ConvBNActs, optional residual.
- :class:`C2f` -- 1x1 conv to 2c, split, n bottlenecks chained on the second half, every intermediate
  concatenated, 1x1 conv to the output width.
- :class:`SPPF` -- 1x1 conv to c/2, three chained 5x5 max-pools, concat the four, 1x1 conv.
- :class:`PAFPN` -- YOLOv8's neck on three maps (strides 8/16/32): top-down (upsample, concat, C2f) then
  bottom-up (3x3 stride-2 conv, concat, C2f); optional SPPF on the coarsest input.
- :class:`DFL` -- softmax over ``reg_max`` bins, then the expectation (a fixed 1x1 conv with weights 0..reg_max-1).
- :class:`DetectHead` -- per level a box branch (3x3, 3x3, 1x1 to 4*reg_max) and a class branch
  (3x3, 3x3, 1x1 to nc); widths c2 = max(16, ch0 // 4, 4 * reg_max), c3 = max(ch0, min(nc, 100)).
  ``forward`` gives the raw maps, ``decode`` boxes (xyxy, input pixels) and class probabilities, ``loss``
  YOLOv8's loss (task-aligned assignment, BCE, CIoU, DFL), ``detections`` the deployable prediction (decode and
  NMS, fixed rows per image: what an exported detector's graph holds) and ``predict`` the detections of each image
  after NMS, in the pixels of its file (``detections``, then the inverse letterbox).

Helpers: :func:`make_anchors` (cell centres, offset 0.5, and the stride per anchor), :func:`dist2bbox` and
:func:`bbox2dist` (left-top-right-bottom distances <-> xyxy boxes), :func:`nms_rows` (class-aware NMS, the one
the head's ``detections`` and an exported graph run; :func:`nms` gives its rows as per-image dicts) and
:func:`unletterbox` (input pixels -> the file's, from the data's letterbox metadata).
"""
from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register
from .assign import TaskAlignedAssigner, ciou, pad_targets
from .convbn import ConvBN

__all__ = ['ConvBNAct', 'Bottleneck', 'C2f', 'SPPF', 'PAFPN', 'DFL', 'DetectHead', 'make_anchors', 'dist2bbox',
           'bbox2dist', 'nms', 'nms_rows', 'rows_to_detections', 'unletterbox']

BN_EPS, BN_MOMENTUM = 1e-3, 0.03  # YOLOv8's BatchNorm settings (its initialize_weights)


class ConvBNAct(nn.Module):
    """Conv without bias + BatchNorm (one :class:`ConvBN`) + SiLU; ``padding`` defaults to 'same' for odd kernels;
    ``conv_layer`` builds convolutions wider than 1x1."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 1, stride: int = 1, padding: int | None = None,
                 groups: int = 1, act: bool = True, conv_layer=None):
        super().__init__()
        self.conv = ConvBN(in_chs, out_chs, kernel_size, stride, kernel_size // 2 if padding is None else padding,
                           groups=groups, conv_layer=conv_layer if kernel_size > 1 else None, eps=BN_EPS,
                           momentum=BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


class Bottleneck(nn.Module):
    """3x3 -> 3x3 ConvBNAct (hidden ``out_chs * expansion``), plus the input when ``shortcut`` and widths match."""

    def __init__(self, in_chs: int, out_chs: int, shortcut: bool = True, expansion: float = 0.5, conv_layer=None):
        super().__init__()
        hidden = int(out_chs * expansion)
        self.cv1 = ConvBNAct(in_chs, hidden, 3, conv_layer=conv_layer)
        self.cv2 = ConvBNAct(hidden, out_chs, 3, conv_layer=conv_layer)
        self.add = shortcut and in_chs == out_chs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """CSP block with two convolutions and every bottleneck output kept (YOLOv8's "C2f").

    1x1 to 2c (c = out_chs * expansion), split into two halves, ``n`` bottlenecks (expansion 1.0) chained on
    the second half, concat [half1, half2, b1, ..., bn] ((2 + n) c channels), 1x1 to ``out_chs``.
    """

    def __init__(self, in_chs: int, out_chs: int, n: int = 1, shortcut: bool = False, expansion: float = 0.5,
                 conv_layer=None):
        super().__init__()
        self.c = int(out_chs * expansion)
        self.cv1 = ConvBNAct(in_chs, 2 * self.c, 1)
        self.cv2 = ConvBNAct((2 + n) * self.c, out_chs, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, self.c, shortcut, expansion=1.0, conv_layer=conv_layer)
                               for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = list(self.cv1(x).chunk(2, dim=1))  # (B, 2c, H, W) -> 2 x (B, c, H, W)
        for m in self.m:
            ys.append(m(ys[-1]))
        return self.cv2(torch.cat(ys, dim=1))  # (B, (2 + n) c, H, W) -> (B, out_chs, H, W)


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: 1x1 to c/2, three chained k x k max-pools (stride 1), concat, 1x1."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 5):
        super().__init__()
        hidden = in_chs // 2
        self.cv1 = ConvBNAct(in_chs, hidden, 1)
        self.cv2 = ConvBNAct(hidden * 4, out_chs, 1)
        self.m = nn.MaxPool2d(kernel_size, stride=1, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ys = [self.cv1(x)]
        for _ in range(3):
            ys.append(self.m(ys[-1]))
        return self.cv2(torch.cat(ys, dim=1))  # (B, 4 * hidden, H, W) -> (B, out_chs, H, W)


@register('neck', 'pafpn', example=dict(in_channels=(8, 16, 32), out_channels=(8, 16, 16)),
          example_input=((2, 8, 16, 16), (2, 16, 8, 8), (2, 32, 4, 4)))
class PAFPN(nn.Module):
    """YOLOv8's path-aggregation neck: three maps (C3, C4, C5) -> three maps (P3, P4, P5), same strides.

    top-down:  T4 = C2f(cat(up(C5'), C4)) -> out4;  P3 = C2f(cat(up(T4), C3)) -> out3
    bottom-up: P4 = C2f(cat(conv_s2(P3), T4)) -> out4;  P5 = C2f(cat(conv_s2(P4), C5')) -> out5
    with C5' = SPPF(C5) when ``sppf`` (YOLOv8 puts SPPF at the end of its backbone; zoo backbones lack it).
    ``in_channels=out_channels=(64, 128, 256)``, ``depth=1``, ``sppf=False`` is YOLOv8-n's neck exactly.

    ``block(c_in, c_out, depth)`` builds the four fusion blocks (default :class:`C2f`): Mamba-YOLO's neck
    (``neck/xss_pafpn``, :mod:`zoo.layers.mamba`) is this PAFPN with its XSSBlock there.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: Sequence[int] | None = None, depth: int = 1,
                 sppf: bool = False, block: Callable[[int, int, int], nn.Module] | None = None, conv_layer=None):
        super().__init__()
        if len(in_channels) != 3:
            raise ValueError(f'PAFPN takes three levels (strides 8, 16, 32), got in_channels={tuple(in_channels)}')
        c3, c4, c5 = in_channels
        o3, o4, o5 = out_channels = tuple(out_channels or in_channels)
        self.in_channels, self.out_channels = tuple(in_channels), out_channels
        self.sppf = SPPF(c5, c5) if sppf else nn.Identity()
        self.up = nn.Upsample(scale_factor=2, mode='nearest')
        block = block or functools.partial(C2f, conv_layer=conv_layer)  # block(c_in, c_out, depth)
        self.td4 = block(c5 + c4, o4, depth)
        self.td3 = block(o4 + c3, o3, depth)
        self.down3 = ConvBNAct(o3, o3, 3, 2, conv_layer=conv_layer)
        self.bu4 = block(o3 + o4, o4, depth)
        self.down4 = ConvBNAct(o4, o4, 3, 2, conv_layer=conv_layer)
        self.bu5 = block(o4 + c5, o5, depth)

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        x3, x4, x5 = feats
        x5 = self.sppf(x5)
        t4 = self.td4(torch.cat((self.up(x5), x4), 1))          # stride 16
        p3 = self.td3(torch.cat((self.up(t4), x3), 1))          # stride 8
        p4 = self.bu4(torch.cat((self.down3(p3), t4), 1))       # stride 16
        p5 = self.bu5(torch.cat((self.down4(p4), x5), 1))       # stride 32
        return [p3, p4, p5]


class DFL(nn.Module):
    """Distribution focal loss integral: (B, 4 * reg_max, A) logits -> (B, 4, A) expected distances in bins.

    The expectation is a fixed 1x1 conv with weights 0..reg_max-1 (a parameter that is not trained, kept so
    parameter counts match YOLOv8's, which include its ``reg_max`` weights).
    """

    def __init__(self, reg_max: int = 16):
        super().__init__()
        self.reg_max = reg_max
        self.conv = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, 4 * R, A) -> (B, R, 4, A): bins as channels for the conv, softmax over the bins
        p = rearrange(x, 'b (four r) a -> b r four a', four=4).softmax(1)
        return rearrange(self.conv(p), 'b 1 four a -> b four a')


def float32_maps(maps: Sequence[torch.Tensor]):
    """``(maps in float32, a context that turns autocast off)``: under ``--trainer.precision bf16-mixed`` the network's
    maps come out in bfloat16, and autocast would run the decode's matmul and DFL convolution, the assigner's IoUs
    and the loss in bfloat16 too (8 bits of mantissa: a box edge at 256 px to about a pixel). The decode, the
    assigner and the loss run in float32, as the mixed-precision recipes of mmyolo and YOLOv8 keep their loss. Off
    autocast, nothing changes (and nothing is captured by an export)."""
    device = maps[0].device.type
    off = torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else contextlib.nullcontext()
    return [m.float() for m in maps], off

def make_anchors(shapes: Sequence[tuple[int, int]], strides: Sequence[int], offset: float = 0.5,
                 device=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor points at cell centres in grid units (A, 2) as (x, y), and each anchor's stride (A, 1).

    Levels are flattened row-major and concatenated in order, A = sum(H_i * W_i).
    """
    points, stride_list = [], []
    for (h, w), s in zip(shapes, strides):
        sy = torch.arange(h, device=device, dtype=dtype) + offset
        sx = torch.arange(w, device=device, dtype=dtype) + offset
        yy, xx = torch.meshgrid(sy, sx, indexing='ij')
        points.append(torch.stack((xx, yy), -1).view(-1, 2))  # (H, W, 2) -> (H*W, 2)
        stride_list.append(torch.full((h * w, 1), float(s), device=device, dtype=dtype))
    return torch.cat(points), torch.cat(stride_list)


def dist2bbox(distance: torch.Tensor, anchor_points: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """(left, top, right, bottom) distances from the anchor points -> xyxy boxes (same units)."""
    lt, rb = distance.chunk(2, dim)
    return torch.cat((anchor_points - lt, anchor_points + rb), dim)


def bbox2dist(anchor_points: torch.Tensor, bbox: torch.Tensor, max_dist: float) -> torch.Tensor:
    """xyxy boxes -> (left, top, right, bottom) distances from the anchor points, clamped to [0, max_dist]."""
    x1y1, x2y2 = bbox.chunk(2, -1)
    return torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1).clamp_(0, max_dist)


def unletterbox(boxes: torch.Tensor, meta: dict | None) -> torch.Tensor:
    """xyxy boxes in network-input pixels -> the file's pixels, undoing the data's letterbox (input = file *
    ``scale`` + ``pad``; ``meta`` holds ``scale`` (sx, sy), ``pad`` (left, top) and ``orig_size`` (H, W)),
    clipped to the file. ``meta=None``: unchanged."""
    if not meta:
        return boxes
    sx, sy = meta.get('scale', (1.0, 1.0))
    px, py = meta.get('pad', (0, 0))
    out = (boxes - boxes.new_tensor([px, py, px, py])) / boxes.new_tensor([sx, sy, sx, sy])
    h, w = meta.get('orig_size', (None, None))
    if h is not None:
        out[:, 0::2] = out[:, 0::2].clamp(0, w)
        out[:, 1::2] = out[:, 1::2].clamp(0, h)
    return out


def nms_rows(y: torch.Tensor, conf: float = 0.25, iou: float = 0.7, max_det: int = 300, max_nms: int = 30000,
             multi_label: bool = True) -> torch.Tensor:
    """(B, 4 + nc, A) decoded outputs -> (B, max_det, 6) rows of (x1, y1, x2, y2, score, label), best first in each
    image; unused rows are zeros with label -1. The deployable NMS: :meth:`DetectHead.detections` calls it, so
    ``head.predict`` (eager) and ``zoo.export(..., nms=True)`` (the graph) run the same function.

    Class-aware NMS (``torchvision.ops.nms``) as YOLOv8's validation does it: ``multi_label`` keeps every (box,
    class) pair above ``conf`` (otherwise each box keeps its best class); of the ``max_nms`` best pairs of each
    image, those above ``conf`` go to NMS within each (image, class); at most ``max_det`` per image stay. Every
    shape is static but the batch and the counts of pairs above ``conf`` (data-dependent sizes ``torch.export`` and
    ONNX keep), so it exports with a dynamic batch.
    """
    b, nc = y.shape[0], y.shape[1] - 4
    boxes, scores = y[:, :4].transpose(1, 2), y[:, 4:].transpose(1, 2)  # (B, A, 4), (B, A, nc)
    if multi_label:
        k = min(max_nms, scores.shape[1] * nc)
        top, idx = scores.flatten(1).topk(k, dim=1)  # (B, k) best over (anchor, class) pairs
        anchor, labels = idx // nc, idx % nc
    else:
        best, cls = scores.max(2)  # (B, A)
        k = min(max_nms, best.shape[1])
        top, anchor = best.topk(k, dim=1)
        labels = cls.gather(1, anchor)
    cand = boxes.gather(1, anchor.unsqueeze(-1).expand(-1, -1, 4))  # (B, k, 4)
    image = torch.arange(b, device=y.device).unsqueeze(1).expand(-1, k)  # (B, k)
    flat, score, label = cand.flatten(0, 1), top.flatten(), labels.flatten()  # (B * k, ...)
    # Only pairs above conf go to NMS, so it costs what the pairs above conf cost. Dropping them first changes
    # nothing: greedy NMS visits boxes best first, so a box under conf never suppresses one above it.
    sel = (score > conf).nonzero().squeeze(1)
    keep = _class_aware_nms(flat, score, label, image.flatten(), sel, iou, b, nc)
    # rank of each kept pair within its image (sorted by score there) -> at most max_det per image
    img = keep // k
    rank = (img.unsqueeze(1) == torch.arange(b, device=y.device)).cumsum(0).gather(1, img.unsqueeze(1))[:, 0] - 1
    ok = rank < max_det
    keep, img, rank = keep[ok], img[ok], rank[ok]
    rows = torch.cat((flat[keep], score[keep, None], label[keep, None].to(flat.dtype)), 1)
    out = torch.zeros(b, max_det, 6, dtype=flat.dtype, device=y.device)
    out[..., 5] = -1
    return out.index_put((img, rank), rows)


def _class_aware_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, images: torch.Tensor,
                     sel: torch.Tensor, iou: float, b: int, nc: int) -> torch.Tensor:
    """NMS (``torchvision.ops``) of the pairs ``sel`` within each (image, class) group: the kept indices, each
    image's best first.

    The same detections two ways, because greedy NMS compares each kept box with every later one, so its cost grows
    with the square of the boxes in one call. Eagerly, torchvision's ``batched_nms`` per image (it moves the classes
    apart for a few boxes and loops over them for many). In a captured graph (``torch.export``, ONNX), where a loop
    over the images would fix the batch size and ``batched_nms``'s loop over ``torch.unique(classes)`` cannot be
    captured, one ``nms`` call with every (image, class) group moved apart. One call for the whole batch eagerly:
    38 s against 0.6 s for 4 images of 8400 anchors x 80 classes above conf 0.001 (an untrained 640-pixel COCO
    detector, one CPU thread); a loop over the 80 classes in the graph instead: ONNX export of a tiny 80-class
    detector in 125 s against 18 s.
    """
    from torchvision.ops import batched_nms, nms  # lazily: keep `import zoo.layers` light
    # IoU does not change with a translation. With every coordinate >= 0, groups moved apart by multiples of
    # (max + 1) (batched_nms's trick) stay apart; a box past the image's top-left could otherwise reach the group
    # before its own.
    boxes = boxes.float() - boxes.min().float()
    if torch.compiler.is_compiling():
        group = (images * nc + labels)[sel]
        return sel[nms(boxes[sel] + (group.float() * (boxes.max() + 1))[:, None], scores[sel].float(), iou)]
    image_sel = images[sel]
    return torch.cat([s[batched_nms(boxes[s], scores[s].float(), labels[s], iou)]
                      for s in (sel[image_sel == i] for i in range(b))])


def rows_to_detections(rows: torch.Tensor) -> list[dict]:
    """(B, max_det, 6) rows of :func:`nms_rows` -> per-image dicts of ``boxes`` (N, 4) xyxy, ``scores``, ``labels``
    (the unused rows, label -1, left out)."""
    out = []
    for r in rows:
        r = r[r[:, 5] >= 0]
        out.append({'boxes': r[:, :4], 'scores': r[:, 4], 'labels': r[:, 5].long()})
    return out


def nms(y: torch.Tensor, conf: float = 0.25, iou: float = 0.7, max_det: int = 300, max_nms: int = 30000,
        multi_label: bool = True) -> list[dict]:
    """(B, 4 + nc, A) decoded outputs -> per-image dicts of ``boxes`` (N, 4) xyxy, ``scores``, ``labels``:
    :func:`nms_rows`, per image."""
    return rows_to_detections(nms_rows(y, conf, iou, max_det, max_nms, multi_label))


@register('dense_head', 'yolov8', example=dict(in_channels=(8, 16, 16), num_classes=3, strides=(8, 16, 32)),
          example_input=((2, 8, 16, 16), (2, 16, 8, 8), (2, 16, 4, 4)))
class DetectHead(nn.Module):
    """YOLOv8's anchor-free decoupled head with DFL box regression; it owns its loss and its prediction.

    Args:
        in_channels: channels of the input maps, one per level (e.g. the neck's P3, P4, P5).
        num_classes: object classes (no background class; scores are per-class sigmoids).
        strides: the stride of each input map from the image (8, 16, 32).
        reg_max: DFL bins per box side (distances 0..reg_max-1 in stride units).
        conv_layer: builds the 3x3 convolutions (``nn.Conv2d`` by default).
        box_gain, cls_gain, dfl_gain: the loss gains (YOLOv8: 7.5, 0.5, 1.5).
        topk, alpha, beta: the task-aligned assigner (:class:`~zoo.layers.assign.TaskAlignedAssigner`).
        conf, iou, max_det: ``predict``'s NMS defaults (YOLOv8's validation: 0.001, 0.7, 300).

    ``forward(maps)`` returns the raw maps, a list of (B, 4 * reg_max + nc, H_i, W_i).
    ``decode(maps)`` returns (B, 4 + nc, A): boxes xyxy in input pixels, then class probabilities.
    ``loss(maps, targets)``, ``detections(maps)`` (the deployable NMS) and ``predict(maps, metas)``: see their
    docstrings.
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int = 80, strides: Sequence[int] = (8, 16, 32),
                 reg_max: int = 16, conv_layer=None, box_gain: float = 7.5, cls_gain: float = 0.5,
                 dfl_gain: float = 1.5, topk: int = 10, alpha: float = 0.5, beta: float = 6.0, conf: float = 0.001,
                 iou: float = 0.7, max_det: int = 300):
        super().__init__()
        if len(in_channels) != len(strides):
            raise ValueError(f'DetectHead: {len(in_channels)} input levels but {len(strides)} strides')
        if num_classes < 1:
            raise ValueError(f'DetectHead: num_classes must be >= 1, got {num_classes}')
        self.in_channels, self.num_classes, self.reg_max = tuple(in_channels), num_classes, reg_max
        self.strides = tuple(int(s) for s in strides)
        self.num_outputs = 4 * reg_max + num_classes
        c2 = max(16, in_channels[0] // 4, 4 * reg_max)
        c3 = max(in_channels[0], min(num_classes, 100))
        conv = functools.partial(ConvBNAct, kernel_size=3, conv_layer=conv_layer)
        self.cv2 = nn.ModuleList(nn.Sequential(conv(c, c2), conv(c2, c2), nn.Conv2d(c2, 4 * reg_max, 1))
                                 for c in in_channels)
        self.cv3 = nn.ModuleList(nn.Sequential(conv(c, c3), conv(c3, c3), nn.Conv2d(c3, num_classes, 1))
                                 for c in in_channels)
        self.dfl = DFL(reg_max)
        self.gains = (box_gain, cls_gain, dfl_gain)
        self.assigner = TaskAlignedAssigner(topk, num_classes, alpha, beta)
        self.conf, self.iou, self.max_det = conf, iou, max_det
        self.register_buffer('proj', torch.arange(reg_max, dtype=torch.float), persistent=False)
        self.reset_bias()

    @torch.no_grad()
    def reset_bias(self, image_size: int = 640) -> None:
        """Box logits start at 1; class logits at the prior of ~5 objects per ``image_size``^2 image."""
        for box, cls, s in zip(self.cv2, self.cv3, self.strides):
            box[-1].bias.fill_(1.0)
            cls[-1].bias.fill_(math.log(5 / self.num_classes / (image_size / s) ** 2))

    def forward(self, feats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(feats) != len(self.cv2):
            raise ValueError(f'DetectHead expects {len(self.cv2)} maps (strides {self.strides}), got {len(feats)}')
        return [torch.cat((box(x), cls(x)), 1) for x, box, cls in zip(feats, self.cv2, self.cv3)]

    def split(self, maps: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Raw maps -> box logits (B, 4 * reg_max, A) and class logits (B, nc, A), levels concatenated."""
        flat = torch.cat([m.flatten(2) for m in maps], 2)  # (B, 4R + nc, H_i, W_i) -> (B, 4R + nc, A)
        return flat.split((4 * self.reg_max, self.num_classes), 1)

    def anchors(self, maps: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Anchor points (A, 2) in grid units and strides (A, 1) for these maps."""
        return make_anchors([m.shape[-2:] for m in maps], self.strides, device=maps[0].device, dtype=maps[0].dtype)

    def decode(self, maps: Sequence[torch.Tensor]) -> torch.Tensor:
        """Raw maps -> (B, 4 + nc, A): xyxy boxes in input pixels, then sigmoid class scores (float32)."""
        maps, off = float32_maps(maps)
        with off:
            box, cls = self.split(maps)
            points, stride = self.anchors(maps)
            # (B, 4, A) distances in bins -> xyxy in grid units -> pixels
            boxes = dist2bbox(self.dfl(box), points.transpose(0, 1).unsqueeze(0), dim=1) * stride.transpose(0, 1)
            return torch.cat((boxes, cls.sigmoid()), 1)

    def detections(self, maps: Sequence[torch.Tensor], conf: float | None = None, iou: float | None = None,
                   max_det: int | None = None) -> torch.Tensor:
        """The deployable prediction: raw maps -> (B, max_det, 6) rows of (x1, y1, x2, y2, score, label) in input
        pixels, best first; unused rows are zeros with label -1 (decode, then :func:`nms_rows`). Export-traceable:
        ``zoo.export(det, path, x, nms=True)`` captures this method, and :meth:`predict` calls it, so the file
        and eager prediction give the same detections. ``conf``/``iou``/``max_det`` default to the head's."""
        return nms_rows(self.decode(maps), conf=self.conf if conf is None else conf,
                        iou=self.iou if iou is None else iou, max_det=self.max_det if max_det is None else max_det)

    @torch.no_grad()
    def predict(self, maps: Sequence[torch.Tensor], metas: Sequence[dict] | None = None, conf: float | None = None,
                iou: float | None = None, max_det: int | None = None) -> list[dict]:
        """Detections per image after NMS (``boxes`` (N, 4) xyxy, ``scores``, ``labels``), in the pixels of each
        image's file when ``metas`` (one dict per image: the data's ``orig_size``, ``scale``, ``pad``) is given,
        else in input pixels: :meth:`detections` (the graph ``zoo.export(nms=True)`` writes), then the inverse
        letterbox. ``conf``/``iou``/``max_det`` default to the head's."""
        dets = rows_to_detections(self.detections(maps, conf, iou, max_det))
        if metas is not None:
            dets = [{**d, 'boxes': unletterbox(d['boxes'].float(), m)} for d, m in zip(dets, metas)]
        return dets

    # -- the loss ------------------------------------------------------------------------------------------
    def _decode_dist(self, anchor_points: torch.Tensor, pred_dist: torch.Tensor) -> torch.Tensor:
        """(B, A, 4 * R) logits -> (B, A, 4) xyxy boxes in grid units (the expectation over the bins)."""
        b, a, _ = pred_dist.shape
        dist = pred_dist.view(b, a, 4, self.reg_max).softmax(-1) @ self.proj.to(pred_dist.dtype)  # (B, A, 4)
        return dist2bbox(dist, anchor_points)

    def _dfl(self, pred_dist: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(N, 4, R) logits and (N, 4) continuous targets in [0, R - 1) -> (N, 1): cross-entropy to the two
        neighbouring bins, weighted by the distance to the other."""
        left = target.long()
        right = left + 1
        wl = right - target
        wr = 1 - wl
        ce = lambda idx: F.cross_entropy(pred_dist.flatten(0, 1), idx.flatten(), reduction='none').view(idx.shape)
        return (ce(left) * wl + ce(right) * wr).mean(-1, keepdim=True)

    def loss(self, maps: Sequence[torch.Tensor], targets: Sequence[dict]):
        """YOLOv8's loss on the raw maps: BCE classification, CIoU box loss and distribution focal loss, weighted
        by the task-aligned target scores and divided by their sum, times the gains; the total is multiplied by
        the batch size (YOLOv8's convention). ``targets``: one ``{'boxes': (n, 4) xyxy input pixels, 'labels':
        (n,)}`` per image (boxes flagged by an optional ``'iscrowd'`` are left out: COCO crowd regions are not
        objects to regress). Returns ``(total, {'box': ..., 'cls': ..., 'dfl': ...})`` (the parts detached), computed in
        float32 whatever the maps' dtype (:func:`float32_maps`)."""
        maps, off = float32_maps(maps)
        with off:
            return self._loss(maps, targets)

    def _loss(self, maps: Sequence[torch.Tensor], targets: Sequence[dict]):
        box_logits, cls_logits = self.split(maps)  # (B, 4R, A), (B, nc, A)
        pred_dist = box_logits.transpose(1, 2).contiguous()  # (B, A, 4R)
        pred_scores = cls_logits.transpose(1, 2).contiguous()  # (B, A, nc)
        b = pred_scores.shape[0]
        anchor_points, stride = self.anchors(maps)  # (A, 2) grid units, (A, 1)
        gt_bboxes, gt_labels, mask_gt = pad_targets(targets, device=pred_scores.device)
        if (gt_labels[mask_gt.squeeze(-1)] >= self.num_classes).any():
            raise ValueError(f'a target label is >= num_classes={self.num_classes}')
        pred_bboxes = self._decode_dist(anchor_points, pred_dist)  # (B, A, 4) grid units

        _, target_bboxes, target_scores, fg_mask, _ = self.assigner(
            pred_scores.detach().sigmoid(), (pred_bboxes.detach() * stride).to(gt_bboxes.dtype),
            anchor_points * stride, gt_labels, gt_bboxes, mask_gt)
        target_scores_sum = target_scores.sum().clamp(min=1)

        loss_cls = F.binary_cross_entropy_with_logits(pred_scores, target_scores.to(pred_scores.dtype),
                                                      reduction='sum') / target_scores_sum
        loss_box = loss_dfl = pred_dist.sum() * 0  # keeps the graph when no anchor is positive
        if fg_mask.any():
            target_bboxes = target_bboxes / stride  # pixels -> grid units
            weight = target_scores.sum(-1)[fg_mask].unsqueeze(-1)  # (N, 1)
            overlap = ciou(pred_bboxes[fg_mask], target_bboxes[fg_mask]).unsqueeze(-1)
            loss_box = ((1.0 - overlap) * weight).sum() / target_scores_sum
            target_ltrb = bbox2dist(anchor_points, target_bboxes, self.reg_max - 1 - 0.01)  # (B, A, 4)
            loss_dfl = (self._dfl(pred_dist[fg_mask].view(-1, 4, self.reg_max), target_ltrb[fg_mask])
                        * weight).sum() / target_scores_sum
        parts = torch.stack((loss_box * self.gains[0], loss_cls * self.gains[1], loss_dfl * self.gains[2]))
        items = dict(zip(('box', 'cls', 'dfl'), parts.detach()))
        return parts.sum() * b, items
