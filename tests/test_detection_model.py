"""The detector's model side: head and neck parameter counts, output shapes, the assigner and the loss.

Parameter counts are YOLOv8's published per-layer figures (the model summary of ``yolov8n.yaml``, and the
Detect layer of Mamba-YOLO-T's shipped yaml, 897,664, counted on the official implementation; see
/work/shared/references/mamba_yolo.md): the head must match them for Mamba-YOLO's published totals to hold.
"""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.dense import DenseModel
from zoo.layers.assign import TaskAlignedAssigner
from zoo.layers.detect import C2f, DetectHead, PAFPN, SPPF, ConvBNAct, make_anchors, nms


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_head_parameter_count_matches_yolov8_detect():
    # Mamba-YOLO-T's Detect (P3/P4/P5 = 64/128/256, 80 classes) and YOLOv8-n's are the same layer.
    assert n_params(DetectHead((64, 128, 256), 80)) == 897_664
    # the DFL conv is counted but not trained
    head = DetectHead((64, 128, 256), 80)
    assert sum(p.numel() for p in head.parameters() if not p.requires_grad) == 16


def test_neck_blocks_match_yolov8n_summary():
    neck = PAFPN((64, 128, 256), depth=1, sppf=False)
    counts = [n_params(m) for m in (neck.td4, neck.td3, neck.down3, neck.bu4, neck.down4, neck.bu5)]
    assert counts == [148_224, 37_248, 36_992, 123_648, 147_712, 493_056]
    assert n_params(SPPF(256, 256)) == 164_608  # YOLOv8-n's SPPF (layer 9) and Mamba-YOLO-T's (layer 8)
    assert n_params(C2f(32, 32, 1, shortcut=True)) == 7_360  # YOLOv8-n layer 2


def test_neck_takes_another_fusion_block():
    calls = []

    def block(c_in, c_out, n):  # e.g. Mamba-YOLO's XSSBlock(c_in, c_out, n)
        calls.append((c_in, c_out, n))
        return ConvBNAct(c_in, c_out, 1)

    neck = PAFPN((64, 128, 256), depth=2, block=block)
    # Mamba-YOLO-T's neck: XSS(384 -> 128), XSS(192 -> 64), XSS(192 -> 128), XSS(384 -> 256)
    assert calls == [(384, 128, 2), (192, 64, 2), (192, 128, 2), (384, 256, 2)]
    outs = neck([torch.randn(1, 64, 8, 8), torch.randn(1, 128, 4, 4), torch.randn(1, 256, 2, 2)])
    assert [tuple(o.shape[1:]) for o in outs] == [(64, 8, 8), (128, 4, 4), (256, 2, 2)]


def test_conv_bn_settings():
    bn = ConvBNAct(3, 8, 3).conv.bn  # one ConvBN, so zoo.layers.convbn.set_mode switches it
    assert (bn.eps, bn.momentum) == (1e-3, 0.03)


@pytest.mark.parametrize('backbone,kw', [('poolformer_tiny', {}), ('resnet_tiny', {'stem': 'imagenet'}),
                                         ('timm/resnet10t', {})])  # five timm levels: the last three
def test_output_shapes_train_and_eval_non_square(backbone, kw):
    torch.manual_seed(0)
    nc = 5
    m = zoo.create('yolo_det', backbone=backbone, backbone_kwargs=kw, num_classes=nc, neck_channels=None)
    assert zoo.model_info('yolo_det').task == 'detection'
    x = torch.randn(2, 3, 64, 96)
    maps = m.train()(x)
    assert [tuple(t.shape) for t in maps] == [(2, 64 + nc, 8, 12), (2, 64 + nc, 4, 6), (2, 64 + nc, 2, 3)]
    m.eval()
    with torch.no_grad():
        y = m.head.decode(m.forward_raw(x))  # dense boxes and scores, before NMS
        dets = m(x)                          # eval mode: detections per image, after NMS
    a = 8 * 12 + 4 * 6 + 2 * 3
    assert y.shape == (2, 4 + nc, a)
    assert ((y[:, 4:] >= 0) & (y[:, 4:] <= 1)).all()
    # boxes are xyxy: x2 >= x1, y2 >= y1
    assert (y[:, 2] >= y[:, 0]).all() and (y[:, 3] >= y[:, 1]).all()
    assert len(dets) == 2 and dets[0]['boxes'].shape[1] == 4 and set(dets[0]) == {'boxes', 'scores', 'labels'}


