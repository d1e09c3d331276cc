"""Object detection on any zoo backbone: ``Detector(backbone, neck, head)``, the YOLOv8 loss and NMS.

Head, assigner and loss follow YOLOv8 (Jocher et al., Ultralytics 2023, https://github.com/ultralytics/
ultralytics), as described in Mamba-YOLO's paper (Wang et al., AAAI 2025, https://github.com/HZAI-ZJNU/Mamba-YOLO)
and TOOD (Feng et al., ICCV 2021, arXiv 2108.07755, the task-aligned assigner). Ultralytics is AGPL-3.0:
this is an independent implementation written from those descriptions; nothing is imported or copied.

API
---
**Backbone**: any zoo (or timm) model built with ``features_only=True`` whose ``forward`` returns a list of
maps and whose ``feature_info`` gives each map's channels and reduction (``info['num_chs']``,
``info['reduction']``). The detector uses the last three levels (a four-level backbone at strides 4/8/16/32
gives 8/16/32); their reductions become the head's strides, so they must double from level to level.
Inputs must be multiples of the coarsest stride (32).

**Neck**: any module taking the list of three maps and returning three maps at the same strides, with an
``out_channels`` attribute (tuple of three). :class:`zoo.layers.detect.PAFPN` is YOLOv8's.

**Head**: :class:`zoo.layers.detect.DetectHead` (anchor-free, decoupled, DFL with reg_max 16).

A family with its own neck (Mamba-YOLO's XSSBlock PAFPN, PIIP's) builds its detector as::

    backbone = MyBackbone(..., features_only=True)                     # feature_info with strides 8/16/32
    neck = MyNeck(in_channels=[i['num_chs'] for i in backbone.feature_info[-3:]])  # .out_channels
    head = DetectHead(neck.out_channels, num_classes, strides=[i['reduction'] for i in backbone.feature_info[-3:]])
    model = Detector(backbone, neck, head)

and registers an entrypoint with ``@register_model(family=..., task='detection', ...)``. Everything else --
:class:`DetectionLoss`, :func:`postprocess`, the data, the Lightning recipe, COCO mAP -- is shared.

**Outputs**: ``model.train()``: the raw maps, a list of (B, 4 * reg_max + nc, H/s, W/s). ``model.eval()``:
``(y, maps)`` with y of shape (B, 4 + nc, A), A = sum(H W / s^2): boxes xyxy in input pixels, then class
probabilities (YOLOv8 gives xywh here; convert with ``torchvision.ops.box_convert`` to compare).
``model.predict(x)`` returns one dict per image with ``boxes`` (N, 4) xyxy, ``scores`` (N,), ``labels`` (N,).

**Generic entrypoint**: ``zoo.create('yolo_det', backbone='poolformer_tiny', num_classes=3)`` (YOLOv8's neck
and head on any registered backbone; ``backbone_kwargs`` go to the backbone).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo.layers.detect import PAFPN, DetectHead, bbox2dist, dist2bbox

from ._builder import build_model
from ._registry import register_model

__all__ = ['Detector', 'YoloDetector', 'DetectionLoss', 'TaskAlignedAssigner', 'postprocess', 'pad_targets']


def _levels(backbone: nn.Module, n: int = 3) -> tuple[list[int], list[int]]:
    """Channels and strides of the backbone's last ``n`` levels, checked."""
    info = getattr(backbone, 'feature_info', None)
    name = getattr(backbone, 'zoo_name', type(backbone).__name__)
    if info is None:
        raise ValueError(f'{name} has no feature_info: build the backbone with features_only=True')
    if len(info) < n:
        raise ValueError(f'{name} gives {len(info)} feature level(s) (reductions '
                         f'{[i["reduction"] for i in info]}); a detector needs {n} at strides like 8/16/32')
    info = list(info)[-n:]
    chs, strides = [int(i['num_chs']) for i in info], [int(i['reduction']) for i in info]
    if any(b != 2 * a for a, b in zip(strides, strides[1:])):
        raise ValueError(f'{name}: the last {n} feature levels have reductions {strides}; they must double '
                         f'from level to level (like 8/16/32)')
    return chs, strides


