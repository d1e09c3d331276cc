"""Segmentation data on disk: label PNGs (grey, palette-indexed or colour-coded), class-name files and the pairing
of images with their masks (ADE20K's layout, VOC / Cityscapes-style folders with a list file or matching names, a
generic image folder + mask folder), every bad input named in one line."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .._base import DataError, DatasetNotFoundError, image_size
from .transforms import IGNORE_INDEX

__all__ = ['SegmentationDataError', 'Record', 'IMG_EXTS', 'voc_palette', 'read_image', 'read_mask', 'colour_ids',
           'read_class_names', 'find_images', 'pair_by_name', 'pair_from_list', 'file_records']

IMG_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')


class SegmentationDataError(DataError):
    """Malformed segmentation data; the message names the file."""


class Record(NamedTuple):
    """One sample: ``load()`` -> (uint8 image (3, H, W) tensor, int64 mask (H, W) of class ids, ignore = 255);
    ``name`` names it in errors; ``image`` / ``mask``: its files (None for generated samples)."""
    load: Callable[[], tuple]
    name: str
    image: Path | None = None
    mask: Path | None = None


def voc_palette(n: int = 256) -> list[tuple[int, int, int]]:
    """Pascal VOC's colour map (the bits of the class id spread over R, G, B from the high bit down): class k's
    colour in VOC's palette PNGs; index 255 is VOC's boundary colour (224, 224, 192)."""
    out = []
    for k in range(n):
        r = g = b = 0
        c = k
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out.append((r, g, b))
    return out


def read_image(path: Path):
    """A uint8 RGB (3, H, W) tensor (torchvision's decoders; PIL for the formats they lack: BMP, TIFF); an
    unreadable file is a one-line error naming it."""
    import torch
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_image
    if not Path(path).is_file():
        raise SegmentationDataError(f'{path}: image not found')
    try:
        return decode_image(str(path), mode=ImageReadMode.RGB)
    except (RuntimeError, OSError):
        pass
    try:
        with Image.open(path) as im:
            return torch.from_numpy(np.asarray(im.convert('RGB')).copy()).permute(2, 0, 1).contiguous()  # HWC -> CHW
    except (OSError, ValueError) as e:
        raise SegmentationDataError(f'{path}: could not read the image ({e})') from None


def colour_ids(rgb: np.ndarray, palette: Sequence[Sequence[int]], ignore_colours: Sequence[Sequence[int]],
               path: Path) -> np.ndarray:
    """(H, W, 3) uint8 colours -> (H, W) int64 class ids: palette[k] -> k, an ignore colour -> 255; a colour in
    neither is an error naming the file, the colour and where it first occurs."""
    code = (rgb[..., 0].astype(np.int64) << 16) | (rgb[..., 1].astype(np.int64) << 8) | rgb[..., 2]  # (H, W) 24-bit
    lut = {(int(r) << 16) | (int(g) << 8) | int(b): k for k, (r, g, b) in enumerate(palette)}
    lut.update({(int(r) << 16) | (int(g) << 8) | int(b): IGNORE_INDEX for r, g, b in ignore_colours})
    keys = np.asarray(sorted(lut), np.int64)
    idx = np.clip(np.searchsorted(keys, code), 0, len(keys) - 1)
    unknown = keys[idx] != code
    if unknown.any():
        y, x = (int(v[0]) for v in np.nonzero(unknown))
        c = tuple(int(v) for v in rgb[y, x])
        raise SegmentationDataError(f'{path}: colour {c} (first at row {y}, column {x}) maps to no class of the '
                                    f'palette ({len(palette)} colours) and is not an ignore colour')
    values = np.asarray([lut[int(k)] for k in keys], np.int64)
    return values[idx]


def read_mask(path: Path, palette: Sequence[Sequence[int]] | None = None,
              ignore_colours: Sequence[Sequence[int]] = ()) -> np.ndarray:
    """A label image -> (H, W) int64 values as stored: a grey or 16-bit PNG gives its values, a palette-indexed PNG
    (VOC's) its indices; a colour (RGB) PNG needs ``palette`` (class k's colour) and maps through
    :func:`colour_ids`."""
    from PIL import Image
    if not Path(path).is_file():
        raise SegmentationDataError(f'{path}: mask not found')
    try:
        with Image.open(path) as im:
            mode = im.mode
            if mode in ('RGB', 'RGBA'):
                arr = np.asarray(im.convert('RGB'))
            elif mode in ('P', 'L', 'I', 'I;16', 'I;16B', 'I;16L', '1'):
                arr = np.asarray(im).astype(np.int64)
            else:
                raise SegmentationDataError(f'{path}: a label image of mode {mode}; expected grey (L, I;16) or '
                                            f'palette (P) class ids, or RGB colours with a palette')
    except (OSError, ValueError) as e:
        if isinstance(e, SegmentationDataError):
            raise
        raise SegmentationDataError(f'{path}: could not read the mask ({e})') from None
    if arr.ndim == 3:
        if palette is None:
            raise SegmentationDataError(f'{path}: an RGB colour mask, but no palette maps its colours to classes '
                                        f'(give a palette, or store class ids as a grey or palette PNG)')
        return colour_ids(arr, palette, ignore_colours, path)
    return arr


def read_class_names(path: Path) -> list[str]:
    """A class-names file: one name per line, line k (from 0) naming class k; blank lines only at the end."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f'class-names file not found: {path} (one class name per line, line k naming '
                                   f'class k)')
    lines = path.read_text().splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            raise SegmentationDataError(f'{path} line {n}: empty class name (line k names class k; blank lines '
                                        f'would shift the ids)')
    if not lines:
        raise SegmentationDataError(f'{path}: no class names')
    return [line.strip() for line in lines]


