"""Sizes a checkpoint declares, checked against what it stores before anything is allocated.

DCP's ``.metadata`` declares each tensor's global size, dtype and chunks, and readers allocate tensors of
the declared sizes before reading a byte (``torch.empty(size)``): a few changed bytes in a 46 KB
``.metadata`` declared 64 GiB, and where the chunks did not cover the declared size the rest of the tensor
kept whatever the allocator left there, which an export then published. ``check_declared`` (called by
``_safe_read.inspect``, so by every reader: resume, ``initial_load_path``, export, generate, evaluate)
refuses such a ``.metadata`` before any allocation, so memory follows the bytes the folder holds:

- every item is DCP's own kind with values of the right types (a ``torch.Size`` of non-negative ints, a
  ``torch.dtype``, chunks of ``ChunkStorageMetadata``), at most ``MAX_DIMS`` dimensions;
- the chunks of each tensor tile its declared size exactly: each lies inside the tensor, their elements add
  up to the tensor's and their signed corners to the tensor's (``tiles``: linear in the chunks, so no two
  overlap);
- each chunk has its storage entry, untransformed (a compressed chunk could expand past its bytes), of at
  least the chunk's bytes: DCP's writer stores a chunk's raw data uncompressed, so a declared tensor is
  never larger than the bytes stored for it (``inspect`` already checks every range lies inside a file);
  and of at most the chunk's bytes and ``MAX_ITEM_OVERHEAD`` (the records ``torch.save`` adds), so what a
  reader parses of it is bounded by the chunk (``_safe_read`` then checks its zip records are stored, not
  compressed, and hold no more than the chunk);
- each non-tensor item (the optimizer's hyperparameters, pickled) stores at most ``MAX_BYTES_ITEM``: DCP
  reads such an item whole, so a range spanning a hole of a sparse file would be read (and held) whole;
- no two tensors share one list of chunks (each would be walked again for every tensor referring to it);
- the trainer's JSON parts (``step``, ``lr_scheduler``, ``dataloader.rank<r>``, ``rng.rank<r>``,
  ``train_state.rank<r>``) are 1-D ``uint8`` of at most ``MAX_JSON_BYTES``.

A problem is an ``UnreadableCheckpointError`` reading ``FILE: tensor NAME: problem`` (``FILE`` the
``.metadata``): resume skips that step for the newest intact one, export and generate exit 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from hyper_parallel.components.checkpoint._manifest import UnreadableCheckpointError

__all__ = [
    "MAX_BYTES_ITEM",
    "MAX_DIMS",
    "MAX_ITEM_OVERHEAD",
    "MAX_JSON_BYTES",
    "check_declared",
    "chunk_bytes",
    "is_json_part",
]

#: Most dimensions a saved tensor may declare (torch itself allows 64).
MAX_DIMS = 64
#: Largest JSON part (data position, RNG, scheduler, step) a checkpoint may declare, in bytes.
MAX_JSON_BYTES = 64 << 20
#: Most bytes a tensor item may store beyond its chunk's data: the zip records ``torch.save`` wraps the
#: data in (about 1.6 KB in torch 2.13, whatever the tensor's size).
MAX_ITEM_OVERHEAD = 64 << 10
#: Most bytes a non-tensor item may store (DCP reads it whole): a pickled hyperparameter, or in an earlier
#: version's checkpoint a JSON part as a pickled string (at most ``MAX_JSON_BYTES`` of text).
MAX_BYTES_ITEM = MAX_JSON_BYTES + (1 << 20)
_JSON_PARTS = ("step", "lr_scheduler")
_PER_RANK_JSON = ("dataloader.rank", "rng.rank", "train_state.rank")


def is_json_part(key: str) -> bool:
    """Whether ``key`` names one of the trainer's JSON parts (saved as 1-D ``uint8`` tensors)."""
    if key in _JSON_PARTS:
        return True
    return any(key.startswith(p) and key[len(p) :].isdigit() for p in _PER_RANK_JSON)


class _Refused(Exception):
    """One problem of one item; ``check_declared`` adds the file and the item's name."""


