"""``Shape``: a tensor reduced to its shape, so a state-dict adapter can map a weights folder without torch.

The weights check (``_weights_check``) runs each model's ``from_hf`` on what the safetensors headers say,
never on data: renames keep the placeholder, reshapes and splits compute the shapes they would give, and a
shape the operation cannot take raises ``RuntimeError`` as torch's own would. The adapters use only tensor
methods (``view``, ``reshape``, ``transpose``, ``split``, ``chunk``, indexing, ``new_empty``, ``copy_``),
so the same code maps tensors at load time and shapes at ``--dry-run``, which imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

__all__ = ["Shape"]


def _resolved(dims: tuple[int, ...], numel: int) -> tuple[int, ...]:
    """``dims`` with one ``-1`` inferred, refused unless they hold exactly ``numel`` elements."""
    known = math.prod(d for d in dims if d != -1)
    if dims.count(-1) == 1 and known and numel % known == 0:
        dims = tuple(numel // known if d == -1 else d for d in dims)
    if dims.count(-1) or any(d < 0 for d in dims) or math.prod(dims) != numel:
        raise RuntimeError(f"shape '{list(dims)}' is invalid for input of size {numel}")
    return dims


def _dims(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class Shape:
    """The shape of a tensor, with the shape arithmetic of the tensor methods the adapters call."""

    shape: tuple[int, ...] = attrs.field(converter=_dims)

    def numel(self) -> int:
        return math.prod(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def _axis(self, dim: int) -> int:
        if not -len(self.shape) <= dim < len(self.shape):
            raise RuntimeError(f"dimension {dim} out of range for a tensor of shape {list(self.shape)}")
        return dim % len(self.shape)

    def view(self, *dims: int) -> Shape:
        return Shape(_resolved(tuple(dims), self.numel()))

    reshape = view

    def transpose(self, a: int, b: int) -> Shape:
        dims = list(self.shape)
        i, j = self._axis(a), self._axis(b)
        dims[i], dims[j] = dims[j], dims[i]
        return Shape(tuple(dims))

    def unsqueeze(self, dim: int) -> Shape:
        at = dim % (len(self.shape) + 1)
        return Shape((*self.shape[:at], 1, *self.shape[at:]))

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Shape, ...]:
        axis = self._axis(dim)
        total = self.shape[axis]
        parts = [sizes] * math.ceil(total / sizes) if isinstance(sizes, int) else list(sizes)
        if isinstance(sizes, int) and parts:
            parts[-1] = total - sizes * (len(parts) - 1)
        if sum(parts) != total:
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {total} (input tensor's size at "
                f"dimension {axis}), but got split_sizes={parts}"
            )
        return tuple(Shape((*self.shape[:axis], n, *self.shape[axis + 1 :])) for n in parts)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Shape, ...]:
        return self.split(math.ceil(self.shape[self._axis(dim)] / chunks), dim)

    def __getitem__(self, index: int | slice | tuple[int | slice, ...]) -> Shape:
        indices = index if isinstance(index, tuple) else (index,)
        dims: list[int] = []
        for axis, item in enumerate(indices):
            size = self.shape[self._axis(axis)]
            if isinstance(item, slice):
                dims.append(len(range(*item.indices(size))))
            elif not -size <= item < size:
                raise RuntimeError(f"index {item} is out of bounds for dimension {axis} with size {size}")
        return Shape((*dims, *self.shape[len(indices) :]))

    def new_empty(self, shape: Sequence[int]) -> Shape:
        return Shape(tuple(shape))

    def copy_(self, source: Shape) -> Shape:
        if source.shape != self.shape:
            raise RuntimeError(
                f"the size of tensor a ({list(self.shape)}) must match the size of tensor b "
                f"({list(source.shape)})"
            )
        return self
