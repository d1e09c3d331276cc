"""zoo.datasets: LightningDataModules and generators for the built-in datasets.

Every image DataModule has fixed, seeded train/val/test splits and the attributes ``num_classes``,
``in_chans`` and ``img_size`` (the command line passes them to the model); segmentation DataModules also have
``class_names``, ``ignore_index`` (255), ``mean``, ``std`` and ``palette`` (:mod:`zoo.datasets.segmentation`).
Every DataModule names the registry task it serves as ``zoo_task`` (``zoo fit`` refuses another task's system).
Missing data raises :class:`DatasetNotFoundError`, naming the expected path and how to obtain the data.

Exports load lazily (PEP 562), so ``import zoo.datasets`` does not import Lightning until a
DataModule is used.
"""
from __future__ import annotations

from zoo._lazy import lazy_exports

_EXPORTS = {
    'ImageDataModule': '_base', 'DatasetNotFoundError': '_base',
    'DigitsDataModule': 'digits',
    'CIFAR10DataModule': 'cifar', 'CIFAR100DataModule': 'cifar',
    'ImageFolderDataModule': 'folder',
    'ShapesDataModule': 'shapes', 'generate_shapes': 'shapes', 'SHAPES': 'shapes',
    'FakeDataModule': 'fake',
    'PhotoPatchesDataModule': 'photos',
    'SyntheticLMDataModule': 'synthetic_data',  # issue 7: synthetic reasoning tasks
    # issue 16: object detection (COCO and YOLO folders, procedural shapes_det / digits_det)
    'CocoDetectionDataModule': 'detection', 'YoloDetectionDataModule': 'detection',
    'ShapesDetDataModule': 'detection', 'DigitsDetDataModule': 'detection', 'DetectionDataError': 'detection',
    'DataError': '_base',
    # issue 28: semantic segmentation (ADE20K, VOC-style and image + mask folders, procedural shapes_seg / digits_seg)
    'ShapesSegDataModule': 'segmentation', 'DigitsSegDataModule': 'segmentation',
    'ADE20KDataModule': 'segmentation', 'VOCSegDataModule': 'segmentation', 'FolderSegDataModule': 'segmentation',
    'SegmentationDataError': 'segmentation',
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