def test_input_size_and_backbone_errors():
    m = zoo.create('yolo_det_tiny').eval()
    with pytest.raises(ValueError, match='divisible by 32'):
        m(torch.randn(1, 3, 64, 70))
    with pytest.raises(ValueError, match='feature level'):
        zoo.create('yolo_det', backbone='tnt_tiny')
    with pytest.raises(TypeError, match='accepts'):
        zoo.create('yolo_det_tiny', nekc_channels=(8, 8, 8))


def test_custom_neck_through_the_generic_detector():
    bb = zoo.create('poolformer_tiny', features_only=True)
    chs = [i['num_chs'] for i in bb.feature_info[-3:]]
    neck = PAFPN(chs, (16, 32, 64))
    head = DetectHead(neck.out_channels, 2, strides=[i['reduction'] for i in bb.feature_info[-3:]])
    det = DenseModel(bb, neck, head).eval()
    with torch.no_grad():
        y = det.head.decode(det.forward_raw(torch.randn(1, 3, 64, 64)))
    assert y.shape == (1, 6, 64 + 16 + 4)
    with pytest.raises(ValueError, match='strides'):
        DenseModel(bb, neck, DetectHead(neck.out_channels, 2, strides=(4, 8, 16)))


def test_necks_are_one_argument():
    """Mamba-YOLO's neck on a PoolFormer backbone, by name; same strides, the same head."""
    m = zoo.create('yolo_det', backbone='poolformer_tiny', neck='xss_pafpn', num_classes=2, sppf=False)
    assert type(m.neck).__name__ == 'XSSPAFPN' and m.strides == (8, 16, 32)
    assert [tuple(t.shape[1:]) for t in m.train()(torch.randn(1, 3, 64, 64))] == [(66, 8, 8), (66, 4, 4), (66, 2, 2)]


def test_make_anchors_centres_and_strides():
    pts, st = make_anchors([(2, 3), (1, 1)], (8, 16))
    assert pts[:3].tolist() == [[0.5, 0.5], [1.5, 0.5], [2.5, 0.5]]
    assert pts[3].tolist() == [0.5, 1.5] and pts[-1].tolist() == [0.5, 0.5]
    assert st.squeeze(1).tolist() == [8.0] * 6 + [16.0]


# --- assigner ---------------------------------------------------------------------------------------------

def _grid(n=8, stride=8):
    pts, _ = make_anchors([(n, n)], (stride,))
    return pts * stride  # (n*n, 2) pixel centres 4, 12, 20, ...


def test_assigner_positives_are_inside_the_box_and_scores_normalised():
    pts = _grid()
    a = len(pts)
    gt = torch.tensor([[[8.0, 8.0, 32.0, 24.0]]])  # covers centres x in {12, 20, 28}, y in {12, 20}: 6 anchors
    pd_boxes = gt.expand(1, a, 4).clone()  # every anchor predicts the box perfectly
    pd_scores = torch.full((1, a, 3), 0.5)
    labels, boxes, scores, fg, _ = TaskAlignedAssigner(topk=10, num_classes=3)(
        pd_scores, pd_boxes, pts, torch.tensor([[[2]]]), gt, torch.ones(1, 1, 1, dtype=torch.bool))
    inside = (pts[:, 0] > 8) & (pts[:, 0] < 32) & (pts[:, 1] > 8) & (pts[:, 1] < 24)
    assert inside.sum() == 6
    assert torch.equal(fg[0], inside)
    assert (labels[0, fg[0]] == 2).all()
    assert torch.allclose(boxes[0, fg[0]], gt[0, 0].expand(6, 4))
    # best overlap is 1, so each positive's target score for class 2 is 1 and other classes 0
    assert torch.allclose(scores[0, fg[0], 2], torch.ones(6), atol=1e-5)
    assert scores[0, fg[0], :2].abs().max() == 0 and scores[0, ~fg[0]].abs().max() == 0


def test_assigner_topk_keeps_the_best_aligned_anchors():
    pts = _grid()
    a = len(pts)
    gt = torch.tensor([[[0.0, 0.0, 64.0, 64.0]]])  # all 64 anchors are candidates
    pd_boxes = torch.tensor([0.0, 0.0, 32.0, 32.0]).expand(1, a, 4).clone()  # poor boxes...
    good = torch.arange(0, 64, 5)[:10]
    pd_boxes[0, good] = gt[0, 0]  # ...except on 10 anchors
    pd_scores = torch.full((1, a, 1), 0.3)
    *_, fg, _ = TaskAlignedAssigner(topk=10, num_classes=1)(
        pd_scores, pd_boxes, pts, torch.zeros(1, 1, 1, dtype=torch.long), gt, torch.ones(1, 1, 1, dtype=torch.bool))
    assert fg.sum() == 10 and set(fg[0].nonzero().flatten().tolist()) == set(good.tolist())


