"""Token corpora and the samples cut from them: one path for in-memory and prepared data (``DataLoader``).

A corpus is the shard arrays of ``hyper_parallel.data.shards`` (tokens with each document's EOS, offsets,
appended flags, an optional assistant mask): memory-mapped from a prepared folder (``tokenized`` source), or
built in memory from the documents a ``jsonl``/``text``/``python_docs`` source reads. The samples are cut
from it the same way either way, so the same files give the same batches prepared or not.

- Packed text: the corpus's tokens end to end, cut into windows of ``seq_len`` (the incomplete tail
  dropped); ``document_ids`` count the documents started before each position, from the offsets (a
  token equal to EOS inside a document starts nothing).
- Packed chat (a corpus with an assistant mask): rows of whole conversations (``ChatRows``: the bin
  packing of ``hyper_parallel.data.packing``), each as encoded (no EOS prepare appended), padded to
  ``seq_len``; ``document_ids`` number the conversations of the row and give the padding an id of its own.
- Padded: document ``d`` (without an EOS prepare appended) cut or padded to ``seq_len``.

Labels are the ids, or ``ignore_index`` where the assistant mask is 0 (chat data) or on padding. Reading a
sample touches only its own window: memory stays flat in the corpus size (chat rows hold two integers per
conversation: which row holds it).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import torch
import torch.utils.data

from hyper_parallel.components.dataloader._overlong import document_lengths, document_location
from hyper_parallel.data.packing import Rows
from hyper_parallel.data.shards import ShardArrays

__all__ = [
    "ChatRows",
    "ConcatSamples",
    "Corpus",
    "PackedSamples",
    "PaddedSamples",
    "Samples",
    "TokenIdError",
    "corpus_in_memory",
]


class TokenIdError(ValueError):
    """A prepared file holds a token id outside the vocabulary: ``FILE: offset N: token id ...``.

    One string argument, so that torch's data loader can raise it again in the main process when a worker
    found it (the loader then reads the message back: :meth:`problem`).
    """

    def problem(self) -> str:
        """The ``FILE: offset N: ...`` line, also out of the text a data-loader worker wraps it in."""
        text = str(self)
        marker = f"{type(self).__name__}: "
        return text.rpartition(marker)[2].strip() if marker in text else text.strip()


class Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Map-style samples ``{input_ids, labels}`` of ``seq_len`` tokens."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class Corpus:
    """Shards read as one sequence of tokens and one sequence of documents; ``documents`` may cut it short.

    ``first`` and ``documents`` select documents ``[first, first + documents)`` (a held-out split); by
    default all of them. With ``vocab_size`` (a prepared corpus: files from disk), every token read is
    checked to lie below it, where it is read (in the data-loader worker, on the host): a corrupted id
    would otherwise end the first batch in an ``IndexError`` (on CUDA, a device-side assert on every rank,
    hours in), and the launch's integrity check hashes only each file's first and last MiB.
    """

    def __init__(
        self,
        shards: Sequence[ShardArrays],
        *,
        first: int = 0,
        documents: int | None = None,
        vocab_size: int | None = None,
        names: Sequence[str] = (),
        label: str = "the data",
    ) -> None:
        self.shards = list(shards)
        self.names, self.label = tuple(names), label
        self.vocab_size = vocab_size
        self.doc_starts = [0]
        self.token_starts = [0]
        for shard in self.shards:
            self.doc_starts.append(self.doc_starts[-1] + shard.documents)
            self.token_starts.append(self.token_starts[-1] + int(shard.tokens.shape[0]))
        total = self.doc_starts[-1]
        self.first = first
        self.documents = total - first if documents is None else documents
        self.chat = any(shard.mask is not None for shard in self.shards)
        # Token range of the selected documents in the stream of all of them.
        self.begin = self._document_start(first)
        self.end = self._document_start(first + self.documents)

    def __getstate__(self) -> dict[str, Any]:
        """Memory-mapped arrays travel as their file and layout (a spawned worker maps them again), so
        pickling a corpus for a data-loader worker never copies it."""
        state = dict(vars(self))
        state["shards"] = [
            {key: _portable(array) for key, array in attrs.asdict(shard, recurse=False).items()}
            for shard in self.shards
        ]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["shards"] = [ShardArrays(**{k: _restored(v) for k, v in s.items()}) for s in state["shards"]]
        vars(self).update(state)

    def _document_start(self, doc: int) -> int:
        if doc >= self.doc_starts[-1]:
            return self.token_starts[-1]
        shard = bisect.bisect_right(self.doc_starts, doc) - 1
        return self.token_starts[shard] + int(self.shards[shard].offsets[doc - self.doc_starts[shard]])

    @property
    def tokens(self) -> int:
        """Tokens of the selected documents."""
        return self.end - self.begin

    def lengths(self) -> npt.NDArray[np.int64]:
        """Each selected document's length as the tokenizer encoded it (no appended EOS), from the offsets
        (no token read)."""
        return document_lengths(self.shards, self.first, self.documents)

    def location(self, doc: int) -> str:
        """Where selected document ``doc`` comes from: its record's ``FILE:LINE`` when the corpus knows
        it (chat shards name their records), else the corpus's label and the document's number."""
        return document_location(self.shards, self.names, self.label, doc + self.first)

    def document_starts(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Positions in ``(start, stop)`` of the selected stream where a document begins, relative to
        ``start``: read from the offsets (a binary search per shard), never from the tokens."""
        lo, hi = start + self.begin, stop + self.begin
        found = []
        shard = bisect.bisect_right(self.token_starts, lo) - 1
        while shard < len(self.shards) and self.token_starts[shard] < hi:
            base, offsets = self.token_starts[shard], self.shards[shard].offsets
            left = int(np.searchsorted(offsets, lo - base, side="right"))
            right = int(np.searchsorted(offsets, hi - base, side="left"))
            found.append(np.asarray(offsets[left:right], dtype=np.int64) + base)
            if self.token_starts[shard] > lo:  # a shard's first document starts at its first token
                found.append(np.asarray([base], dtype=np.int64))
            shard += 1
        if not found:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(found)) - lo

    def _span(self, start: int, stop: int, key: str) -> npt.NDArray[Any]:
        """``tokens`` (or ``mask``) of stream positions ``[start, stop)`` relative to ``begin``."""
        start, stop = start + self.begin, stop + self.begin
        parts = []
        shard = bisect.bisect_right(self.token_starts, start) - 1
        while start < stop:
            base = self.token_starts[shard]
            array = getattr(self.shards[shard], key)
            take = min(stop, self.token_starts[shard + 1]) - start
            parts.append(np.asarray(array[start - base : start - base + take]))
            if key == "tokens":
                self._check_ids(parts[-1], array, start - base)
            start += take
            shard += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def window(self, start: int, stop: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None]:
        """Tokens (and assistant mask) of positions ``[start, stop)`` of the selected stream."""
        return self._span(start, stop, "tokens"), self._span(start, stop, "mask") if self.chat else None

    def document(self, doc: int) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None]:
        """Tokens (and mask) of selected document ``doc`` as the tokenizer encoded it (no appended EOS)."""
        doc += self.first
        shard = bisect.bisect_right(self.doc_starts, doc) - 1
        arrays, local = self.shards[shard], doc - self.doc_starts[shard]
        start, stop = int(arrays.offsets[local]), int(arrays.offsets[local + 1]) - int(arrays.appended[local])
        mask = None if arrays.mask is None else np.asarray(arrays.mask[start:stop])
        tokens = np.asarray(arrays.tokens[start:stop])
        self._check_ids(tokens, arrays.tokens, start)
        return tokens, mask

    def _check_ids(self, tokens: npt.NDArray[Any], array: npt.NDArray[Any], offset: int) -> None:
        """Refuse an id at or above ``vocab_size`` among ``tokens``, read from ``array`` at ``offset``."""
        if self.vocab_size is None or tokens.size == 0 or int(tokens.max()) < self.vocab_size:
            return
        first = int(np.argmax(tokens >= self.vocab_size))
        raise TokenIdError(
            f"{getattr(array, 'filename', None) or 'tokens'}: offset {offset + first}: token id "
            f"{int(tokens[first])} >= vocab_size {self.vocab_size} (run python -m hyper_parallel.data verify)"
        )


