"""The pixels of an ``image_chat`` image as the vision tower's patch rows (imports torch and Pillow).

Read when a batch is loaded: decoded by Pillow under its ``MAX_IMAGE_PIXELS`` bound (a larger image is
refused before its pixels are decoded), converted to RGB (palette, grey, alpha and CMYK images alike),
resized with bicubic filtering to the size ``_image_chat.fitted_size`` chose, scaled to ``[-1, 1]`` (the
Qwen image processors' mean 0.5 and std 0.5) and cut into patches by ``_images.patchify``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from hyper_parallel.config.errors import InputFileError

__all__ = ["image_pixels"]


def image_pixels(image: Path, size: tuple[int, int]) -> torch.Tensor:
    """``image`` as RGB in ``[-1, 1]``, shape ``(3, height, width)`` for ``size = (width, height)``."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(image) as opened:
                rgb = opened.convert("RGB").resize(size, Image.Resampling.BICUBIC)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):
        raise InputFileError.at(
            image,
            f"holds more than Pillow's limit of {Image.MAX_IMAGE_PIXELS} pixels (PIL.Image."
            "MAX_IMAGE_PIXELS): a decompression bomb, or an image to shrink before training",
        ) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputFileError.at(image, f"not an image Pillow can read: {exc}") from None
    values = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1)
    return values.float() / 127.5 - 1.0