def _size(value: Any, what: str, ndim: int | None = None) -> tuple[int, ...]:
    """``value`` as a tuple of non-negative ints (a ``torch.Size`` or a sequence of ints)."""
    if not isinstance(value, (torch.Size, tuple, list)):
        raise _Refused(f"{what} is a {type(value).__name__}, not a size")
    if len(value) > MAX_DIMS:
        raise _Refused(f"{what} has {len(value)} dimensions (at most {MAX_DIMS})")
    if ndim is not None and len(value) != ndim:
        raise _Refused(f"{what} has {len(value)} dimensions, the tensor {ndim}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value):
        raise _Refused(f"{what} {list(value)!r} is not a list of non-negative integers")
    return tuple(value)


def tiles(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], size: tuple[int, ...]) -> bool:
    """Whether ``boxes`` (offsets, sizes) cover the box ``0 .. size`` exactly once, in ``n * 2^split``
    steps, ``split`` the dimensions some box does not span whole (at most ``MAX_SPLIT_DIMS``).

    Each box adds its corners with the sign ``(-1)^(upper corners)``; the count of boxes covering a point
    is the prefix sum of those signed corners (inclusion-exclusion per dimension), so it is 1 on the whole
    tensor and 0 outside exactly when the signed corners that do not cancel are the tensor's own. A
    dimension every box spans whole factors out of both sides and is left out.
    """
    boxes = [box for box in boxes if 0 not in box[1]]
    split = [
        d for d in range(len(size)) if any(offsets[d] or sizes[d] != size[d] for offsets, sizes in boxes)
    ]
    if len(split) > MAX_SPLIT_DIMS:
        raise _Refused(f"its chunks are split along {len(split)} dimensions (at most {MAX_SPLIT_DIMS})")
    signed: dict[tuple[int, ...], int] = {}
    for corner in range(1 << len(split)):
        upper = [(corner >> i) & 1 for i in range(len(split))]
        sign = -1 if sum(upper) % 2 else 1
        for offsets, sizes in boxes:
            point = tuple(
                offsets[d] + sizes[d] if u else offsets[d] for d, u in zip(split, upper, strict=True)
            )
            signed[point] = signed.get(point, 0) + sign
        whole = tuple(size[d] if u else 0 for d, u in zip(split, upper, strict=True))
        signed[whole] = signed.get(whole, 0) - sign
    return not any(signed.values())


#: Dimensions a tensor's chunks may be split along (FSDP splits one, tensor parallelism another; a grid of
#: both is 2): the tiling check costs ``2^split`` per chunk.
MAX_SPLIT_DIMS = 8


def _overlap(
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]], budget: int | None = None
) -> tuple[int, int] | None:
    """Indices of two boxes (offsets, sizes) that overlap, or None (also when ``budget`` box comparisons
    were made without finding a pair).

    A sweep along the dimension with the most distinct offsets: sorted by their start there, a box is
    compared only with the boxes still open at its start, so chunks split along any one dimension (FSDP,
    tensor parallelism) or on a grid cost about n log n; staggered layouts cost more, which is why it runs
    only to name the pair of chunks that :func:`tiles` has already found do not tile, within a budget.
    """
    if len(boxes) < 2 or not boxes[0][0]:  # a scalar's one chunk (two would not add up)
        return None
    ndim = len(boxes[0][0])
    dim = max(range(ndim), key=lambda d: len({b[0][d] for b in boxes}))
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0][dim])
    open_boxes: list[int] = []
    left = budget
    for i in order:
        offsets, sizes = boxes[i]
        if 0 in sizes:
            continue
        open_boxes = [j for j in open_boxes if boxes[j][0][dim] + boxes[j][1][dim] > offsets[dim]]
        for j in open_boxes:
            if left is not None:
                if left <= 0:
                    return None
                left -= 1
            other, other_sizes = boxes[j]
            if all(
                offsets[d] < other[d] + other_sizes[d] and other[d] < offsets[d] + sizes[d]
                for d in range(ndim)
            ):
                return (j, i)
        open_boxes.append(i)
    return None


