"""timm's training augmentations for the classification DataModules, named in a recipe.

The options are those of ``timm.data.create_transform`` (timm's ``train.py`` flags of the same names):
RandAugment (Cubuk et al., "RandAugment: Practical automated data augmentation with a reduced search space",
2020) as ``auto_augment: rand-m9-mstd0.5-inc1``, AutoAugment (Cubuk et al., "AutoAugment: Learning Augmentation
Policies from Data", 2019) as ``original`` / ``v0``, AugMix as ``augmix-m5-w4``, RandomErasing (Zhong et al.,
"Random Erasing Data Augmentation", 2020) as ``re_prob``/``re_mode``/``re_count``, and the random-resized crop
(``scale``, ``ratio``, ``interpolation``), ``hflip`` and ``color_jitter``; ``crop_pct`` sets the evaluation crop.
Official code: https://github.com/huggingface/pytorch-image-models (``timm/data/transforms_factory.py``).

When none is named, a DataModule keeps its own transforms exactly. When one is named, the training transform is
timm's whole training pipeline (random-resized crop, flip, colour jitter or the auto-augment policy, to tensor,
normalise with the dataset's mean and std, random erasing), and the options not named take timm's defaults, as in
timm's ``train.py``. timm's training transforms work on PIL images: DataModules whose data are tensors convert
each image to a PIL image at the edge (:class:`OnPIL`).
"""
from __future__ import annotations

from zoo._console import close_matches

# the options a recipe names under ``data.init_args``; all default to None ("not named": the DataModule's own
# transforms). ``crop_pct`` is the evaluation crop; the others shape the training transform.
TRAIN_OPTIONS = ('auto_augment', 're_prob', 're_mode', 're_count', 'interpolation', 'scale', 'ratio', 'hflip',
                 'color_jitter')
AUTO_AUGMENT_POLICIES = ('original', 'originalr', 'v0', 'v0r', '3a')  # timm's AutoAugment policies
RE_MODES = ('const', 'rand', 'pixel')
INTERPOLATIONS = ('random', 'bilinear', 'bicubic', 'nearest', 'lanczos', 'box', 'hamming')
_AUTO_AUGMENT_FORMS = ("RandAugment 'rand-m<magnitude>[-n<ops>][-mstd<std>][-inc1]' (e.g. rand-m9-mstd0.5-inc1), "
                       "AugMix 'augmix-m<magnitude>[-w<width>]', or an AutoAugment policy: "
                       + ', '.join(AUTO_AUGMENT_POLICIES))