class Detector(nn.Module):
    """``backbone`` (features_only) -> last three maps -> ``neck`` -> ``head``. See the module docstring."""

    def __init__(self, backbone: nn.Module, neck: nn.Module, head: DetectHead):
        super().__init__()
        _, strides = _levels(backbone)
        if tuple(strides) != tuple(head.strides):
            raise ValueError(f'head strides {head.strides} differ from the backbone reductions {tuple(strides)}')
        self.backbone, self.neck, self.head = backbone, neck, head
        self.num_classes = head.num_classes
        self.strides = head.strides

    def _check(self, x: torch.Tensor) -> None:
        name = getattr(self, 'zoo_name', type(self).__name__)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ValueError(f'{name} expects an image batch (B, C, H, W), got '
                             f'{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}')
        s = max(self.strides)
        if x.shape[-2] % s or x.shape[-1] % s:
            raise ValueError(f'{name} needs H and W divisible by {s}, got {x.shape[-2]}x{x.shape[-1]} '
                             f'(letterbox or resize the images to a multiple of {s})')

    def forward_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Raw head maps, a list of (B, 4 * reg_max + nc, H/s, W/s), in train or eval mode."""
        self._check(x)
        feats = list(self.backbone(x))[-3:]
        return self.head(self.neck(feats))

    def forward(self, x: torch.Tensor):
        maps = self.forward_maps(x)
        return maps if self.training else (self.head.decode(maps), maps)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, conf: float = 0.25, iou: float = 0.7, max_det: int = 300) -> list[dict]:
        """Detections per image after NMS: dicts of ``boxes`` (N, 4) xyxy pixels, ``scores``, ``labels``."""
        was_training = self.training
        self.eval()
        y, _ = self(x)
        self.train(was_training)
        return postprocess(y, conf=conf, iou=iou, max_det=max_det)


class YoloDetector(Detector):
    """YOLOv8's PAFPN neck and head on a registered zoo backbone (built from its name).

    YOLOv8 predicts at strides 8/16/32: a backbone whose last three levels are finer (ResNet's CIFAR stem keeps
    full resolution: 2/4/8, nine times the compute) is refused with the argument that fixes it.

    Args:
        backbone: a registered model name with ``features_only`` support (or ``'timm/<name>'``).
        num_classes: object classes.
        backbone_kwargs: more arguments for the backbone (e.g. ``{'token_mixer': 'raft'}``).
        img_size: the input size, passed to backbones that take one (their weights depend on the input grid:
            Strip-MLP, raft and strip mixers, TNT); ``zoo fit`` passes the data's.
        neck_channels: P3/P4/P5 widths (default: the backbone's).
        depth: bottlenecks per C2f in the neck.
        sppf: an SPPF on the coarsest backbone map (YOLOv8 has it at the end of its backbone).
        reg_max: DFL bins.
    """

    def __init__(self, backbone: str = 'poolformer_tiny', num_classes: int = 80, in_chans: int = 3,
                 backbone_kwargs: dict | None = None, img_size: int | Sequence[int] | None = None,
                 neck_channels: Sequence[int] | None = None, depth: int = 1, sppf: bool = True, reg_max: int = 16):
        from ._factory import create_with_optional  # the factory imports the registry, which imports this module
        kw = dict(backbone_kwargs or {})
        bb = create_with_optional(backbone, dict(img_size=img_size), in_chans=in_chans, features_only=True, **kw)
        chs, strides = _levels(bb)
        if tuple(strides) != (8, 16, 32):
            raise ValueError(f'yolo_det predicts at strides 8/16/32, but the last three feature levels of {backbone} '
                             f'have strides {"/".join(map(str, strides))}: give it a stride-4 stem (ResNet\'s CIFAR '
                             f"stem keeps full resolution: backbone_kwargs={{'stem': 'imagenet'}})")
        neck = PAFPN(chs, neck_channels, depth=depth, sppf=sppf)
        head = DetectHead(neck.out_channels, num_classes, strides=strides, reg_max=reg_max)
        super().__init__(bb, neck, head)
        self.backbone_name = backbone


# ---------------------------------------------------------------------------------------------------------
# Post-processing


def postprocess(y: torch.Tensor, conf: float = 0.25, iou: float = 0.7, max_det: int = 300,
                max_nms: int = 30000, multi_label: bool = True) -> list[dict]:
    """(B, 4 + nc, A) decoded outputs -> per-image dicts of ``boxes`` (N, 4) xyxy, ``scores``, ``labels``.

    Class-aware NMS with ``torchvision.ops.batched_nms``. ``multi_label`` keeps every (box, class) pair above
    ``conf`` (YOLOv8's validation setting, conf 0.001); otherwise each box keeps its best class.
    """
    from torchvision.ops import batched_nms  # lazily: keep `import zoo` light
    out = []
    for pred in y.transpose(1, 2):  # (B, 4 + nc, A) -> per image (A, 4 + nc)
        boxes, scores = pred[:, :4], pred[:, 4:]
        if multi_label:
            idx, labels = (scores > conf).nonzero(as_tuple=True)
            boxes, scores = boxes[idx], scores[idx, labels]
        else:
            scores, labels = scores.max(1)
            keep = scores > conf
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        if scores.numel() > max_nms:
            top = scores.topk(max_nms).indices
            boxes, scores, labels = boxes[top], scores[top], labels[top]
        keep = batched_nms(boxes.float(), scores.float(), labels, iou)[:max_det]
        out.append({'boxes': boxes[keep], 'scores': scores[keep], 'labels': labels[keep]})
    return out


# ---------------------------------------------------------------------------------------------------------
# Assignment and loss


def _objects(t: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """One target's boxes (n, 4) and labels (n,) without its crowd regions (``iscrowd``, COCO): a crowd region
    is a place where detections are not scored, not an object to regress."""
    boxes = torch.as_tensor(t['boxes'], dtype=torch.float).reshape(-1, 4)
    labels = torch.as_tensor(t['labels']).long().reshape(-1)
    if t.get('iscrowd') is not None:
        keep = ~torch.as_tensor(t['iscrowd'], device=labels.device).bool().reshape(-1)
        boxes, labels = boxes[keep], labels[keep]
    return boxes, labels


def pad_targets(targets: Sequence[dict], device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-image ``{'boxes': (n, 4) xyxy, 'labels': (n,)}`` (optional ``'iscrowd'`` (n,): those boxes are left
    out) -> padded boxes (B, M, 4), labels (B, M, 1) and a validity mask (B, M, 1), M = the largest number of
    objects (0 when no image has any)."""
    objects = [_objects(t) for t in targets]
    m = max((len(l) for _, l in objects), default=0)
    b = len(targets)
    boxes = torch.zeros(b, m, 4, device=device)
    labels = torch.zeros(b, m, 1, dtype=torch.long, device=device)
    mask = torch.zeros(b, m, 1, dtype=torch.bool, device=device)
    for i, (bx, lb) in enumerate(objects):
        n = len(lb)
        if n:
            boxes[i, :n] = bx.to(device)
            labels[i, :n, 0] = lb.to(device)
            mask[i, :n] = True
    return boxes, labels, mask


def _ciou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise complete IoU of two xyxy box tensors of the same shape (..., 4) -> (...)."""
    from torchvision.ops import complete_box_iou_loss  # lazily: keep `import zoo` light
    shape = a.shape[:-1]
    return 1 - complete_box_iou_loss(a.reshape(-1, 4), b.reshape(-1, 4), reduction='none', eps=1e-7).view(shape)


class TaskAlignedAssigner(nn.Module):
    """TOOD's task-aligned assigner, as YOLOv8 uses it (top-k 10, alpha 0.5, beta 6).

    For every ground-truth box: candidate anchors are those whose centre lies inside the box; their alignment
    is ``score^alpha * CIoU^beta`` (score = the predicted probability of the box's class, CIoU between the
    predicted and the true box); the ``topk`` best are positives. An anchor claimed by several boxes keeps
    the one it overlaps most. Target scores are one-hot labels times the alignment, normalised per box so
    that its best anchor gets that box's best CIoU.
    """

    def __init__(self, topk: int = 10, num_classes: int = 80, alpha: float = 0.5, beta: float = 6.0,
                 eps: float = 1e-9):
        super().__init__()
        self.topk, self.num_classes, self.alpha, self.beta, self.eps = topk, num_classes, alpha, beta, eps

    @torch.no_grad()
    def forward(self, pd_scores: torch.Tensor, pd_bboxes: torch.Tensor, anc_points: torch.Tensor,
                gt_labels: torch.Tensor, gt_bboxes: torch.Tensor, mask_gt: torch.Tensor):
        """
        Args:
            pd_scores (B, A, nc) probabilities; pd_bboxes (B, A, 4) xyxy; anc_points (A, 2) -- all in pixels.
            gt_labels (B, M, 1); gt_bboxes (B, M, 4) xyxy pixels; mask_gt (B, M, 1) real (not padding) boxes.
        Returns:
            target_labels (B, A), target_bboxes (B, A, 4), target_scores (B, A, nc), fg_mask (B, A) bool,
            target_gt_idx (B, A).
        """
        b, a, nc = pd_scores.shape
        m = gt_bboxes.shape[1]
        dev = pd_scores.device
        if m == 0:
            return (torch.zeros(b, a, dtype=torch.long, device=dev), torch.zeros(b, a, 4, device=dev),
                    torch.zeros_like(pd_scores), torch.zeros(b, a, dtype=torch.bool, device=dev),
                    torch.zeros(b, a, dtype=torch.long, device=dev))
        # anchors strictly inside each box: (B, M, A)
        lt = anc_points.view(1, 1, a, 2) - gt_bboxes[:, :, None, :2]
        rb = gt_bboxes[:, :, None, 2:] - anc_points.view(1, 1, a, 2)
        in_gts = torch.cat((lt, rb), -1).amin(-1) > self.eps
        valid = in_gts & mask_gt.bool()  # (B, M, A)

        # alignment metric on the candidates only
        overlaps = torch.zeros(b, m, a, dtype=pd_bboxes.dtype, device=dev)
        bi, gi, ai = valid.nonzero(as_tuple=True)
        overlaps[bi, gi, ai] = _ciou(gt_bboxes[bi, gi], pd_bboxes[bi, ai]).clamp_(0).to(overlaps.dtype)
        scores = torch.zeros(b, m, a, dtype=pd_scores.dtype, device=dev)
        scores[bi, gi, ai] = pd_scores[bi, ai, gt_labels[bi, gi, 0]]
        align = scores.pow(self.alpha) * overlaps.pow(self.beta)  # (B, M, A)

        # top-k candidates per box
        k = min(self.topk, a)
        topk_idx = align.topk(k, dim=-1).indices  # (B, M, k)
        in_topk = torch.zeros_like(valid).scatter_(-1, topk_idx, True)
        mask_pos = in_topk & valid  # (B, M, A)

        # an anchor claimed by several boxes keeps the box it overlaps most
        fg_count = mask_pos.sum(1)  # (B, A)
        if (fg_count > 1).any():
            best = F.one_hot(overlaps.argmax(1), m).permute(0, 2, 1).bool()  # (B, A) -> (B, M, A)
            mask_pos = torch.where((fg_count > 1).unsqueeze(1), best, mask_pos)
        fg_mask = mask_pos.any(1)  # (B, A)
        target_gt_idx = mask_pos.float().argmax(1)  # (B, A) index of the assigned box

        batch_idx = torch.arange(b, device=dev).unsqueeze(1)
        target_labels = gt_labels[batch_idx, target_gt_idx, 0]  # (B, A)
        target_bboxes = gt_bboxes[batch_idx, target_gt_idx]  # (B, A, 4)
        target_scores = F.one_hot(target_labels.clamp(0, nc - 1), nc).to(pd_scores.dtype) * fg_mask.unsqueeze(-1)

        # normalise: per box, scale the alignment so its maximum equals the box's best overlap
        align = align * mask_pos
        pos_align = align.amax(-1, keepdim=True)  # (B, M, 1)
        pos_overlap = (overlaps * mask_pos).amax(-1, keepdim=True)  # (B, M, 1)
        norm = (align * pos_overlap / (pos_align + self.eps)).amax(1).unsqueeze(-1)  # (B, A, 1)
        return target_labels, target_bboxes, target_scores * norm, fg_mask, target_gt_idx


class DetectionLoss(nn.Module):
    """YOLOv8's detection loss: BCE classification, CIoU box loss and distribution focal loss.

    Weighted by the task-aligned target scores and divided by their sum; gains box 7.5, cls 0.5, dfl 1.5;
    the total is multiplied by the batch size (YOLOv8's convention). ``forward(maps, targets)`` takes the raw
    head maps and per-image ``{'boxes': (n, 4) xyxy pixels, 'labels': (n,)}`` (boxes flagged by an optional
    ``'iscrowd'`` are left out: COCO crowd regions are not objects to regress) and returns
    ``(total, {'box': ..., 'cls': ..., 'dfl': ...})`` (the parts detached, after their gains).
    """

    def __init__(self, head: DetectHead, box: float = 7.5, cls: float = 0.5, dfl: float = 1.5, topk: int = 10,
                 alpha: float = 0.5, beta: float = 6.0):
        super().__init__()
        self.num_classes, self.reg_max, self.strides = head.num_classes, head.reg_max, head.strides
        self.gains = (box, cls, dfl)
        self.assigner = TaskAlignedAssigner(topk, head.num_classes, alpha, beta)
        self.register_buffer('proj', torch.arange(head.reg_max, dtype=torch.float), persistent=False)
        self._head = [head]  # not a submodule: the loss owns no parameters

    def decode(self, anchor_points: torch.Tensor, pred_dist: torch.Tensor) -> torch.Tensor:
        """(B, A, 4 * R) logits -> (B, A, 4) xyxy boxes in grid units (the expectation over the bins)."""
        b, a, _ = pred_dist.shape
        dist = pred_dist.view(b, a, 4, self.reg_max).softmax(-1) @ self.proj.to(pred_dist.dtype)  # (B, A, 4)
        return dist2bbox(dist, anchor_points)

    def dfl(self, pred_dist: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(N, 4, R) logits and (N, 4) continuous targets in [0, R - 1) -> (N, 1): cross-entropy to the two
        neighbouring bins, weighted by the distance to the other."""
        left = target.long()
        right = left + 1
        wl = right - target
        wr = 1 - wl
        ce = lambda idx: F.cross_entropy(pred_dist.flatten(0, 1), idx.flatten(), reduction='none').view(idx.shape)
        return (ce(left) * wl + ce(right) * wr).mean(-1, keepdim=True)

    def forward(self, maps: Sequence[torch.Tensor], targets: Sequence[dict]):
        head = self._head[0]
        box_logits, cls_logits = head.split(maps)  # (B, 4R, A), (B, nc, A)
        pred_dist = box_logits.transpose(1, 2).contiguous()  # (B, A, 4R)
        pred_scores = cls_logits.transpose(1, 2).contiguous()  # (B, A, nc)
        b = pred_scores.shape[0]
        anchor_points, stride = head.anchors(maps)  # (A, 2) grid units, (A, 1)
        gt_bboxes, gt_labels, mask_gt = pad_targets(targets, device=pred_scores.device)
        if (gt_labels[mask_gt.squeeze(-1)] >= self.num_classes).any():
            raise ValueError(f'a target label is >= num_classes={self.num_classes}')
        pred_bboxes = self.decode(anchor_points, pred_dist)  # (B, A, 4) grid units

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
            iou = _ciou(pred_bboxes[fg_mask], target_bboxes[fg_mask]).unsqueeze(-1)
            loss_box = ((1.0 - iou) * weight).sum() / target_scores_sum
            target_ltrb = bbox2dist(anchor_points, target_bboxes, self.reg_max - 1 - 0.01)  # (B, A, 4)
            loss_dfl = (self.dfl(pred_dist[fg_mask].view(-1, 4, self.reg_max), target_ltrb[fg_mask])
                        * weight).sum() / target_scores_sum
        parts = torch.stack((loss_box * self.gains[0], loss_cls * self.gains[1], loss_dfl * self.gains[2]))
        items = dict(zip(('box', 'cls', 'dfl'), parts.detach()))
        return parts.sum() * b, items


# ---------------------------------------------------------------------------------------------------------
# Registered entrypoints


_YOLO = dict(family='yolo_det', task='detection', paper='YOLOv8 head and PAFPN (Ultralytics 2023) on a zoo backbone',
             repo='https://github.com/ultralytics/ultralytics', capabilities=('detection',), tiny='yolo_det_tiny')


@register_model(**{**_YOLO, 'input_size': (3, 256, 256)}, params=3_407_952)
def yolo_det(**kwargs):
    """YOLOv8's neck and head on any zoo backbone: ``zoo.create('yolo_det', backbone='resnet18', num_classes=3)``.

    Default: a PoolFormer of about 1.3 M parameters (dims 32/64/128/256, depths 1/1/3/1) with a 64/128/256
    neck, 80 classes. Naming another ``backbone`` drops these defaults (its own widths, neck as wide).
    """
    cfg = {} if 'backbone' in kwargs else dict(
        backbone='poolformer_tiny', backbone_kwargs=dict(dims=(32, 64, 128, 256), depths=(1, 1, 3, 1)),
        neck_channels=(64, 128, 256))
    return build_model(YoloDetector, cfg, kwargs)


@register_model(**{**_YOLO, 'input_size': (3, 64, 64)})
def yolo_det_tiny(**kwargs):
    """The CPU test variant: PoolFormer-tiny backbone (16/32/64/96), neck widths as the backbone's, 3 classes."""
    return build_model(YoloDetector, dict(backbone='poolformer_tiny', num_classes=3), kwargs)