def test_assigner_anchor_claimed_twice_keeps_the_higher_overlap():
    pts = torch.tensor([[20.0, 20.0]])
    gts = torch.tensor([[[0.0, 0.0, 40.0, 40.0], [10.0, 10.0, 30.0, 30.0]]])
    pd = torch.tensor([[[10.0, 10.0, 30.0, 30.0]]])  # equals the second box
    labels, boxes, _, fg, idx = TaskAlignedAssigner(topk=10, num_classes=2)(
        torch.full((1, 1, 2), 0.5), pd, pts, torch.tensor([[[0], [1]]]), gts, torch.ones(1, 2, 1, dtype=torch.bool))
    assert fg.tolist() == [[True]] and idx.tolist() == [[1]] and labels.tolist() == [[1]]


def test_assigner_ignores_padding_and_handles_no_boxes():
    pts = _grid(4)
    a = len(pts)
    args = (torch.rand(2, a, 3), torch.rand(2, a, 4) * 8 + torch.tensor([0, 0, 8, 8.0]), pts)
    gt = torch.tensor([[[0.0, 0.0, 32.0, 32.0]], [[0.0, 0.0, 32.0, 32.0]]])
    mask = torch.tensor([[[True]], [[False]]])  # the second image's box is padding
    *_, scores, fg, _ = TaskAlignedAssigner()(*args, torch.zeros(2, 1, 1, dtype=torch.long), gt, mask)
    assert fg[0].any() and not fg[1].any() and scores[1].abs().max() == 0
    *_, scores, fg, _ = TaskAlignedAssigner()(*args, torch.zeros(2, 0, 1, dtype=torch.long),
                                              torch.zeros(2, 0, 4), torch.zeros(2, 0, 1, dtype=torch.bool))
    assert not fg.any() and scores.abs().max() == 0


# --- loss -------------------------------------------------------------------------------------------------

def _perfect_maps(head, hw, target_box, label, logit=12.0):
    """Raw maps whose DFL expectation equals each anchor's exact distances to ``target_box`` (two-bin
    interpolation, as the DFL target is defined) and whose class logits are confident for ``label``."""
    maps = []
    for (h, w), s in zip(hw, head.strides):
        pts, _ = make_anchors([(h, w)], (s,))
        tb = torch.tensor(target_box) / s
        ltrb = torch.cat((pts - tb[:2], tb[2:] - pts), -1).clamp(0, head.reg_max - 1 - 0.01)  # (HW, 4)
        lo = ltrb.floor().long()
        wr = ltrb - lo
        p = torch.full((h * w, 4, head.reg_max), 1e-12)
        p.scatter_(-1, lo.unsqueeze(-1), (1 - wr).unsqueeze(-1))
        p.scatter_(-1, (lo + 1).unsqueeze(-1), wr.unsqueeze(-1))
        box = p.clamp(min=1e-12).log().reshape(h * w, 4 * head.reg_max).T.reshape(1, 4 * head.reg_max, h, w)
        cls = torch.full((1, head.num_classes, h, w), -logit)
        cls[:, label] = logit
        maps.append(torch.cat((box, cls), 1))
    return maps


def test_perfect_prediction_gives_zero_box_loss():
    head = DetectHead((16, 32, 64), 3)
    box = [12.0, 20.0, 52.0, 44.0]
    maps = _perfect_maps(head, [(8, 8), (4, 4), (2, 2)], box, 1)
    loss = head.loss
    total, items = loss(maps, [{'boxes': torch.tensor([box]), 'labels': torch.tensor([1])}])
    assert items['box'] < 1e-5
    # a shifted prediction has a positive box loss
    maps_off = _perfect_maps(head, [(8, 8), (4, 4), (2, 2)], [b + 6 for b in box], 1)
    _, items_off = loss(maps_off, [{'boxes': torch.tensor([box]), 'labels': torch.tensor([1])}])
    assert items_off['box'] > 0.1
    assert torch.isfinite(total)


