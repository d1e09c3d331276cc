"""Object-detection data (a package: ``transforms``, ``formats``, ``synthetic``, ``datamodules``): COCO and YOLO folders, and two procedural sets, all with one sample format.

A sample is ``(image, target)``: ``image`` a float (3, S, S) tensor in [0, 1] (``tv_tensors.Image``) and
``target`` a dict with ``boxes`` (``tv_tensors.BoundingBoxes``, xyxy pixels of the network input), ``labels``
(long, contiguous 0..num_classes-1), ``iscrowd`` (bool, True for a COCO crowd region: ignored by the loss, and by
COCO mAP as COCOeval does), for COCO files the annotation's ``area`` (the file's pixels, as COCOeval's
small / medium / large ranges read it), ``image_id`` (int), ``index`` (the sample's position in its dataset),
``orig_size`` (H, W) of the file and ``scale``/``pad`` of the letterbox (input = orig * scale + pad), so
predictions and boxes map back to the file's pixels with :func:`unletterbox`. :func:`collate` stacks the images and keeps the targets as a list (one per image, any
number of boxes, zero included).

Sources (``DataModule`` / dataset):

- :class:`CocoDetectionDataModule` -- ``root/annotations/instances_<split>.json`` + images in ``root/<split>/``
  (COCO 2017's layout). Category ids are mapped to contiguous labels (sorted by id); ``categories`` maps back.
  Crowd annotations (``iscrowd: 1``) are kept with ``iscrowd`` True: the loss skips them, validation mAP
  ignores detections on them as COCOeval does.
- :class:`YoloDetectionDataModule` -- an ultralytics-format folder: ``data.yaml`` (``path``, ``train``, ``val``,
  optional ``test``, ``names``), ``images/<split>/*.jpg`` and ``labels/<split>/*.txt`` with one
  ``cls cx cy w h`` line per object (normalised to [0, 1]). An image without a label file has no objects.
- :class:`ShapesDetDataModule` -- procedural: several coloured shapes per image on textured backgrounds,
  deterministic by seed (the shapes of :mod:`zoo.datasets.shapes`, 6 classes).
- :class:`DigitsDetDataModule` -- scikit-learn's 1,797 real handwritten digits pasted at random positions and
  scales on larger noisy canvases (classes 0-9); no download.

Training augmentation is ``torchvision.transforms.v2`` (boxes follow every geometric step): optional mosaic
(four images in a 2x2 canvas, a random crop of the input size), horizontal flip, random affine scale and
translation, colour jitter, then boxes are clamped and degenerate ones removed (``SanitizeBoundingBoxes``).
Evaluation keeps every ground-truth box, however small, as COCOeval on the file does.
Files are letterboxed (resized keeping the aspect ratio, padded with grey) to ``img_size``, a multiple of 32.

Bad data raises :class:`DetectionDataError` naming the file (and line or annotation): a missing image, a box
with a negative width or height, a box further outside its image than ``box_tolerance`` (boxes up to it are
clipped, counted and reported once), a class id out of range, a malformed label line, invalid JSON or YAML, a YOLO
split in which no image has a label file, an empty split.
"""
from .datamodules import (CocoDetectionDataModule, DetectionDataModule, DetectionDataset, DigitsDetDataModule,
                          ShapesDetDataModule, YoloDetectionDataModule)
from .formats import BoxCheck, DetectionDataError, read_coco, read_json, read_yaml, read_yolo, read_yolo_labels
from .synthetic import generate_digits_det, generate_shapes_det
from .transforms import DetectionAugment, collate, detection_transforms, letterbox

__all__ = ['DetectionDataError', 'DetectionDataset', 'DetectionAugment', 'collate', 'letterbox', 'detection_transforms',
           'read_coco', 'read_yolo', 'read_yolo_labels', 'read_json', 'read_yaml', 'BoxCheck', 'generate_shapes_det',
           'generate_digits_det', 'DetectionDataModule', 'CocoDetectionDataModule', 'YoloDetectionDataModule',
           'ShapesDetDataModule', 'DigitsDetDataModule']
