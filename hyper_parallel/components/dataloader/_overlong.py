"""Conversations longer than ``seq_len``: found, named and refused, dropped or cut (``DataLoader``).

A conversation is packed whole, so one longer than a row fits nowhere; the dataset's ``overlong`` policy
says what happens (``hyper_parallel.data.packing``). The lengths come from the shards' offsets and the
names from their ``records`` (the input and line of each conversation), so nothing of the tokens is read.
Torch-free: ``--dry-run`` checks prepared folders with it before anything is built, and the loader
(``_samples``) refuses with the same message at launch.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hyper_parallel.data.overlong import Overlong
from hyper_parallel.data.packing import overlong
from hyper_parallel.data.shards import ShardArrays, record_where
from hyper_parallel.errors import InputFileError

__all__ = ["document_lengths", "document_location", "overlong_issue", "refuse_or_say", "refuse_overlong"]

_log = logging.getLogger(__name__)


def _starts(shards: Sequence[ShardArrays]) -> list[int]:
    starts = [0]
    for shard in shards:
        starts.append(starts[-1] + shard.documents)
    return starts


def document_lengths(shards: Sequence[ShardArrays], first: int, count: int) -> npt.NDArray[np.int64]:
    """Lengths of documents ``[first, first + count)`` as encoded (no appended EOS), from the offsets."""
    parts = [np.zeros(0, dtype=np.int64)]
    starts = _starts(shards)
    for index, shard in enumerate(shards):
        low, high = max(first, starts[index]), min(first + count, starts[index + 1])
        if low < high:
            low, high = low - starts[index], high - starts[index]
            offsets = np.asarray(shard.offsets[low : high + 1], dtype=np.int64)
            parts.append(np.diff(offsets) - np.asarray(shard.appended[low:high], dtype=np.int64))
    return np.concatenate(parts)


def document_location(shards: Sequence[ShardArrays], names: Sequence[str], label: str, doc: int) -> str:
    """Where document ``doc`` (counted over all shards) comes from: its record's ``FILE:LINE`` when the
    shards name records (chat data prepared since they do), else ``label`` and the document's number."""
    starts = _starts(shards)
    index = bisect.bisect_right(starts, doc) - 1
    records, local = shards[index].records, doc - starts[index]
    if records is not None and names:
        source, line = (int(x) for x in records[2 * local : 2 * local + 2])
        if 0 <= source < len(names):
            return record_where(names[source], line)
    return f"{label}: document {doc}"


def overlong_issue(lengths: npt.NDArray[Any], seq_len: int, locate: Any) -> tuple[str, str] | None:
    """``(where, problem)`` naming the first document longer than ``seq_len`` (``locate(i)``: where
    document ``i`` is) and how many are, or None when every one fits."""
    over = overlong(lengths, seq_len)
    if not over.size:
        return None
    first = int(over[0])
    return str(locate(first)), (
        f"a conversation of {int(lengths[first])} tokens, longer than training.seq_len {seq_len} "
        f"({over.size} of {len(lengths)} conversations are): set dataloader.dataset.overlong to 'drop' or "
        "'truncate', or raise training.seq_len"
    )


def refuse_or_say(lengths: npt.NDArray[Any], seq_len: int, policy: Overlong, locate: Any, label: str) -> None:
    """Refuse the documents longer than ``seq_len`` (policy ``error``: an ``InputFileError`` at the first
    one's place, exit 2), or log how many of ``label``'s are dropped or cut."""
    if policy == "error":
        issue = overlong_issue(lengths, seq_len, locate)
        if issue is not None:
            raise InputFileError.at(*issue)
        return
    over = overlong(lengths, seq_len)
    if not over.size:
        return
    done = "dropped" if policy == "drop" else f"cut to their first {seq_len} tokens"
    _log.warning(
        "%s: %d of %d conversations are longer than training.seq_len %d: %s (overlong: %s)",
        label,
        over.size,
        len(lengths),
        seq_len,
        done,
        policy,
    )


def refuse_overlong(
    shards: Sequence[ShardArrays],
    seq_len: int,
    *,
    names: Sequence[str],
    label: str,
    first: int = 0,
    count: int | None = None,
) -> None:
    """``overlong: error`` checked before a launch: refuse the first of documents ``[first, first +
    count)`` (all from ``first`` by default) of ``shards`` longer than ``seq_len``, at its record."""
    if count is None:
        count = sum(shard.documents for shard in shards) - first
    refuse_or_say(
        document_lengths(shards, first, count),
        seq_len,
        "error",
        lambda doc: document_location(shards, names, label, doc + first),
        label,
    )
