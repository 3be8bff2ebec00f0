"""The pixels of an ``image_chat`` image as the vision tower's patch rows (imports torch and Pillow).

Read when a batch is loaded: decoded by Pillow under its ``MAX_IMAGE_PIXELS`` bound (a larger image is
refused before its pixels are decoded), converted to RGB (palette, grey, alpha and CMYK images alike),
resized with bicubic filtering to the size ``_image_chat.fitted_size`` chose, scaled to ``[-1, 1]`` (the
Qwen image processors' mean 0.5 and std 0.5) and cut into patches by ``_images.patchify``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hyper_parallel.components.dataloader._image_chat import open_image

__all__ = ["image_pixels"]


def image_pixels(image: Path, size: tuple[int, int]) -> torch.Tensor:
    """``image`` as RGB in ``[-1, 1]``, shape ``(3, height, width)`` for ``size = (width, height)``."""
    from PIL import Image

    with open_image(image) as opened:
        rgb = opened.convert("RGB").resize(size, Image.Resampling.BICUBIC)
    values = torch.from_numpy(np.asarray(rgb, dtype=np.uint8).copy()).permute(2, 0, 1)
    return values.float() / 127.5 - 1.0
