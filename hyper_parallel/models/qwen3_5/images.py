"""The Qwen-VL image processor: how an image becomes input of the vision tower, in one place.

What the model decides about its images, read by the training data (``image_chat``, ``shapes``), by
``generate --image`` and by the export's ``preprocessor_config.json``: the default pixel bounds
(:data:`MIN_PIXELS`, :data:`MAX_PIXELS`), the size an image is resized to (:func:`fitted_size`: its aspect
ratio kept, each side a multiple of the patch size times the merge size, the area within the bounds),
how many language-model tokens it takes (:class:`Geometry`), its pixels (:func:`image_pixels`: RGB,
bicubic, scaled to ``[-1, 1]``, the processors' mean 0.5 and std 0.5) and their layout as patch rows
(:func:`patchify`: one row per patch of ``channels * temporal_patch_size * patch ** 2`` values, rows in
spatial-merge-block order, as the Hugging Face processors lay them out).

Images are read with Pillow (:func:`open_image`), and only in the formats of :data:`IMAGE_FORMATS`: Pillow
otherwise picks a decoder by the file's content, and some of its decoders hand the file to another program
(a PostScript file named ``.png`` runs Ghostscript when ``gs`` is on the PATH). An image larger than
Pillow's ``MAX_IMAGE_PIXELS`` is refused as a decompression bomb before any pixel is decoded; that, another
format, and every failure of a decoder is ``IMAGE: problem`` (an ``InputFileError``).
Importing this module imports neither torch nor Pillow (``--dry-run`` sizes images from their headers).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from hyper_parallel._paths import kind_problem
from hyper_parallel.errors import InputFileError

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_FORMATS",
    "MAX_ASPECT_RATIO",
    "MAX_PIXELS",
    "MIN_PIXELS",
    "Geometry",
    "fitted_size",
    "image_pixels",
    "image_size",
    "open_image",
    "patchify",
]

#: The pixel bounds an image is resized within unless the training data sets others (the Qwen-VL
#: image processors' ``min_pixels`` and ``max_pixels``).
MIN_PIXELS = 65_536
MAX_PIXELS = 16_777_216
#: The formats images are read in (Pillow's names, its ``formats=``): decoded by Pillow itself, in process.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
#: Longest side over shortest side an image may have (the Qwen-VL image processors refuse more).
MAX_ASPECT_RATIO = 200


def image_size(image: Path, where: str) -> tuple[int, int]:
    """``(width, height)`` of ``image`` from its header, refusing what cannot be read or is too large.

    A missing file is refused at ``where`` (the record naming it); an unreadable image or one above
    Pillow's ``MAX_IMAGE_PIXELS`` (a decompression bomb) at the image file itself.
    """
    problem = kind_problem(image)  # a FIFO would be waited on, a device read forever
    if problem is not None:
        raise InputFileError.at(where, f"image {str(image)!r} {problem}")
    if not image.is_file():
        raise InputFileError.at(where, f"image {str(image)!r} does not exist")
    with open_image(image) as opened:
        width, height = opened.size
    return int(width), int(height)


@contextlib.contextmanager
def open_image(image: Path) -> Iterator[Any]:
    """``image`` opened with Pillow in one of :data:`IMAGE_FORMATS` (its header read, no pixels yet), with
    Pillow's decompression-bomb warning turned into a refusal: every reader of an image goes through here.
    An image in another format, one above ``PIL.Image.MAX_IMAGE_PIXELS``, and any failure of the decoder
    while the block reads it (the block holds Pillow calls only) are ``IMAGE: problem`` (``InputFileError``).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(image, formats=IMAGE_FORMATS) as opened:
                yield opened
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise InputFileError.at(
            image,
            f"holds more than Pillow's limit of {Image.MAX_IMAGE_PIXELS} pixels (PIL.Image."
            "MAX_IMAGE_PIXELS): a decompression bomb, or an image to shrink before training",
        ) from None
    except UnidentifiedImageError:
        raise InputFileError.at(
            image, f"not an image in a format read here ({', '.join(IMAGE_FORMATS)})"
        ) from None
    except Exception as exc:  # a decoder's failure on hostile bytes, whatever its type
        raise InputFileError.at(image, f"not an image Pillow can read: {exc or type(exc).__name__}") from None


def fitted_size(width: int, height: int, *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """``(width, height)`` an image is resized to (module docs); ``ValueError`` past the aspect ratio."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ValueError(
            f"{width} x {height} pixels: the aspect ratio exceeds {MAX_ASPECT_RATIO}, which the vision "
            "tower does not take"
        )
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return w, h


@attrs.frozen
class Geometry:
    """How images become vision tokens: the vision tower's patch and merge sizes, the pixel bounds."""

    patch: int
    merge: int
    min_pixels: int
    max_pixels: int

    @classmethod
    def of(cls, vision: Any, bounds: tuple[int, int]) -> Geometry:
        """The geometry of a vision tower (``vision``: its arguments) and ``(min_pixels, max_pixels)``."""
        return cls(int(vision.patch_size), int(vision.spatial_merge_size), *bounds)

    def fitted(self, image: Path, where: str) -> tuple[int, int]:
        """The size ``image`` is resized to (:func:`fitted_size`), refused at the image when it cannot be."""
        width, height = image_size(image, where)
        try:
            return fitted_size(
                width,
                height,
                factor=self.patch * self.merge,
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        except ValueError as exc:
            raise InputFileError.at(image, str(exc)) from None

    def tokens(self, size: tuple[int, int]) -> int:
        """Language-model tokens of an image resized to ``size`` (one per merged block of patches)."""
        width, height = size
        return (width // self.patch) * (height // self.patch) // self.merge**2


def patchify(image: torch.Tensor, patch_size: int, temporal_patch_size: int, merge_size: int) -> torch.Tensor:
    """``image`` (C, H, W) as Qwen vision patches (H * W / patch ** 2, C * T * patch ** 2); module docs."""
    channels, height, width = image.shape
    h, w, m, p = height // patch_size, width // patch_size, merge_size, patch_size
    if h * p != height or w * p != width or h % m or w % m:
        raise ValueError(
            f"image {height}x{width} is not a whole number of {m}x{m} blocks of {p}-pixel patches"
        )
    blocks = image.reshape(channels, h // m, m, p, w // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
    frames = blocks.unsqueeze(5).expand(*blocks.shape[:5], temporal_patch_size, p, p)
    return frames.reshape(h * w, channels * temporal_patch_size * p * p)


def image_pixels(image: Path, size: tuple[int, int]) -> torch.Tensor:
    """``image`` as RGB in ``[-1, 1]``, shape ``(3, height, width)`` for ``size = (width, height)``."""
    import numpy as np
    import torch
    from PIL import Image

    with open_image(image) as opened:
        rgb = opened.convert("RGB").resize(size, Image.Resampling.BICUBIC)
    values = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1)
    return values.float() / 127.5 - 1.0
