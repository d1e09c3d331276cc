"""Common image corruptions at five severities, after ImageNet-C and CIFAR-10-C, in torch only.

Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and Perturbations",
ICLR 2019 (https://arxiv.org/abs/1903.12261); official code: https://github.com/hendrycks/robustness
(``ImageNet-C/imagenet_c/imagenet_c/corruptions.py`` for 224-px images, ``ImageNet-C/create_c/make_cifar_c.py``
for 32-px ones). The parameters below are copied from those two files: ``IMAGENET_C`` for images of 128 px and
more, ``CIFAR_C`` for smaller ones (zoo's digits, shapes and CIFAR at 32-64 px), as the authors themselves chose
weaker, smaller-radius settings for CIFAR-10-C. What is approximated (no OpenCV, ImageMagick, scikit-image or the
frost photographs): the plasma fractal of fog is a sum of smooth random octaves, ImageMagick's motion blur is a
one-sided Gaussian line kernel, PIL's BOX resize of pixelate is area pooling then nearest upsampling; snow,
frost, glass blur, zoom blur, spatter and elastic are not implemented. docs/robustness.md has the table.

Every corruption takes one image ``(C, H, W)`` in [0, 1] (before normalisation) and a ``torch.Generator`` and
returns the corrupted image in [0, 1]. :func:`corrupt` seeds that generator from ``(seed, index, corruption,
severity)``, so an image's corruption does not depend on the batch it is in or the order it is drawn.
"""
from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F

from zoo._console import close_matches

__all__ = ['CORRUPTIONS', 'GROUPS', 'SEVERITIES', 'IMAGENET_C', 'CIFAR_C', 'corrupt', 'parse_corruptions',
           'parse_severities', 'params', 'CorruptedDataset']

SEVERITIES = (1, 2, 3, 4, 5)
SMALL_IMAGE = 128  # below this size (the shorter side) the CIFAR-10-C table is used

