"""Grayscale patches of the photographs scikit-image ships (``skimage.data``, available offline).

Training draws random ``patch_size`` crops (with random flips and 90-degree rotations, as DnCNN trains)
from the training photographs; validation and test use a fixed held-out set of whole photographs.
Every image is converted to grayscale in [0, 1] and, by default, downscaled so its longer side is at
most ``max_side`` pixels, which keeps whole-image evaluation affordable on a CPU (``max_side=None``
keeps the full resolution). Clean images only: the denoising system adds the noise.
"""
from __future__ import annotations

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from ._base import DatasetNotFoundError, EpochLoader

__all__ = ['PhotoPatchesDataModule', 'load_photo', 'TRAIN_PHOTOS', 'HELD_OUT_PHOTOS']

# Natural photographs bundled in scikit-image's wheel (no download); synthetic images are left out.
TRAIN_PHOTOS = ('astronaut', 'coffee', 'chelsea', 'rocket', 'page', 'immunohistochemistry', 'hubble_deep_field',
                'brick', 'grass', 'gravel', 'clock', 'cell', 'retina', 'text')
HELD_OUT_PHOTOS = ('camera', 'coins', 'moon')


def load_photo(name: str, max_side: int | None = None) -> torch.Tensor:
    """``skimage.data.<name>()`` as a (1, H, W) float tensor in [0, 1], optionally downscaled."""
    import skimage.data
    from skimage.transform import rescale
    loader = getattr(skimage.data, name, None)
    if loader is None:
        raise ValueError(f'skimage.data has no image {name!r}; choose from {", ".join(TRAIN_PHOTOS + HELD_OUT_PHOTOS)}')
    try:
        img = loader()
    except Exception as e:  # an image that needs pooch / a download in this scikit-image version
        raise DatasetNotFoundError(f'skimage.data.{name}() is not available offline ({type(e).__name__}: {e}); '
                                   f'install scikit-image with its bundled data (pip install scikit-image) or '
                                   f'choose another image') from None
    img = _grey(np.asarray(img))
    if max_side is not None and max(img.shape) > max_side:
        img = rescale(img, max_side / max(img.shape), anti_aliasing=True).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(img))[None]  # (1, H, W)


def _grey(img: np.ndarray) -> np.ndarray:
    """An (H, W), (H, W, 3) or (H, W, 4) image -> (H, W) float32 grey in [0, 1] (scikit-image's luminance)."""
    from skimage.color import rgb2gray, rgba2rgb
    if img.ndim == 3:
        img = rgb2gray(rgba2rgb(img) if img.shape[-1] == 4 else img)
    return img.astype(np.float32) / (255.0 if img.dtype == np.uint8 or img.max() > 1 else 1.0)


class RandomPatches(Dataset):
    """``length`` random crops (with a random flip / rot90) from a list of (1, H, W) images."""

    def __init__(self, images: list[torch.Tensor], patch_size: int, length: int):
        small = [tuple(im.shape[-2:]) for im in images if min(im.shape[-2:]) < patch_size]
        if small:
            raise ValueError(f'patch_size {patch_size} is larger than training image(s) of size {small}')
        self.images, self.patch_size, self.length = images, patch_size, length
        areas = torch.tensor([im.shape[-1] * im.shape[-2] for im in images], dtype=torch.float)
        self.weights = areas / areas.sum()  # sample images in proportion to their area

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        im = self.images[torch.multinomial(self.weights, 1).item()]
        h, w, p = im.shape[-2], im.shape[-1], self.patch_size
        y, x = torch.randint(0, h - p + 1, ()).item(), torch.randint(0, w - p + 1, ()).item()
        patch = im[:, y:y + p, x:x + p]
        if torch.rand(()) < 0.5:
            patch = patch.flip(-1)
        return torch.rot90(patch, int(torch.randint(0, 4, ())), (-2, -1)).contiguous()


class _Images(Dataset):
    def __init__(self, images: list[torch.Tensor]):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i]


class PhotoPatchesDataModule(LightningDataModule):
    """Random grayscale patches of scikit-image's photographs for training; held-out whole photos to evaluate.

    Batches are clean images (B, 1, H, W) in [0, 1]; validation and test batches hold one whole image.
    """

    zoo_task = 'denoising'
    in_chans = 1
    num_classes = None

    def __init__(self, patch_size: int = 40, batch_size: int = 64, patches_per_epoch: int = 2048,
                 max_side: int | None = 128, train_images: list[str] | None = None,
                 held_out_images: list[str] | None = None, num_workers: int = 0, seed: int = 0):
        super().__init__()
        if patch_size < 3 or batch_size < 1 or patches_per_epoch < 1:
            raise ValueError(f'patch_size >= 3, batch_size >= 1 and patches_per_epoch >= 1 expected, got '
                             f'{patch_size}, {batch_size}, {patches_per_epoch}')
        train = tuple(train_images or TRAIN_PHOTOS)
        held = tuple(held_out_images or HELD_OUT_PHOTOS)
        if set(train) & set(held):
            raise ValueError(f'images {sorted(set(train) & set(held))} are both training and held-out images')
        self.train_names, self.held_out_names = train, held
        self.patch_size, self.batch_size, self.patches_per_epoch = patch_size, batch_size, patches_per_epoch
        self.max_side, self.num_workers, self.seed = max_side, num_workers, seed
        self.img_size = patch_size

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, 'train_set', None) is not None:
            return
        self.train_set = RandomPatches([load_photo(n, self.max_side) for n in self.train_names], self.patch_size,
                                       self.patches_per_epoch)
        self.val_set = self.test_set = _Images([load_photo(n, self.max_side) for n in self.held_out_names])

    def train_dataloader(self) -> DataLoader:
        # patches are drawn at random by the dataset itself, from the RNG the loader seeds per epoch
        return EpochLoader(self.train_set, batch_size=self.batch_size, seed=self.seed, num_workers=self.num_workers,
                           drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return EpochLoader(self.val_set, batch_size=1, seed=self.seed, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def eval_transform(self):
        """An image file (uint8 RGB (3, H, W)) -> (1, H, W) grey in [0, 1], as the held-out photographs, at the file's
        own size: a file to denoise brings its own noise, which downscaling to ``max_side`` would average away
        (``zoo predict --images``)."""
        return lambda image: torch.from_numpy(_grey(image.permute(1, 2, 0).numpy()))[None]  # CHW -> HWC -> (1, H, W)

    def predict_dataloader(self) -> DataLoader:
        # ``zoo predict --images DIR`` points the predict split at those files (``zoo.datasets.images``)
        predict = getattr(self, 'predict_set', None)
        return self.val_dataloader() if predict is None else EpochLoader(predict, batch_size=1, seed=self.seed,
                                                                         num_workers=self.num_workers)
