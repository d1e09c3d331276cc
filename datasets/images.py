"""A folder of new, unlabelled images as the predict split of ``zoo predict -c RECIPE --images DIR``.

The folder is searched recursively for image files (``.jpg .jpeg .png .bmp .webp .tif .tiff``, any size, grey,
RGB, RGBA or palette), each read as RGB. They reach the network exactly as the recipe's test images do, through the
DataModule's own evaluation pipeline: a classification or denoising DataModule's ``eval_transform()``; for detection
and segmentation the DataModule's own evaluation dataset (``_make``: the letterbox, or the resize and mean/std) over
records without labels, which carry each file's size, scale and padding as a test sample does, so boxes and masks
map back to the file's pixels. Writers name their outputs by :attr:`ImageFiles.names` (the path below the folder,
``.png``); a dataset built here carries its files as ``image_files``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from ._base import DataError, DatasetNotFoundError, image_size
from .segmentation.formats import IMG_EXTS, Record, find_images, read_image

__all__ = ['ImageFiles', 'ImageFileDataset', 'predict_dataset']


class ImageFiles:
    """The image files below ``folder`` (recursively, sorted). A missing or empty folder, one without image files, a
    file that is not a readable image or two files that would write the same output are refused here, in one line,
    before anything runs."""

    def __init__(self, folder: str | Path):
        self.root = Path(folder)
        expected = f'expected a folder of image files ({" ".join(IMG_EXTS)}; sub-folders are searched too)'
        if not self.root.is_dir():
            raise DatasetNotFoundError(f'--images {folder}: ' + ('not a folder' if self.root.exists() else
                                                                 'no such folder') + f'; {expected}')
        self.paths = find_images(self.root)
        if not self.paths:
            what = 'the folder is empty' if not any(self.root.iterdir()) else 'no image file in it'
            raise DatasetNotFoundError(f'--images {folder}: {what}; {expected}')
        for path in self.paths:  # headers only: a broken file is named now, not half-way through the predictions
            image_size(path, DataError)
        self.files = [p.relative_to(self.root).as_posix() for p in self.paths]  # as the user names them
        self.names = [str(Path(f).with_suffix('.png')) for f in self.files]  # what the writers write
        seen: dict[str, Path] = {}
        for name, path in zip(self.names, self.paths):
            if name in seen:
                raise DataError(f'--images {folder}: {seen[name].name} and {path.name} would both be written as '
                                f'{name}; rename one of them')
            seen[name] = path

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, i: int):
        """File ``i`` as a uint8 RGB (3, H, W) tensor."""
        return read_image(self.paths[i])


class ImageFileDataset(Dataset):
    """``(transform(file i), i)``: classification and denoising inputs, in the order of :attr:`image_files`."""

    def __init__(self, files: ImageFiles, transform):
        self.image_files, self.transform = files, transform

    def __len__(self) -> int:
        return len(self.image_files)

    def __getitem__(self, i: int):
        return self.transform(self.image_files.read(i)), i


def predict_dataset(datamodule, folder: str | Path) -> Dataset:
    """The files of ``folder`` through ``datamodule``'s own evaluation pipeline (module docstring), with
    ``image_files`` set on it."""
    from .detection import DetectionDataModule
    from .segmentation import SegmentationDataModule

    files = ImageFiles(folder)
    if isinstance(datamodule, DetectionDataModule):
        def detection_record(i: int):
            return (lambda: (files.read(i), np.zeros((0, 4), np.float32), np.zeros(0, np.int64)), i,
                    str(files.paths[i]))
        dataset = datamodule._make([detection_record(i) for i in range(len(files))], False, 'images')
    elif isinstance(datamodule, SegmentationDataModule):
        def segmentation_record(i: int) -> Record:
            def load():
                image = files.read(i)  # no ground truth: every pixel "ignore"
                return image, np.full(tuple(image.shape[-2:]), datamodule.ignore_index, np.int64)
            return Record(load, files.names[i], files.paths[i])
        dataset = datamodule._make([segmentation_record(i) for i in range(len(files))], False, 'images')
    elif callable(getattr(datamodule, 'eval_transform', None)):
        dataset = ImageFileDataset(files, datamodule.eval_transform())
    else:
        raise ValueError(f'--images: {type(datamodule).__name__} has no evaluation transform for image files '
                         f'(its inputs are not images read from files)')
    dataset.image_files = files
    return dataset
