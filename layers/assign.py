"""Label assignment for dense detection heads: TOOD's task-aligned assigner (as YOLOv8 uses it).

Feng et al., "TOOD: Task-aligned One-stage Object Detection" (ICCV 2021, arXiv 2108.07755); the settings and the
normalisation follow YOLOv8's description (Ultralytics 2023; AGPL-3.0, so nothing is imported or copied from it).
Used by :class:`zoo.layers.detect.DetectHead`'s loss.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ['TaskAlignedAssigner', 'pad_targets', 'ciou']


def ciou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise complete IoU of two xyxy box tensors of the same shape (..., 4) -> (...)."""
    from torchvision.ops import complete_box_iou_loss  # lazily: keep `import zoo.layers` light
    shape = a.shape[:-1]
    return 1 - complete_box_iou_loss(a.reshape(-1, 4), b.reshape(-1, 4), reduction='none', eps=1e-7).view(shape)


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
        overlaps[bi, gi, ai] = ciou(gt_bboxes[bi, gi], pd_bboxes[bi, ai]).clamp_(0).to(overlaps.dtype)
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