def _portable(array: npt.NDArray[Any] | None) -> Any:
    if isinstance(array, np.memmap) and array.filename is not None:
        return ("memmap", str(array.filename), array.dtype.str, array.shape, int(array.offset))
    return array


def _restored(value: Any) -> Any:
    if isinstance(value, tuple) and value[:1] == ("memmap",):
        _, filename, dtype, shape, offset = value
        return np.memmap(filename, dtype=np.dtype(dtype), mode="r", shape=shape, offset=offset)
    return value


def corpus_in_memory(
    docs: Iterator[list[int]], eos: int | None, *, stop_after_tokens: int | None = None
) -> Corpus:
    """A one-shard corpus of encoded documents, with the EOS packing needs appended (as ``prepare`` does).

    ``stop_after_tokens`` stops reading once that many tokens are in (the rest would never be used).
    """
    pieces: list[npt.NDArray[np.int64]] = []
    appended: list[int] = []
    total = 0
    for ids in docs:
        add = eos is not None and (not ids or ids[-1] != eos)
        pieces.append(np.asarray([*ids, eos] if add else ids, dtype=np.int64))
        appended.append(int(add))
        total += pieces[-1].shape[0]
        if stop_after_tokens is not None and total >= stop_after_tokens:
            break
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([p.shape[0] for p in pieces], out=offsets[1:])
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return Corpus([ShardArrays(tokens, offsets, np.asarray(appended, dtype=np.uint8))])


