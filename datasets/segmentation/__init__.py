"""Semantic-segmentation data (a package: ``transforms``, ``formats``, ``synthetic``, ``datamodules``), one sample
format for every source.

A sample is ``(image, mask)``: ``image`` a float (3, S, S) tensor normalised by the DataModule's ``mean`` / ``std``,
``mask`` a ``torchvision.tv_tensors.Mask`` (S, S) int64 of class ids ``0..num_classes-1``, 255 (``ignore_index``)
on pixels no loss or metric counts. :func:`collate` stacks them: ``(images (B, 3, S, S), masks (B, S, S) int64)``.
An evaluation sample (validation, test, predict) is ``(image, target)``, ``target`` the image's metadata and its
file's ground truth (``mask`` (S, S), ``file_mask`` (H, W), ``orig_size``, ``scale``, ``pad``, ``index``), as a
detection target carries its letterbox: the head predicts in the file's pixels and the metric scores there.
The evaluation loaders keep the datasets' order; ``test_set.original(i)`` is sample ``i`` as its files hold it
(uint8 image and class ids at the file's size) and ``test_set.meta(i)`` / ``.files`` name its files.

Sources (``DataModule``):

- :class:`ShapesSegDataModule` -- ``shapes_seg``: overlapping shapes on textured backgrounds (``shapes_det``'s
  drawing), classes background + 6 shape kinds, deterministic by seed.
- :class:`DigitsSegDataModule` -- ``digits_seg``: scikit-learn's real digits on canvases, class = digit + 1.
- :class:`ADE20KDataModule` -- ADE20K's layout: ``images/{training,validation}/*.jpg`` and
  ``annotations/{training,validation}/*.png`` with 0 = other (ignored) and classes 1..150; ``reduce_zero_label``
  as mmseg (0 -> 255, k -> k - 1).
- :class:`VOCSegDataModule` -- VOC / Cityscapes-style: images and label PNGs paired by a list file
  (``ImageSets/Segmentation/<split>.txt``) or by matching names in per-split folders; grey, palette-indexed or
  colour label PNGs; a file value to ignore.
- :class:`FolderSegDataModule` -- any image folder + mask folder + class-names file.

Training augmentation is ``torchvision.transforms.v2`` on image and mask together, mmseg's pipeline
(:class:`SegmentationAugment`): random resize in a ratio range, random crop of ``img_size`` with a cap on one
class's share (``cat_max_ratio``), horizontal flip, photometric distortion of the image only. Evaluation resizes
the whole image to ``img_size`` (the mask with nearest interpolation).

Bad data raises :class:`SegmentationDataError` (a ``ValueError``, like detection's) naming the file: an image
without its mask, a mask of another size than its image, a stored value that is no class (named as the file stores
it, with the values it may hold; 255 is ignored), a colour that maps to no class, an empty split. The folder
sources read every mask in ``setup``, so each of these is found before a run starts.
"""
from .datamodules import (VOC_CLASSES, ADE20KDataModule, DigitsSegDataModule, FolderSegDataModule,
                          SegmentationDataModule, SegmentationDataset, ShapesSegDataModule, VOCSegDataModule)
from .formats import Record, SegmentationDataError, read_class_names, read_mask, voc_palette
from .synthetic import draw_digits_seg, draw_shapes_seg, generate_digits_seg, generate_shapes_seg
from .transforms import (IGNORE_INDEX, NO_AUGMENT, CatMaxRandomCrop, PhotoMetricDistortion, RandomResizeRatio,
                         SegmentationAugment, collate, segmentation_transforms)

__all__ = ['SegmentationDataError', 'SegmentationDataset', 'SegmentationDataModule', 'ShapesSegDataModule',
           'DigitsSegDataModule', 'ADE20KDataModule', 'VOCSegDataModule', 'FolderSegDataModule', 'VOC_CLASSES',
           'SegmentationAugment', 'NO_AUGMENT', 'IGNORE_INDEX', 'RandomResizeRatio',
           'CatMaxRandomCrop', 'PhotoMetricDistortion', 'segmentation_transforms', 'collate', 'Record', 'read_mask',
           'read_class_names', 'voc_palette', 'draw_shapes_seg', 'draw_digits_seg', 'generate_shapes_seg',
           'generate_digits_seg']
