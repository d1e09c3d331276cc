"""The deployable NMS belongs to the detection head (issue 44, item 2): ``head.predict`` (eager) and
``zoo.export(nms=True)`` (the graph) both run ``head.detections`` (``zoo.layers.detect.nms_rows``); the runtime layer
only joins it to the network. Its detections are those of per-image class-aware NMS with torchvision's
``batched_nms`` (what ``head.predict`` ran before)."""
from __future__ import annotations

import inspect

import pytest
import torch
from conftest import example_input
from torchvision.ops import batched_nms

import zoo
from zoo import _runtime
from zoo.layers.detect import nms_rows, rows_to_detections


@pytest.fixture(scope='module')
def detector():
    """A tiny detector whose class priors put every (anchor, class) pair above ``conf`` (real NMS work)."""
    torch.manual_seed(0)
    model = zoo.create('yolo_det', backbone='resnet_tiny', backbone_kwargs={'stem': 'imagenet'}, num_classes=3)
    model.eval().head.reset_bias(image_size=64)
    return model, example_input('yolo_det_tiny', 3, seed=1)


def _per_image_reference(y, conf, iou, max_det, multi_label=True):
    """Per image: the pairs above ``conf``, then torchvision's ``batched_nms`` by class, ``max_det`` best."""
    out = []
    for pred in y.transpose(1, 2):
        boxes, scores = pred[:, :4], pred[:, 4:]
        if multi_label:
            idx, labels = (scores > conf).nonzero(as_tuple=True)
            boxes, scores = boxes[idx], scores[idx, labels]
        else:
            scores, labels = scores.max(1)
            boxes, scores, labels = boxes[scores > conf], scores[scores > conf], labels[scores > conf]
        keep = batched_nms(boxes, scores, labels, iou)[:max_det]
        out.append({'boxes': boxes[keep], 'scores': scores[keep], 'labels': labels[keep]})
    return out


def _same(a: dict, b: dict) -> None:
    """The same set of (box, score, label) (random weights tie scores, so order is no key), best first."""
    assert len(a['scores']) == len(b['scores']) > 0
    assert torch.all(a['scores'][:-1] >= a['scores'][1:])
    same = ((a['labels'][:, None] == b['labels'][None])
            & ((a['scores'][:, None] - b['scores'][None]).abs() <= 1e-6)
            & ((a['boxes'][:, None] - b['boxes'][None]).abs() <= 1e-4).all(-1))
    assert same.any(1).all() and same.any(0).all()


def test_predict_and_the_deployable_path_agree_on_the_same_maps(detector):
    model, x = detector
    head = model.head
    with torch.no_grad():
        maps = model.forward_raw(x)
        rows = head.detections(maps)
        eager = head.predict(maps)
        y = head.decode(maps)
    assert rows.shape == (3, head.max_det, 6)
    for got, want in zip(eager, rows_to_detections(rows)):
        assert all(torch.equal(got[k], want[k]) for k in ('boxes', 'scores', 'labels'))
    for got, want in zip(eager, _per_image_reference(y, head.conf, head.iou, head.max_det)):
        _same(got, want)
    # the exported graph (torch.export, where the NMS is one call over the batch) gives the same detections
    ep = torch.export.export(_runtime._graph_module(model, nms=True), (x,))
    with torch.no_grad():
        graph = ep.module()(x)
    assert graph.shape == rows.shape
    for got, want in zip(rows_to_detections(graph), eager):
        _same(got, want)


def test_the_graph_grouping_gives_eager_detections(detector, monkeypatch):
    """The one-call grouping a captured graph takes (every (image, class) moved apart), run eagerly: the
    detections of the per-image ``batched_nms`` eager prediction takes."""
    model, x = detector
    with torch.no_grad():
        maps = model.forward_raw(x)
        eager = model.head.predict(maps)
        monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
        graph = model.head.predict(maps)
    for got, want in zip(graph, eager):
        _same(got, want)


def test_the_runtime_calls_the_head_and_defines_no_nms(detector, monkeypatch):
    model, x = detector
    source = inspect.getsource(_runtime)
    assert 'torchvision' not in source and 'nms(' not in source and 'topk' not in source
    calls = []
    original = model.head.detections

    def spy(*args, **kwargs):
        calls.append('detections')
        return original(*args, **kwargs)

    monkeypatch.setattr(model.head, 'detections', spy)
    with torch.no_grad():
        graph = _runtime._graph_module(model, nms=True)(x)
        model.head.predict(model.forward_raw(x))
    assert calls == ['detections', 'detections']
    assert graph.shape == (3, model.head.max_det, 6)


class _Rows(torch.nn.Module):
    def forward(self, y):
        return nms_rows(y, conf=0.05, iou=0.5, max_det=3)


def test_nms_rows_small_cases():
    boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 10, 10], [50, 50, 60, 60]])
    scores = torch.tensor([[0.9, 0.0], [0.8, 0.0], [0.0, 0.7], [0.0, 0.1]])
    y = torch.cat((boxes, scores), 1).T.unsqueeze(0).repeat(2, 1, 1)  # (2, 4 + nc, A): two images
    rows = nms_rows(y, conf=0.05, iou=0.5, max_det=4)
    for r in rows:  # the second box suppressed by the first (same class), the third kept (other class)
        assert r[:, 5].tolist() == [0, 1, 1, -1] and torch.allclose(r[:3, 4], torch.tensor([0.9, 0.7, 0.1]))
    assert nms_rows(y, conf=0.05, iou=0.5, max_det=2)[:, :, 5].tolist() == [[0, 1], [0, 1]]
    # best class only: the third box is the first's twin with another best class, so it is kept
    single = rows_to_detections(nms_rows(y, conf=0.05, iou=0.5, multi_label=False))
    for got, want in zip(single, _per_image_reference(y, 0.05, 0.5, 300, multi_label=False)):
        _same(got, want)
    # boxes with negative coordinates (past the top-left) of two classes: never suppress each other
    twins = torch.tensor([[-100.0, -90, -10, -20], [-100, -90, -10, -20]])
    y = torch.cat((twins, torch.tensor([[0.9, 0.0], [0.0, 0.8]])), 1).T.unsqueeze(0)
    assert nms_rows(y, conf=0.05, iou=0.5, max_det=3)[0, :, 5].tolist() == [0, 1, -1]
    ep = torch.export.export(_Rows(), (y.repeat(2, 1, 1),))  # the graph's grouping, the same
    assert ep.module()(y.repeat(2, 1, 1))[:, :, 5].tolist() == [[0, 1, -1]] * 2
    # nothing above conf: every row empty
    assert nms_rows(y, conf=0.95, iou=0.5, max_det=3)[0, :, 5].tolist() == [-1, -1, -1]