def _check_tensor(fqn: str, item: TensorStorageMetadata, storage: Mapping[Any, Any]) -> None:
    size = _size(item.size, "its size")
    dtype = getattr(item.properties, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise _Refused(f"its dtype is a {type(dtype).__name__}, not a torch.dtype")
    element = torch.empty((), dtype=dtype).element_size()
    chunks = item.chunks
    if not isinstance(chunks, Sequence) or not all(isinstance(c, ChunkStorageMetadata) for c in chunks):
        raise _Refused("its chunks are not a list of DCP chunk metadata")
    if is_json_part(fqn) and (len(size) != 1 or dtype != torch.uint8 or size[0] > MAX_JSON_BYTES):
        raise _Refused(
            f"declared {dtype} of size {list(size)}, where the trainer saves 1-D torch.uint8 JSON of at "
            f"most {MAX_JSON_BYTES} bytes"
        )
    boxes = []
    covered = 0
    for chunk in chunks:
        offsets = _size(chunk.offsets, "a chunk's offsets", len(size))
        sizes = _size(chunk.sizes, "a chunk's sizes", len(size))
        if any(o + s > n for o, s, n in zip(offsets, sizes, size, strict=True)):
            raise _Refused(
                f"chunk at {list(offsets)} of size {list(sizes)} lies outside its declared size {list(size)}"
            )
        numel = math.prod(sizes)
        info = storage.get(MetadataIndex(fqn, offsets))
        if info is None:
            raise _Refused(f"chunk at {list(offsets)} has no stored data")
        transforms = getattr(info, "transform_descriptors", None)
        if transforms:  # any value: a hostile one need not be a list
            raise _Refused(f"chunk at {list(offsets)} is stored transformed ({str(transforms)[:100]})")
        length = info.length
        if length < numel * element:
            raise _Refused(
                f"chunk at {list(offsets)} declares {numel * element} bytes of {dtype} and stores {length}"
            )
        if length > numel * element + MAX_ITEM_OVERHEAD:
            raise _Refused(
                f"chunk at {list(offsets)} declares {numel * element} bytes of {dtype} and stores {length} "
                f"(a saved tensor adds at most {MAX_ITEM_OVERHEAD} bytes: MAX_ITEM_OVERHEAD)"
            )
        covered += numel
        boxes.append((offsets, sizes))
    total = math.prod(size)
    if covered != total:
        raise _Refused(
            f"its chunks hold {covered} of the {total} elements its declared size {list(size)} has"
            + ("" if covered < total else " (they overlap)")
        )
    if tiles(boxes, size):
        return
    # As many elements as the tensor, each inside it, and not tiling it: two chunks overlap; name them.
    pair = _overlap(boxes, budget=_NAMING_BUDGET + 8 * len(boxes))
    if pair is None:
        raise _Refused(f"its {len(boxes)} chunks overlap (they do not tile its declared size {list(size)})")
    a, b = (boxes[i] for i in pair)
    raise _Refused(f"chunks at {list(a[0])} and {list(b[0])} overlap")


def chunk_bytes(metadata: Metadata) -> dict[MetadataIndex, int]:
    """The bytes of data each stored item of a checked ``metadata`` holds at most: a tensor chunk's
    elements times their size, a non-tensor item its stored length (``check_declared`` bounds both)."""
    limits: dict[MetadataIndex, int] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            element = torch.empty((), dtype=item.properties.dtype).element_size()
            for chunk in item.chunks:
                limits[MetadataIndex(fqn, chunk.offsets)] = math.prod(chunk.sizes) * element
        else:
            limits[MetadataIndex(fqn)] = metadata.storage_data[MetadataIndex(fqn)].length
    return limits


#: Box comparisons spent naming two overlapping chunks of a file already refused (plus 8 per chunk).
_NAMING_BUDGET = 1_000_000


def check_declared(meta_path: Path, metadata: Metadata) -> None:
    """Refuse a ``.metadata`` whose declared sizes are not what its folder stores (see the module doc).

    Raises ``UnreadableCheckpointError`` reading ``META_PATH: tensor NAME: problem`` for the first item
    found wrong (``META_PATH: problem`` when the whole metadata is of the wrong shape).
    """
    items = metadata.state_dict_metadata
    storage = metadata.storage_data
    if not isinstance(items, Mapping) or not all(isinstance(k, str) for k in items):
        raise UnreadableCheckpointError(f"{meta_path}: its state_dict_metadata is not a mapping of names")
    if not isinstance(storage, Mapping) or not all(isinstance(k, MetadataIndex) for k in storage):
        raise UnreadableCheckpointError(f"{meta_path}: its storage_data is not a mapping of DCP indices")
    for index, info in storage.items():
        if not (
            isinstance(info, _StorageInfo)
            and isinstance(info.relative_path, str)
            and all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (info.offset, info.length)
            )
        ):
            raise UnreadableCheckpointError(
                f"{meta_path}: tensor {index.fqn}: its storage entry is not a file, offset and length"
            )
    chunk_lists: set[int] = set()  # ids: the metadata holds them all alive while this runs
    for fqn, item in items.items():
        try:
            if isinstance(item, TensorStorageMetadata):
                # A list of chunks referred to by many tensors costs a few bytes of pickle each time and
                # would be walked each time (a 4 MB .metadata: 10^11 steps); DCP writes one per tensor.
                if id(item.chunks) in chunk_lists:
                    raise _Refused(
                        "shares its list of chunks with another tensor (DCP writes one per tensor)"
                    )
                chunk_lists.add(id(item.chunks))
                _check_tensor(fqn, item, storage)
            elif isinstance(item, BytesStorageMetadata):
                stored = storage.get(MetadataIndex(fqn))
                if stored is None:
                    raise _Refused("has no stored data")
                if stored.length > MAX_BYTES_ITEM:
                    raise _Refused(
                        f"a pickled item of {stored.length} bytes (at most {MAX_BYTES_ITEM}: MAX_BYTES_ITEM)"
                    )
            else:
                raise _Refused(f"is a {type(item).__name__}, not DCP storage metadata")
        except _Refused as exc:
            raise UnreadableCheckpointError(f"{meta_path}: tensor {fqn}: {exc}") from None
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # a value of another type
            detail = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise UnreadableCheckpointError(
                f"{meta_path}: tensor {fqn}: holds a value of the wrong type ({type(exc).__name__}: {detail})"
            ) from None