def _labels(ids: torch.Tensor, mask: npt.NDArray[Any] | None, ignore_index: int) -> torch.Tensor:
    labels = ids.clone()
    if mask is not None:
        labels[torch.from_numpy(np.asarray(mask) == 0)] = ignore_index
    return labels


class PackedSamples(Samples):
    """Windows of ``seq_len`` tokens of a corpus's stream; with ``masking``, ``document_ids`` too."""

    def __init__(self, corpus: Corpus, seq_len: int, count: int, masking: bool, ignore_index: int) -> None:
        self.corpus, self.seq_len, self.count, self.masking = corpus, seq_len, count, masking
        self.ignore_index = ignore_index

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start, stop = index * self.seq_len, (index + 1) * self.seq_len
        tokens, mask = self.corpus.window(start, stop)
        window = torch.from_numpy(tokens.astype(np.int64))
        sample = {"input_ids": window, "labels": _labels(window, mask, self.ignore_index)}
        if self.masking:
            # The document of token t counts the documents that start in the window up to t (offsets).
            starts = self.corpus.document_starts(start, stop)
            ids = np.searchsorted(starts, np.arange(self.seq_len), side="right")
            sample["document_ids"] = torch.from_numpy(ids.astype(np.int64))
        return sample


class ChatRows(Samples):
    """Rows of whole conversations (``rows``: which documents each holds), padded on the right to
    ``seq_len`` with ``pad`` (labels ``ignore_index``); with ``masking``, ``document_ids`` number the
    conversations of a row from 0 and give the padding the next id (it attends to nothing real).
    ``cut`` (``overlong: truncate``) keeps each conversation's first ``seq_len`` tokens."""

    def __init__(
        self, corpus: Corpus, rows: Rows, seq_len: int, *, pad: int, masking: bool, ignore_index: int
    ) -> None:
        self.corpus, self.rows, self.seq_len = corpus, rows, seq_len
        self.pad, self.masking, self.ignore_index = pad, masking, ignore_index

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = np.full(self.seq_len, self.pad, dtype=np.int64)
        labels = np.full(self.seq_len, self.ignore_index, dtype=np.int64)
        documents = np.zeros(self.seq_len, dtype=np.int64)
        at = 0
        for number, doc in enumerate(self.rows.row(index).tolist()):
            tokens, mask = self.corpus.document(doc)
            tokens = tokens[: self.seq_len].astype(np.int64)
            end = at + tokens.shape[0]
            ids[at:end] = tokens
            trained = np.ones(tokens.shape[0], dtype=bool) if mask is None else mask[: tokens.shape[0]] != 0
            labels[at:end] = np.where(trained, tokens, self.ignore_index)
            documents[at:end] = number
            documents[end:] = number + 1
            at = end
        sample = {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}
        if self.masking:
            sample["document_ids"] = torch.from_numpy(documents)
        return sample


class PaddedSamples(Samples):
    """One document per sample (``documents`` picks them), cut or padded to ``seq_len`` on ``left`` or
    right (labels ignored there)."""

    def __init__(
        self,
        corpus: Corpus,
        seq_len: int,
        count: int,
        *,
        pad: int,
        left: bool,
        ignore_index: int,
        documents: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.corpus, self.seq_len, self.count = corpus, seq_len, count
        self.pad, self.left, self.ignore_index = pad, left, ignore_index
        self.documents = documents  # sample i is document documents[i] (None: document i)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, mask = self.corpus.document(index if self.documents is None else int(self.documents[index]))
        ids = torch.from_numpy(tokens[: self.seq_len].astype(np.int64))
        labels = _labels(ids, None if mask is None else mask[: self.seq_len], self.ignore_index)
        fill = self.seq_len - ids.numel()
        pad = torch.full((fill,), self.pad, dtype=torch.int64)
        ignored = torch.full((fill,), self.ignore_index, dtype=torch.int64)
        if self.left:
            return {"input_ids": torch.cat([pad, ids]), "labels": torch.cat([ignored, labels])}
        return {"input_ids": torch.cat([ids, pad]), "labels": torch.cat([labels, ignored])}


class ConcatSamples(Samples):
    """Several sources' samples under flat indices: source ``s`` holds ``[starts[s], starts[s] + len)``."""

    def __init__(self, sources: Sequence[Samples]) -> None:
        self.sources = list(sources)
        self.starts = [0]
        for source in self.sources:
            self.starts.append(self.starts[-1] + len(source))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        source = bisect.bisect_right(self.starts, index) - 1
        return self.sources[source][index - self.starts[source]]