def find_images(folder: Path, suffix: str | Sequence[str] = IMG_EXTS) -> list[Path]:
    """Image files under ``folder`` (recursively, sorted) whose names end with ``suffix`` (one or several)."""
    suffixes = tuple(s.lower() for s in ((suffix,) if isinstance(suffix, str) else suffix))
    return sorted(p for p in Path(folder).rglob('*') if p.is_file() and p.name.lower().endswith(suffixes))


def _stem(path: Path, folder: Path, suffixes: Sequence[str]) -> str:
    """The path relative to ``folder`` without the matched suffix: what pairs an image with its mask."""
    rel = path.relative_to(folder).as_posix()
    for s in sorted(suffixes, key=len, reverse=True):
        if rel.lower().endswith(s.lower()):
            return rel[:-len(s)]
    return rel


def pair_by_name(image_dir: Path, mask_dir: Path, img_suffix: str | Sequence[str] = IMG_EXTS,
                 mask_suffix: str = '.png') -> list[tuple[Path, Path]]:
    """(image, mask) pairs of two folders by matching names (the relative path without the suffix, mmseg's
    ``img_suffix`` / ``seg_map_suffix``); an image without its mask is an error naming the image and the mask
    looked for. Masks without an image are ignored."""
    image_dir, mask_dir = Path(image_dir), Path(mask_dir)
    if not image_dir.is_dir():
        raise DatasetNotFoundError(f'image folder not found: {image_dir}')
    if not mask_dir.is_dir():
        raise DatasetNotFoundError(f'mask folder not found: {mask_dir}')
    img_suffixes = (img_suffix,) if isinstance(img_suffix, str) else tuple(img_suffix)
    pairs = []
    for img in find_images(image_dir, img_suffixes):
        mask = mask_dir / (_stem(img, image_dir, img_suffixes) + mask_suffix)
        if not mask.is_file():
            raise SegmentationDataError(f'{img}: no mask (looked for {mask})')
        pairs.append((img, mask))
    return pairs


def pair_from_list(list_file: Path, image_dir: Path, mask_dir: Path, img_suffix: str = '.jpg',
                   mask_suffix: str = '.png') -> list[tuple[Path, Path]]:
    """(image, mask) pairs named by a list file (VOC's ``ImageSets/Segmentation/<split>.txt``: one name without
    suffix per line); a missing image or mask is an error naming the list file, the line and the file."""
    list_file = Path(list_file)
    pairs = []
    for n, line in enumerate(list_file.read_text().splitlines(), 1):
        name = line.strip()
        if not name:
            continue
        img, mask = Path(image_dir) / (name + img_suffix), Path(mask_dir) / (name + mask_suffix)
        if not img.is_file():
            raise SegmentationDataError(f'{list_file} line {n}: image {img} not found')
        if not mask.is_file():
            raise SegmentationDataError(f'{img}: no mask (looked for {mask}; listed in {list_file} line {n})')
        pairs.append((img, mask))
    return pairs


def file_records(pairs: Sequence[tuple[Path, Path]], read_labels: Callable[[Path], np.ndarray],
                 check_sizes: bool = True, check_labels: Callable[[Path], None] | None = None) -> list[Record]:
    """Records of (image, mask) file pairs; ``read_labels(mask_path)`` reads a mask as (H, W) int64 class ids
    (:func:`read_mask` and the dataset's mapping: reduce_zero_label, an ignore value, a palette). ``check_sizes``:
    compare the image and mask sizes from the file headers now (cheap); ``check_labels(mask_path)``: called on
    every mask now, raising on a stored value that is no class. So a bad mask is named before a run starts, not
    at the batch that holds it (the dataset checks again when it loads the pixels)."""
    records = []
    for img, mask in pairs:
        if check_sizes:
            hi, hm = image_size(img, SegmentationDataError), image_size(mask, SegmentationDataError)
            if hi != hm:
                raise SegmentationDataError(f'{mask}: mask is {hm[1]}x{hm[0]} but its image {img.name} is '
                                            f'{hi[1]}x{hi[0]} (W x H)')
        records.append(Record(_loader(img, mask, read_labels), str(mask), img, mask))
    if check_labels is not None:
        import os
        from concurrent.futures import ThreadPoolExecutor
        # threads: PNG decoding releases the GIL; map() re-raises the first bad mask in the pairs' order
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            list(pool.map(check_labels, [mask for _, mask in pairs]))
    return records


def _loader(img: Path, mask: Path, read_labels: Callable[[Path], np.ndarray]) -> Callable[[], tuple]:
    def load() -> tuple:
        return read_image(img), read_labels(mask)
    return load