# name: the five severities' parameters, as the official files give them
IMAGENET_C = {
    'gaussian_noise': [.08, .12, .18, .26, .38],                 # std of the added noise
    'shot_noise': [60, 25, 12, 5, 3],                            # photons per unit intensity (Poisson rate)
    'impulse_noise': [.03, .06, .09, .17, .27],                  # fraction of salt-and-pepper pixels
    'speckle_noise': [.15, .2, .35, .45, .6],                    # std of the multiplicative noise
    'defocus_blur': [(3, .1), (4, .5), (6, .5), (8, .5), (10, .5)],  # disk radius, its anti-alias sigma
    'gaussian_blur': [1, 2, 3, 4, 6],                            # sigma (px)
    'motion_blur': [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],  # radius, sigma (px)
    'fog': [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],  # strength, octave decay (wibbledecay)
    'brightness': [.1, .2, .3, .4, .5],                          # added to HSV value
    'contrast': [.4, .3, .2, .1, .05],                           # kept fraction of the deviation from the mean
    'pixelate': [.6, .5, .4, .3, .25],                           # downscale factor
    'jpeg_compression': [25, 18, 15, 10, 7],                     # JPEG quality
}
CIFAR_C = {
    'gaussian_noise': [.04, .06, .08, .09, .10],
    'shot_noise': [500, 250, 100, 75, 50],
    'impulse_noise': [.01, .02, .03, .05, .07],
    'speckle_noise': [.06, .1, .12, .16, .2],
    'defocus_blur': [(.3, .4), (.4, .5), (.5, .6), (1, .2), (1.5, .1)],
    'gaussian_blur': [.4, .6, .7, .8, 1],
    'motion_blur': [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
    'fog': [(.2, 3), (.5, 3), (.75, 2.5), (1, 2), (1.5, 1.75)],
    'brightness': [.05, .1, .15, .2, .3],
    'contrast': [.75, .5, .4, .3, .15],
    'pixelate': [.95, .9, .85, .75, .65],
    'jpeg_compression': [80, 65, 58, 50, 40],
}


def params(name: str, severity: int, size: int):
    """The parameter of ``name`` at ``severity`` for an image whose shorter side is ``size`` pixels."""
    table = CIFAR_C if size < SMALL_IMAGE else IMAGENET_C
    return table[name][severity - 1]


# ----------------------------------------------------------------------------------------------------- helpers
def _filter(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Each channel of ``x`` (C, H, W) convolved with the 2-D ``kernel`` (k, k), reflected at the borders."""
    k = kernel.shape[-1]
    c = x.shape[0]
    weight = kernel.to(x.dtype).expand(c, 1, k, k)  # one kernel per channel (depthwise)
    padded = F.pad(x[None], (k // 2,) * 4, mode='reflect' if k // 2 < min(x.shape[-2:]) else 'replicate')
    return F.conv2d(padded, weight, groups=c)[0]


def _gaussian_kernel(sigma: float, radius: int | None = None) -> torch.Tensor:
    """A normalised (2r+1, 2r+1) Gaussian, r = ceil(3 sigma) unless given (scikit-image truncates at 4 sigma)."""
    r = radius if radius is not None else max(1, math.ceil(3 * sigma))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    g = torch.exp(-t ** 2 / (2 * sigma ** 2))
    g = torch.outer(g, g)
    return g / g.sum()


def _disk_kernel(radius: float, alias_blur: float) -> torch.Tensor:
    """ImageNet-C's ``disk``: the pixels within ``radius`` of the centre, averaged, then smoothed by a Gaussian of
    sigma ``alias_blur`` (a 3x3 one, as ``cv2.GaussianBlur(ksize=(3, 3))``) against aliasing."""
    r = max(8, math.ceil(radius))
    t = torch.arange(-r, r + 1, dtype=torch.float32)
    yy, xx = torch.meshgrid(t, t, indexing='ij')
    disk = (xx ** 2 + yy ** 2 <= radius ** 2).float()
    disk = disk / disk.sum()
    return _filter(disk[None], _gaussian_kernel(alias_blur, radius=1))[0]


def _smooth_field(size: int, decay: float, generator: torch.Generator) -> torch.Tensor:
    """A smooth random field in [0, 1] of shape (size, size): octaves of uniform noise at 2, 4, 8, ... cells per
    side, bilinearly upsampled, the octave at 2^k cells weighted decay^-k. It stands in for ImageNet-C's
    diamond-square plasma fractal, whose "wibble" shrinks by ``wibbledecay`` per halving of the step."""
    field = torch.zeros(1, 1, size, size)
    cells, weight = 2, 1.0
    while cells <= size:
        noise = torch.rand(1, 1, cells, cells, generator=generator) * 2 - 1
        field += weight * F.interpolate(noise, size=(size, size), mode='bilinear', align_corners=False)
        cells, weight = cells * 2, weight / decay
    field -= field.min()
    return (field / field.max().clamp_min(1e-12))[0, 0]


# ----------------------------------------------------------------------------------------------- corruptions
def gaussian_noise(x, c, g):
    return x + torch.randn(x.shape, generator=g) * c


def shot_noise(x, c, g):
    return torch.poisson(x * c, generator=g) / c


def impulse_noise(x, c, g):
    # scikit-image's 's&p': a fraction c of the values replaced, half by 1 (salt), half by 0 (pepper)
    u = torch.rand(x.shape, generator=g)
    salt = torch.rand(x.shape, generator=g) < 0.5
    return torch.where(u < c, salt.to(x.dtype), x)


def speckle_noise(x, c, g):
    return x + x * torch.randn(x.shape, generator=g) * c


def defocus_blur(x, c, g):
    return _filter(x, _disk_kernel(*c))


def gaussian_blur(x, c, g):
    return _filter(x, _gaussian_kernel(c))


def motion_blur(x, c, g):
    """A line kernel of ``radius`` pixels at a random angle in [-45, 45] degrees, weighted by a Gaussian of
    ``sigma`` along the line and one-sided (ImageMagick's ``-motion-blur`` smears towards one direction)."""
    radius, sigma = c
    angle = math.radians(float(torch.empty(1).uniform_(-45, 45, generator=g)))
    r = int(math.ceil(radius))
    kernel = torch.zeros(2 * r + 1, 2 * r + 1)
    for step in range(r + 1):  # samples along the line, from the centre outwards
        row, col = r + round(step * math.sin(angle)), r + round(step * math.cos(angle))
        kernel[row, col] += math.exp(-step ** 2 / (2 * sigma ** 2))
    return _filter(x, kernel / kernel.sum())


def fog(x, c, g):
    strength, decay = c
    top = x.max()
    size = max(x.shape[-2:])
    field = _smooth_field(2 ** math.ceil(math.log2(size)), decay, g)[:x.shape[-2], :x.shape[-1]]
    return (x + strength * field) * top / (top + strength)


def brightness(x, c, g):
    # HSV value + c with hue and saturation kept: every channel is proportional to V, so scale by (V + c) / V
    v = x.amax(dim=0, keepdim=True)
    target = (v + c).clamp(max=1)
    return torch.where(v > 0, x * target / v.clamp_min(1e-12), target.expand_as(x))


def contrast(x, c, g):
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return (x - mean) * c + mean


def pixelate(x, c, g):
    h, w = x.shape[-2:]
    small = F.interpolate(x[None], size=(max(1, int(h * c)), max(1, int(w * c))), mode='area')
    return F.interpolate(small, size=(h, w), mode='nearest-exact')[0]


def jpeg_compression(x, c, g):
    from torchvision.io import decode_jpeg, encode_jpeg

    pixels = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    return decode_jpeg(encode_jpeg(pixels, quality=int(c))).float() / 255


# name: (ImageNet-C group, function)
CORRUPTIONS = {
    'gaussian_noise': ('noise', gaussian_noise), 'shot_noise': ('noise', shot_noise),
    'impulse_noise': ('noise', impulse_noise), 'speckle_noise': ('noise', speckle_noise),
    'defocus_blur': ('blur', defocus_blur), 'gaussian_blur': ('blur', gaussian_blur),
    'motion_blur': ('blur', motion_blur),
    'fog': ('weather', fog), 'brightness': ('weather', brightness),
    'contrast': ('digital', contrast), 'pixelate': ('digital', pixelate),
    'jpeg_compression': ('digital', jpeg_compression),
}
GROUPS = ('noise', 'blur', 'weather', 'digital')
SHAPED = ('fog', 'motion_blur')  # their random draws do not depend on the severity


def corrupt(image: torch.Tensor, name: str, severity: int, seed: int = 0, index: int = 0) -> torch.Tensor:
    """``image`` (C, H, W) in [0, 1] with corruption ``name`` at ``severity`` (1-5), clipped to [0, 1].

    The random draws come from a generator seeded by ``(seed, index, name, severity)``: the same image index gives
    the same corruption in any batch, order or process (fog's field and motion blur's angle: by ``(seed, index,
    name)``, the same at every severity)."""
    if name not in CORRUPTIONS:
        parse_corruptions(name)  # the one-line error with close matches
    if severity not in SEVERITIES:
        raise ValueError(f'severity must be one of {", ".join(map(str, SEVERITIES))}; got {severity!r}')
    if image.ndim != 3:
        raise ValueError(f'expected one image (C, H, W); got shape {tuple(image.shape)}')
    # the noise is drawn anew per severity; the shape of fog and the direction of motion blur are the image's own
    # (the same at every severity), so a higher severity is the same fog denser, the same blur longer
    key = f'{seed}/{index}/{name}' + ('' if name in SHAPED else f'/{severity}')
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()) * 1_000_003 + int(seed) % 1_000_003)
    x = image.detach().float().cpu().clamp(0, 1)
    out = CORRUPTIONS[name][1](x, params(name, severity, min(x.shape[-2:])), g)
    return out.clamp(0, 1).to(image.dtype)


def parse_corruptions(spec: str | None) -> tuple[str, ...]:
    """``'all'`` (or None/empty) -> every corruption; ``'gaussian_noise,fog'`` -> those, checked; a group name
    (``noise``) -> its corruptions. An unknown name is a one-line ``ValueError`` with close matches."""
    if spec is None or str(spec).strip() in ('', 'all'):
        return tuple(CORRUPTIONS)
    names: list[str] = []
    for part in (p.strip() for p in str(spec).split(',')):
        if part == 'all':
            names += list(CORRUPTIONS)
        elif part in GROUPS:
            names += [n for n, (group, _) in CORRUPTIONS.items() if group == part]
        elif part in CORRUPTIONS:
            names.append(part)
        else:
            raise ValueError(f'unknown corruption {part!r}{close_matches(part, [*CORRUPTIONS, *GROUPS], cutoff=0.5)}'
                             f' (known: all, {", ".join(GROUPS)}, {", ".join(CORRUPTIONS)})')
    return tuple(dict.fromkeys(names))


def parse_severities(spec: str | None) -> tuple[int, ...]:
    """``'1,3,5'`` -> (1, 3, 5); None or ``'all'`` -> 1..5. Anything else is a one-line ``ValueError``."""
    if spec is None or str(spec).strip() in ('', 'all'):
        return SEVERITIES
    try:
        values = tuple(dict.fromkeys(int(p) for p in str(spec).split(',')))
    except ValueError:
        values = ()
    if not values or any(v not in SEVERITIES for v in values):
        raise ValueError(f'severities must be comma-separated integers from 1 to 5, e.g. 1,3,5; got {spec!r}')
    return values


class CorruptedDataset(torch.utils.data.Dataset):
    """``base``'s samples with one corruption at one severity: the corruption split of a test set.

    ``base`` gives ``(image, label)`` with the image normalised as ``(pixels - mean) / std``; the pixels are
    recovered, corrupted in [0, 1] and normalised again, so the model sees what it would see had the corruption
    been applied to the image file."""

    def __init__(self, base, name: str, severity: int, mean=0.0, std=1.0, seed: int = 0):
        self.base, self.name, self.severity, self.seed = base, name, severity, seed
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)  # (C or 1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        x, y = self.base[i]
        pixels = x * self.std + self.mean
        out = corrupt(pixels, self.name, self.severity, seed=self.seed, index=i)
        return (out - self.mean) / self.std, y
