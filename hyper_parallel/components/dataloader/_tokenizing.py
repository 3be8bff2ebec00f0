"""Encoding documents into token ids, shared over a process group (part of ``DataLoader``).

Shared tokenizing: with a ``process_group`` of ``n`` ranks, every member reads the same documents and
takes them in rounds of ``n * 1024``; in each round, the document at position ``i`` of the whole dataset
is encoded by the member of group rank ``i % n`` only, and the round's token lists are all-gathered, so
every member ends with every document's tokens in document order: exactly what one process would
encode alone. Everything after (packing, sample order, dealing) is computed from that identical stream,
so the samples of a step do not depend on the group or on the data-parallel size. Every member must
build the same dataset with the same tokenizer at the same point; any group whose members need the same
stream works (the whole world, or the data-parallel group). Without a group each process encodes all.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch.distributed as dist

from hyper_parallel.errors import InputFileError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["encode", "tokenize"]

#: Documents each member encodes per round (a round is ``group size`` times as many).
_TOKENIZE_CHUNK = 1024


def encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each of ``texts``, in one ``encode_batch`` call when the tokenizer has it."""
    encode_batch = getattr(tokenizer, "encode_batch", None)
    return list(encode_batch(texts)) if encode_batch else [tokenizer.encode(text) for text in texts]


class _Share(NamedTuple):
    """One member's part of a tokenizing round, as all-gathered: compact bytes, or what went wrong."""

    documents: int  # read in this round by this member (all members must agree)
    ids: bytes  # array("q") of the encoded documents' tokens, concatenated
    lengths: bytes  # array("q") of their lengths
    error: str | InputFileError | None  # a bad file, raised on every member as it is


def _share(tokenizer: Any, documents: Iterator[str], rank: int, size: int) -> _Share:
    """Read the round's documents (every member reads all) and encode this member's every ``size``-th."""
    try:
        chunk = list(itertools.islice(documents, size * _TOKENIZE_CHUNK))
        encoded = encode(tokenizer, chunk[rank::size])
    except InputFileError as exc:  # FILE: problem, the same on every member
        return _Share(0, b"", b"", exc)
    except Exception as exc:  # every member must learn of it, or the others wait forever
        return _Share(0, b"", b"", f"{type(exc).__name__}: {exc}")
    ids = array.array("q", (token for doc in encoded for token in doc))
    return _Share(len(chunk), ids.tobytes(), array.array("q", map(len, encoded)).tobytes(), None)


def _unpack(share: _Share) -> list[list[int]]:
    flat, sizes = array.array("q", share.ids).tolist(), array.array("q", share.lengths).tolist()
    out, start = [], 0
    for size in sizes:
        out.append(flat[start : start + size])
        start += size
    return out


def tokenize(tokenizer: Any, documents: Iterator[str], group: ProcessGroup | None) -> Iterator[list[int]]:
    """Token ids of every document, in order; a group shares the encoding (see the module docstring).

    A member that cannot read or encode its round, or that read a different number of documents than
    the others, makes every member raise at the same round instead of leaving the others waiting.
    """
    size = 1 if group is None else dist.get_world_size(group)
    if size == 1:
        while chunk := list(itertools.islice(documents, _TOKENIZE_CHUNK)):
            yield from encode(tokenizer, chunk)
        return
    rank = dist.get_rank(group)
    while True:
        shares: list[Any] = [None] * size
        dist.all_gather_object(shares, _share(tokenizer, documents, rank, size), group=group)
        for member, share in enumerate(shares):
            if isinstance(share.error, InputFileError):
                raise share.error
            if share.error is not None:
                raise ValueError(f"rank {member} of the data group could not read or tokenize: {share.error}")
        counts = [share.documents for share in shares]
        if len(set(counts)) > 1:
            raise ValueError(
                f"the ranks of the data group read different documents ({counts} in one round): every rank "
                "must see the same dataset"
            )
        encoded = [_unpack(share) for share in shares]
        for i in range(counts[0]):
            yield encoded[i % size][i // size]
        if counts[0] < size * _TOKENIZE_CHUNK:
            return
