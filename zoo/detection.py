"""Object detection on any zoo backbone: ``yolo_det``, YOLOv8's neck and head on a ``features_only`` model.

Head, assigner and loss follow YOLOv8 (Jocher et al., Ultralytics 2023, https://github.com/ultralytics/
ultralytics), as described in Mamba-YOLO's paper (Wang et al., AAAI 2025, https://github.com/HZAI-ZJNU/Mamba-YOLO)
and TOOD (Feng et al., ICCV 2021, arXiv 2108.07755, the task-aligned assigner). Ultralytics is AGPL-3.0:
this is an independent implementation written from those descriptions; nothing is imported or copied.

A detector is a :class:`zoo.dense.DenseModel`: backbone (any zoo or timm model built with ``features_only``,
its last three levels at strides 8/16/32) -> neck (``zoo.layers`` kind ``neck``: ``pafpn`` is YOLOv8's,
``xss_pafpn`` Mamba-YOLO's) -> head (kind ``dense_head``: ``yolov8``, :class:`zoo.layers.detect.DetectHead`,
which owns the loss and the prediction). Train mode returns the raw maps, a list of (B, 4 * reg_max + nc,
H/s, W/s); eval mode one dict per image (``boxes`` (N, 4) xyxy, ``scores``, ``labels``, after NMS; in file
pixels with ``model(x, metas)``). ``model.head.decode(model.forward_raw(x))`` gives the dense (B, 4 + nc, A)
boxes and class probabilities before NMS (YOLOv8 gives xywh there; ``torchvision.ops.box_convert``).

A family with its own detector (Mamba-YOLO) registers an entrypoint that returns a ``DenseModel`` (or a
subclass with the family's checkpoint mapping); the loss, data, recipe and COCO mAP are shared.

**Generic entrypoint**: ``zoo.create('yolo_det', backbone='poolformer_tiny', num_classes=3)``;
``neck='xss_pafpn'`` puts Mamba-YOLO's neck on any backbone.
"""
from __future__ import annotations

from collections.abc import Sequence

from ._builder import build_model
from ._registry import register_model
from .dense import DenseModel, dense_model

__all__ = ['yolo_detector']


def yolo_detector(backbone: str = 'poolformer_tiny', num_classes: int = 80, in_chans: int = 3,
                  backbone_kwargs: dict | None = None, img_size: int | Sequence[int] | None = None,
                  neck: str = 'pafpn', neck_channels: Sequence[int] | None = None, depth: int = 1, sppf: bool = True,
                  head: str = 'yolov8', reg_max: int = 16, neck_kwargs: dict | None = None,
                  head_kwargs: dict | None = None) -> DenseModel:
    """YOLOv8's neck and head on a registered zoo backbone (built once from its name).

    YOLOv8 predicts at strides 8/16/32: a backbone whose last three levels are finer (ResNet's CIFAR stem keeps
    full resolution: 2/4/8, nine times the compute) is refused with the argument that fixes it.

    Args:
        backbone: a registered model name with ``features_only`` support (or ``'timm/<name>'``).
        num_classes: object classes.
        backbone_kwargs: more arguments for the backbone (e.g. ``{'token_mixer': 'raft'}``).
        img_size: the input size, passed to backbones that take one (their weights depend on the input grid:
            Strip-MLP, raft and strip mixers, TNT); ``zoo fit`` passes the data's.
        neck: a registered neck (``pafpn``, ``xss_pafpn``); ``neck_channels`` (P3/P4/P5 widths, default the
            backbone's), ``depth`` (blocks per fusion) and ``sppf`` (an SPPF on the coarsest backbone map, as
            YOLOv8 has at the end of its backbone) go to it, with ``neck_kwargs``.
        head: a registered dense head (``yolov8``); ``reg_max`` (DFL bins) and ``head_kwargs`` (loss gains, NMS
            defaults) go to it.
    """
    model = dense_model(backbone, num_classes, in_chans, neck, head, backbone_kwargs,
                        dict(out_channels=neck_channels, depth=depth, sppf=sppf, **(neck_kwargs or {})),
                        dict(reg_max=reg_max, **(head_kwargs or {})), img_size=img_size)
    if model.strides != (8, 16, 32):
        raise ValueError(f'yolo_det predicts at strides 8/16/32, but the last three feature levels of {backbone} '
                         f'have strides {"/".join(map(str, model.strides))}: give it a stride-4 stem (ResNet\'s '
                         f"CIFAR stem keeps full resolution: backbone_kwargs={{'stem': 'imagenet'}})")
    return model


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
    return build_model(yolo_detector, cfg, kwargs)


@register_model(**{**_YOLO, 'input_size': (3, 64, 64)})
def yolo_det_tiny(**kwargs):
    """The CPU test variant: PoolFormer-tiny backbone (16/32/64/96), neck widths as the backbone's, 3 classes."""
    return build_model(yolo_detector, dict(backbone='poolformer_tiny', num_classes=3), kwargs)