def _one_of(option: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{option} {value!r} is not one of {', '.join(choices)}{close_matches(value, choices, n=2)}")


class TimmAugment:
    """The timm options a DataModule was given (``named``: only those not None), checked when it is built, and
    the transforms they make for a dataset of a given ``mean``/``std`` at ``img_size``."""

    def __init__(self, named: dict):
        self.named = {k: v for k, v in named.items() if v is not None}
        self.train_options = {k: v for k, v in self.named.items() if k in TRAIN_OPTIONS}
        self.crop_pct = self.named.get('crop_pct')
        self._check()

    @property
    def train(self) -> bool:
        """A timm training augmentation was named (the training transform is timm's)."""
        return bool(self.train_options)

    def names(self) -> str:
        return ', '.join(self.named)

    def _check(self) -> None:
        o = self.named
        aa = o.get('auto_augment')
        if aa is not None:
            if not isinstance(aa, str):
                raise ValueError(f'auto_augment {aa!r}: expected {_AUTO_AUGMENT_FORMS}')
            if not aa.startswith(('rand', 'augmix')) and aa not in AUTO_AUGMENT_POLICIES:
                raise ValueError(f'auto_augment {aa!r} is not a timm policy: expected {_AUTO_AUGMENT_FORMS}'
                                 + close_matches(aa, AUTO_AUGMENT_POLICIES, n=2))
        if 're_mode' in o:
            _one_of('re_mode', o['re_mode'], RE_MODES)
        if 'interpolation' in o:
            _one_of('interpolation', o['interpolation'], INTERPOLATIONS)
        for name in ('re_prob', 'hflip'):
            if name in o and not 0 <= o[name] <= 1:
                raise ValueError(f'{name} must be a probability in [0, 1], got {o[name]}')
        if 're_count' in o and o['re_count'] < 1:
            raise ValueError(f"re_count must be >= 1 (erased rectangles per image), got {o['re_count']}")
        for name in ('scale', 'ratio'):
            if name in o and (len(o[name]) != 2 or not 0 < o[name][0] <= o[name][1]):
                raise ValueError(f'{name} must be two numbers (low, high) with 0 < low <= high, got {o[name]}')
        if self.crop_pct is not None and not 0 < self.crop_pct <= 1:
            raise ValueError(f'crop_pct must be in (0, 1] (the centre crop over the resized image), '
                             f'got {self.crop_pct}')
        if self.train:
            try:  # timm parses the policy string only when it builds the transform: build one now, not at setup
                self.train_transform((0.5,) * 3, (0.5,) * 3, 32)
            except (AssertionError, ValueError, KeyError, IndexError, TypeError) as e:
                if aa is None:  # the policy is not the cause
                    raise ValueError(f'timm.data.create_transform refused {self.names()}: '
                                     f'{type(e).__name__}: {e}') from None
                raise ValueError(f"auto_augment {aa!r} is not a timm policy ({type(e).__name__}: {e}): expected "
                                 f'{_AUTO_AUGMENT_FORMS}') from None

    def train_transform(self, mean, std, img_size: int):
        """timm's training transform: a PIL image -> a normalised float (C, img_size, img_size) tensor."""
        from timm.data import create_transform

        options = dict(self.train_options)
        for name in ('scale', 'ratio'):
            if name in options:
                options[name] = tuple(options[name])
        return _posterize_to_zero_bits(
            create_transform(img_size, is_training=True, mean=tuple(mean), std=tuple(std), **options))

    def eval_transform(self, mean, std, img_size: int):
        """timm's evaluation transform (resize to ``img_size / crop_pct``, centre crop), or None when ``crop_pct``
        was not named (the DataModule's own)."""
        if self.crop_pct is None:
            return None
        from timm.data import create_transform

        interpolation = self.named.get('interpolation', 'bilinear')
        return create_transform(img_size, is_training=False, mean=tuple(mean), std=tuple(std), crop_pct=self.crop_pct,
                                interpolation='bilinear' if interpolation == 'random' else interpolation)


def _black(img, bits_to_keep, **kwargs):
    """timm's ``posterize`` that also keeps 0 bits: a black image, what PIL gave before Pillow 13 refused
    ``bits=0`` (ValueError). timm's policies ask for 0 bits: ``v0``'s (Posterize, 0.8, 2) and RandAugment's
    ``PosterizeIncreasing`` at magnitude 10 (m9 with ``mstd`` reaches it), as TensorFlow's reference
    implementation does (tensorflow/tpu issue 495)."""
    from PIL import Image
    from timm.data.auto_augment import posterize

    return Image.new(img.mode, img.size) if bits_to_keep <= 0 else posterize(img, bits_to_keep, **kwargs)


def _posterize_to_zero_bits(transform):
    """``transform`` with every posterize op of its auto-augment policy (RandAugment, AutoAugment, AugMix) able to
    keep 0 bits (:func:`_black`); timm's ops take their function once, when they are built."""
    from timm.data.auto_augment import AugmentOp, posterize

    policies = getattr(transform, 'transforms', [transform])
    for policy in policies:
        ops = getattr(policy, 'ops', None) or [op for sub in getattr(policy, 'policy', []) for op in sub]
        for op in ops:
            if isinstance(op, AugmentOp) and op.aug_fn is posterize:
                op.aug_fn = _black
    return transform


class OnPIL:
    """A uint8 (C, H, W) tensor (C = 1 or 3) -> a PIL RGB image (grey repeated) -> ``transform`` (timm's, which
    takes PIL images) -> its first ``channels`` channels (all when None). A class, not a lambda, so that a
    DataLoader worker started by spawn can pickle it."""

    def __init__(self, transform, channels: int | None = None):
        self.transform, self.channels = transform, channels

    def __call__(self, image):
        from torchvision.transforms.v2.functional import to_pil_image
        out = self.transform(to_pil_image(image.expand(3, -1, -1)))  # (1 or 3, H, W) -> (3, H, W)
        return out if self.channels is None else out[:self.channels]
