"""scikit-learn's handwritten digits: 1,797 real 8x8 greyscale images of 10 classes, shipped with
scikit-learn (UCI "Optical Recognition of Handwritten Digits"), so nothing is downloaded.

The demo dataset: images are scaled to [0, 1], upsampled (bilinear) to ``img_size`` and normalised;
training adds a small random translation, or timm's augmentations when a recipe names them
(``zoo.datasets.augment``: the grey images go through timm as RGB PIL images, grey repeated, and come out grey).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._base import ImageDataModule, TransformTensorDataset, split_indices
from .augment import OnPIL


class RandomShift:
    """Translate a (C, H, W) tensor by up to ``max_shift`` pixels (zero fill), like RandomCrop with padding."""

    def __init__(self, max_shift: int):
        self.max_shift = max_shift

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.max_shift == 0:
            return x
        p = self.max_shift
        dy, dx = torch.randint(0, 2 * p + 1, (2,)).tolist()
        h, w = x.shape[-2:]
        return F.pad(x, (p, p, p, p))[..., dy:dy + h, dx:dx + w]  # (C, H+2p, W+2p) -> (C, H, W)


class DigitsDataModule(ImageDataModule):
    """Digits with a fixed seeded split: ``val_fraction`` and ``test_fraction`` of the 1,797 images held out.

    ``in_chans=3`` repeats the grey channel, for models (or checkpoints) that expect RGB.
    """

    num_classes = 10
    # Mean/std of the 8x8 pixel values scaled to [0, 1] (over all 1,797 images).
    mean, std = 0.3053, 0.3761

    def __init__(self, batch_size: int = 64, num_workers: int = 0, img_size: int = 32, seed: int = 0,
                 val_fraction: float = 0.2, test_fraction: float = 0.1, split_seed: int = 0, augment: bool = True,
                 in_chans: int = 1, **timm_augment):
        super().__init__(batch_size=batch_size, num_workers=num_workers, img_size=img_size, seed=seed, **timm_augment)
        if in_chans not in (1, 3):
            raise ValueError(f'in_chans must be 1 (grey) or 3 (grey repeated, for RGB models), got {in_chans}')
        self.in_chans = in_chans
        split_indices(10, (val_fraction, test_fraction), 0)  # validate the fractions now, not at setup
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.augment = augment
        if not augment:
            self._refuse_timm_augment('augment is false (training without augmentation)')
        if self.timm_augment.crop_pct is not None:
            raise ValueError('DigitsDataModule: crop_pct cannot apply: the digits are upsampled whole to img_size '
                             'for evaluation (crop_pct is for CIFAR and image folders)')

    def _upsample(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, h, w) -> (N, 1, S, S), bilinear to ``img_size``."""
        return F.interpolate(x, size=(self.img_size, self.img_size), mode='bilinear', align_corners=False)

    def _to_input(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 1, h, w) grey in [0, 1] -> (N, in_chans, S, S): upsampled (bilinear) to ``img_size``, normalised."""
        x = self._upsample(x)
        return ((x - self.mean) / self.std).expand(-1, self.in_chans, -1, -1).contiguous()

    def _timm_train(self, images: torch.Tensor, labels: torch.Tensor) -> TransformTensorDataset:
        """The training split through timm's transform: grey in [0, 1] (N, 1, h, w) -> upsampled uint8 (N, 1, S, S)
        kept in memory; each image becomes an RGB PIL image (grey repeated) for timm, normalised with the grey
        mean/std on every channel, and the first ``in_chans`` channels are kept (timm's ops keep R = G = B)."""
        transform = self.timm_augment.train_transform((self.mean,) * 3, (self.std,) * 3, self.img_size)
        grey = (self._upsample(images) * 255).round().clamp(0, 255).to(torch.uint8)
        return TransformTensorDataset(grey, labels, OnPIL(transform, self.in_chans))

    def eval_transform(self):
        """An image file (uint8 RGB (3, H, W), any size) -> the test split's input: grey in [0, 1] (white digits on
        black, as the data), then :meth:`_to_input` (``zoo predict --images``)."""
        from torchvision.transforms.v2.functional import rgb_to_grayscale
        return lambda image: self._to_input(rgb_to_grayscale(image)[None].float() / 255)[0]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits

        data = load_digits()
        grey = torch.as_tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # 0..16 -> [0, 1]
        x = self._to_input(grey)
        y = torch.as_tensor(data.target, dtype=torch.long)
        train, val, test = split_indices(len(x), (self.val_fraction, self.test_fraction), self.split_seed)
        if self.timm_augment.train:
            self.train_set = self._timm_train(grey[train], y[train])
        else:
            shift = RandomShift(max(1, self.img_size // 16)) if self.augment else None
            self.train_set = TransformTensorDataset(x[train], y[train], shift)
        self.val_set = TransformTensorDataset(x[val], y[val])
        self.test_set = TransformTensorDataset(x[test], y[test])
        self._check_sizes()