def test_loss_backward_with_empty_images_and_gains():
    torch.manual_seed(0)
    m = zoo.create('yolo_det_tiny').train()
    loss = m.head.loss
    assert m.head.gains == (7.5, 0.5, 1.5) and m.head.assigner.topk == 10
    targets = [{'boxes': torch.tensor([[4.0, 6.0, 40.0, 30.0]]), 'labels': torch.tensor([2])},
               {'boxes': torch.zeros(0, 4), 'labels': torch.zeros(0, dtype=torch.long)}]
    total, items = loss(m(torch.randn(2, 3, 64, 64)), targets)
    total.backward()
    assert all(v > 0 for v in items.values())
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    empty = [{'boxes': torch.zeros(0, 4), 'labels': torch.zeros(0, dtype=torch.long)}] * 2
    total, items = loss(m(torch.randn(2, 3, 64, 64)), empty)
    assert items['box'] == 0 and items['cls'] > 0
    total.backward()
    with pytest.raises(ValueError, match='num_classes'):
        loss(m(torch.randn(1, 3, 64, 64)), [{'boxes': torch.tensor([[0.0, 0, 9, 9]]), 'labels': torch.tensor([3])}])


def test_decode_and_loss_run_in_float32_under_bf16_autocast():
    """Issue 45, item 5: with ``--trainer.precision bf16-mixed`` the network's maps come out in bfloat16; the decode,
    the assigner and the loss must still run in float32 (autocast would put the decode's DFL convolution and matmul
    in bf16): under autocast they give what float32 maps give outside it, to float32 rounding, and a float32 loss."""
    torch.manual_seed(0)
    m = zoo.create('yolo_det_tiny').train()
    targets = [{'boxes': torch.tensor([[4.0, 6.0, 40.0, 30.0]]), 'labels': torch.tensor([2])}]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        maps = m(torch.randn(1, 3, 64, 64))
        assert all(t.dtype == torch.bfloat16 for t in maps)
        total, items = m.head.loss(maps, targets)
        boxes = m.head.decode(maps)
    ref_total, ref_items = m.head.loss([t.float() for t in maps], targets)
    assert total.dtype == torch.float32 and boxes.dtype == torch.float32
    assert torch.allclose(total, ref_total, rtol=1e-6) and all(
        torch.allclose(items[k], ref_items[k], rtol=1e-6) for k in items)
    assert torch.allclose(boxes, m.head.decode([t.float() for t in maps]), rtol=1e-6, atol=1e-5)
    total.backward()


def test_crowd_regions_are_not_training_targets():
    """COCO crowd regions (``iscrowd``) are left out of the assignment: the loss equals the loss without them,
    and differs from the loss with them as ordinary objects."""
    torch.manual_seed(0)
    m = zoo.create('yolo_det_tiny').train()
    loss = m.head.loss
    maps = m(torch.randn(2, 3, 64, 64))
    obj = {'boxes': torch.tensor([[4.0, 6.0, 40.0, 30.0]]), 'labels': torch.tensor([2])}
    crowd = {'boxes': torch.tensor([[4.0, 6.0, 40.0, 30.0], [30.0, 30.0, 62.0, 60.0]]), 'labels': torch.tensor([2, 0]),
             'iscrowd': torch.tensor([False, True])}
    only_crowd = {'boxes': torch.tensor([[8.0, 8.0, 56.0, 56.0]]), 'labels': torch.tensor([1]),
                  'iscrowd': torch.tensor([True])}
    empty = {'boxes': torch.zeros(0, 4), 'labels': torch.zeros(0, dtype=torch.long)}
    with_crowd, _ = loss(maps, [crowd, only_crowd])
    without, _ = loss(maps, [obj, empty])
    as_objects, _ = loss(maps, [{k: crowd[k] for k in ('boxes', 'labels')}, only_crowd | {'iscrowd': None}])
    assert torch.equal(with_crowd, without) and not torch.allclose(with_crowd, as_objects)


def test_postprocess_nms_is_class_aware():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]])
    scores = torch.tensor([[0.9, 0.0], [0.8, 0.0], [0.0, 0.7], [0.0, 0.1]])
    y = torch.cat((boxes, scores), 1).T.unsqueeze(0)  # (1, 4 + nc, A)
    (d,) = nms(y, conf=0.05, iou=0.5)
    # the second box is suppressed by the first (same class); the third survives (other class)
    assert d['labels'].tolist() == [0, 1, 1] and torch.allclose(d['scores'], torch.tensor([0.9, 0.7, 0.1]))
    (d,) = nms(y, conf=0.05, iou=0.5, max_det=2)
    assert len(d['scores']) == 2
