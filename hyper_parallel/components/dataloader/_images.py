"""Synthetic captioned images for vision-language training: the ``shapes`` dataset source.

Imported lazily by ``_samples`` (the ``shapes`` source); this module imports torch.

Each image is a plain dark background split into a 3 x 3 grid of cells, with one filled shape (circle,
square, triangle, diamond or cross) in one colour (red, green, blue, yellow, purple or orange) in one
cell, its size and place inside the cell jittered, plus a little pixel noise. Its caption names exactly
what the image shows ("a red circle at the top left", "an orange cross in the middle"), so the colour, shape
and position words can only be predicted by looking at the image: 6 x 5 x 9 = 270 captions. Everything
derives from a seeded generator per sample index, so sample ``i`` is the same on every rank and run.

Images are ``3 * merge * patch`` pixels square (``merge`` = ``spatial_merge_size``, ``patch`` =
``patch_size`` of the model's vision arguments), so each cell is exactly one merged vision token: ``3 x 3``
merged tokens, ``(3 * merge) ** 2`` patches per image. Pixels are in ``[-1, 1]`` (what the Qwen image
processor's 0.5 mean / 0.5 std normalisation gives) and are laid out as that processor lays them out:
one row per patch of ``in_channels * temporal_patch_size * patch ** 2`` values (channel, frame, row,
column; the single frame repeated ``temporal_patch_size`` times), rows in spatial-merge-block order
(each ``merge x merge`` block of patches contiguous, blocks row-major), and ``grid_thw = (1, h, w)`` in
patches.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from hyper_parallel.models.qwen3_5.images import patchify

__all__ = ["CELLS", "COLOURS", "PLACES", "SHAPES", "ShapeImages"]

#: The image is a CELLS x CELLS grid of places; each cell becomes one merged vision token.
CELLS = 3

#: Colour name -> RGB in [0, 1].
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.75, 0.2),
    "blue": (0.15, 0.3, 0.95),
    "yellow": (0.95, 0.9, 0.1),
    "purple": (0.6, 0.15, 0.75),
    "orange": (1.0, 0.55, 0.0),
}

SHAPES = ("circle", "square", "triangle", "diamond", "cross")

#: Words for each cell, row-major from the top left.
PLACES = (
    "at the top left",
    "at the top",
    "at the top right",
    "on the left",
    "in the middle",
    "on the right",
    "at the bottom left",
    "at the bottom",
    "at the bottom right",
)

_BACKGROUND = 0.12
_NOISE = 0.03


def _mask(shape: str, dy: torch.Tensor, dx: torch.Tensor, radius: float) -> torch.Tensor:
    """Pixels inside ``shape`` centred at the origin, ``dy``/``dx`` the offsets from its centre."""
    if shape == "circle":
        return dy**2 + dx**2 <= radius**2
    if shape == "square":
        return torch.maximum(dy.abs(), dx.abs()) <= 0.8 * radius
    if shape == "triangle":  # pointing up: widens from the apex to the base
        return (dy.abs() <= radius) & (dx.abs() <= (dy + radius) / 2)
    if shape == "diamond":
        return dy.abs() + dx.abs() <= radius
    if shape == "cross":
        bar = radius / 3
        return ((dy.abs() <= bar) & (dx.abs() <= radius)) | ((dx.abs() <= bar) & (dy.abs() <= radius))
    raise ValueError(f"unknown shape {shape!r}")


def _caption(colour: str, shape: str, place: str) -> str:
    return f"{'an' if colour[0] in 'aeiou' else 'a'} {colour} {shape} {place}"


class ShapeImages:
    """Sample ``index`` of the shapes source: its caption and patches, drawn from ``(seed, index)``.

    ``vision`` is the model's vision arguments (``Qwen3_5VisionArgs`` or anything with ``patch_size``,
    ``temporal_patch_size``, ``spatial_merge_size`` and ``in_channels``, which must be 3 for RGB).
    """

    def __init__(self, vision: Any, seed: int) -> None:
        if vision.in_channels != 3:
            raise ValueError(
                f"the shapes source draws RGB images: vision.in_channels must be 3, got {vision.in_channels}"
            )
        self.patch_size = int(vision.patch_size)
        self.temporal_patch_size = int(vision.temporal_patch_size)
        self.merge_size = int(vision.spatial_merge_size)
        self.seed = seed
        self.cell = self.merge_size * self.patch_size
        self.side = CELLS * self.cell
        grid = CELLS * self.merge_size
        #: ``(t, h, w)`` of every image, in patches before merging.
        self.grid_thw = (1, grid, grid)
        #: Vision tokens of every image after spatial merging (one per cell).
        self.merged_tokens = CELLS * CELLS
        coords = torch.arange(self.side, dtype=torch.float32) + 0.5
        self._ys, self._xs = torch.meshgrid(coords, coords, indexing="ij")

    @staticmethod
    def captions() -> list[str]:
        """Every caption the source can produce, in a fixed order."""
        return [_caption(*words) for words in itertools.product(COLOURS, SHAPES, PLACES)]

    def draw(self, index: int) -> tuple[str, torch.Tensor]:
        """The caption and the image (3, side, side) in [-1, 1] of sample ``index``."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        colour_i, shape_i, place_i = (
            int(torch.randint(n, (), generator=gen)) for n in (len(COLOURS), len(SHAPES), len(PLACES))
        )
        jitter = torch.rand(3, generator=gen).tolist()  # size, vertical and horizontal offset
        radius = self.cell * (0.28 + 0.14 * jitter[0])
        slack = self.cell / 2 - radius
        row, col = divmod(place_i, CELLS)
        cy = (row + 0.5) * self.cell + (2 * jitter[1] - 1) * slack
        cx = (col + 0.5) * self.cell + (2 * jitter[2] - 1) * slack
        shape, colour = SHAPES[shape_i], list(COLOURS)[colour_i]
        inside = _mask(shape, self._ys - cy, self._xs - cx, radius)
        rgb = torch.tensor(COLOURS[colour]).view(3, 1, 1)
        image = torch.where(inside, rgb, torch.full_like(rgb, _BACKGROUND))
        image = image + _NOISE * torch.randn(3, self.side, self.side, generator=gen)
        image = image.clamp(0.0, 1.0) * 2 - 1
        return _caption(colour, shape, PLACES[place_i]), image

    def patches(self, image: torch.Tensor) -> torch.Tensor:
        """``image`` as the model's patch rows (see ``patchify``)."""
        return patchify(image, self.patch_size, self.temporal_patch_size, self.merge_size)
