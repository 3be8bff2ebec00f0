"""Whole documents into rows of ``seq_len`` tokens: how chat data is packed (a conversation is never split).

Plain-text pretraining cuts its token stream into windows (a document may continue in the next row: it is
one stream). A conversation cut that way trains its answer without its question, so chat rows are filled
with whole conversations instead (Axolotl's multipack, torchtune's ``split_across_pack=False``), padded
to ``seq_len``, with one document id per conversation (and one for the padding).

:func:`pack_rows` is best-fit decreasing: the documents by decreasing length (ties by index), each into
the open row whose free space it fills most tightly (ties to the row that last reached that free space),
else a new row. It depends on the lengths alone, never on the ranks or workers that read the rows. Cost:
one ``O(n log n)`` sort, then per document a binary search over the distinct free spaces of open rows (at
most ``seq_len`` of them): 0.8 s of CPU for a million documents. On log-normal lengths (median 300
tokens, sigma 1, ``seq_len`` 2,048) it fills 99.9% of the row tokens.

A document longer than ``seq_len`` fits no row: :func:`overlong` finds them, and :func:`fitted` applies
the ``overlong`` policy (``hyper_parallel.data.overlong``: refuse, drop or cut), in one place for
``prepare`` and the loader.
"""

from __future__ import annotations

import bisect
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from hyper_parallel.data.overlong import Overlong

__all__ = ["Rows", "fitted", "overlong", "pack_rows"]


@attrs.frozen
class Rows:
    """Row ``r`` holds documents ``documents[starts[r]:starts[r + 1]]`` (in index order)."""

    starts: npt.NDArray[np.int64]
    documents: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.starts.shape[0]) - 1

    def row(self, index: int) -> npt.NDArray[np.int64]:
        """The documents of row ``index``."""
        return self.documents[int(self.starts[index]) : int(self.starts[index + 1])]

    def efficiency(self, lengths: npt.NDArray[Any], seq_len: int) -> float:
        """Real tokens over row tokens (``lengths``: every document's, as packed)."""
        total = len(self) * seq_len
        return float(np.asarray(lengths, dtype=np.int64)[self.documents].sum()) / total if total else 1.0


def pack_rows(lengths: npt.NDArray[Any], seq_len: int, documents: npt.NDArray[Any] | None = None) -> Rows:
    """Best-fit decreasing of ``documents`` (default: all) of ``lengths`` into rows of ``seq_len`` tokens.

    Every length must be at most ``seq_len`` (:func:`fitted` applies the overlong policy first).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    chosen = np.arange(lengths.shape[0], dtype=np.int64) if documents is None else np.asarray(documents)
    sizes = lengths[chosen]
    if sizes.size and int(sizes.max()) > seq_len:
        raise ValueError(f"a document of {int(sizes.max())} tokens does not fit a row of {seq_len}")
    order = np.argsort(-sizes, kind="stable")
    free: list[int] = []  # the distinct free spaces of open rows, ascending
    rows_at: dict[int, list[int]] = {}  # free space -> the open rows that have it
    row_of = [0] * int(sizes.shape[0])
    count = 0
    for position, size in zip(order.tolist(), sizes[order].tolist(), strict=True):
        at = bisect.bisect_left(free, size)
        if at == len(free):
            row, left = count, seq_len - size
            count += 1
        else:
            space = free[at]
            waiting = rows_at[space]
            row, left = waiting.pop(), space - size
            if not waiting:
                del free[at], rows_at[space]
        row_of[position] = row
        if left > 0:
            if left in rows_at:
                rows_at[left].append(row)
            else:
                rows_at[left] = [row]
                bisect.insort(free, left)
    assigned = np.asarray(row_of, dtype=np.int64)
    by_row = np.argsort(assigned, kind="stable")  # documents of a row stay in index order
    starts = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(assigned, minlength=count), out=starts[1:])
    return Rows(starts, chosen[by_row].astype(np.int64))


def overlong(lengths: npt.NDArray[Any], seq_len: int) -> npt.NDArray[np.int64]:
    """Indices of the documents longer than ``seq_len``."""
    return np.flatnonzero(np.asarray(lengths) > seq_len).astype(np.int64)


def fitted(
    lengths: npt.NDArray[Any], seq_len: int, policy: Overlong
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(lengths as packed, documents kept)`` under ``policy`` (``error`` keeps every document: the
    caller refused overlong ones before): ``drop`` leaves them out, ``truncate`` cuts them to ``seq_len``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if policy == "drop":
        return lengths, np.flatnonzero(lengths <= seq_len).astype(np.int64)
    kept = np.arange(lengths.shape[0], dtype=np.int64)
    return (np.minimum(lengths, seq_len) if policy == "truncate" else lengths), kept
