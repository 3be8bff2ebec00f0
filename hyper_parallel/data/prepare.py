"""``prepare``: tokenize text once into the memory-mapped shards training reads (format: ``shards``).

The tokenizer is exactly the one the config's ``tokenizer`` group builds (the command line resolves the
config with ``load_config`` and builds only its tokenizer: :class:`RunSettings`), so preparing and
training cannot disagree; the manifest records its fingerprint and training refuses shards prepared with
another.

The work is planned from the inputs alone, before any tokenizing: each ``.jsonl`` (or chat) file is cut at
line boundaries into pieces of about 4 MiB (``_UNIT_BYTES``, or ``shard_bytes`` when smaller), ``.txt``
files (one document each) are pieces of their own, a Parquet file (a text column, or with ``--format chat``
the columns of a chat record: ``messages``, ``conversations``, or ``instruction``/``input``/``output``) is
cut at row-group boundaries; consecutive pieces
make a shard once they hold ``shard_bytes``. So the shards, and every byte written, are the same for any
number of workers: a worker encodes a unit of about 4 MiB of a shard's pieces and sends its arrays back,
the main process joins a shard's units in order and writes it, and the work spreads over the workers
whatever the shard size. A finished shard is renamed into place; a prepare interrupted and run again with
the same inputs, tokenizer and options keeps the finished shards and encodes only the rest. The manifest
is written last.

Chat data is refused when it would train on nothing: a record whose rendering carries no label (no turn of
a role ``train_on`` names) is counted and the prepare refused, naming the first few and the count, unless
``drop_unlabeled`` leaves such records out (the manifest counts them); a corpus with no label at all is
refused too. Such a refusal leaves the output folder empty (it removes the shards this plan wrote), so the
same command with ``--drop-unlabeled`` can follow. The manifest records the label tokens.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import numpy as np

from hyper_parallel._disk import write_problem
from hyper_parallel._json import loads
from hyper_parallel.data import packing, shards
from hyper_parallel.data.overlong import Overlong
from hyper_parallel.errors import TextTooLong

__all__ = [
    "InputError",
    "Piece",
    "PrepareOptions",
    "RunSettings",
    "Unlabeled",
    "check_labels",
    "plan",
    "prepare",
]

_CHAT = ("chat", "chat-parquet")
_ROW_GROUPS = ("parquet", "chat-parquet")
_SUFFIXES = {".jsonl": "jsonl", ".txt": "text", ".parquet": "parquet"}
_PLAN = ".prepare-plan.json"
#: Held by the prepare writing the folder (see ``_output_lock``).
_LOCK = ".prepare.lock"
#: Documents encoded per ``encode_batch`` call.
_BATCH = 1024
#: Characters per batch of documents encoded at once (one longer document is a batch alone).
_BATCH_CHARS = 8 << 20
#: Input bytes of one unit of work: a worker encodes a unit and sends its arrays back; the main process
#: joins a shard's units and writes it. Units much smaller than a shard keep every worker busy to the end
#: (a 100 MB corpus in 64 MB shards is 25 units, not 2), and large enough that a unit's encoding
#: outweighs sending it.
_UNIT_BYTES = 4 << 20
#: Unlabeled records named in the refusal (the rest are counted).
_NAMED = 5


class InputError(ValueError):
    """An input that cannot be prepared; the message starts with its location (``data.jsonl:2: ...``)."""


@attrs.frozen
class PrepareOptions:
    """What decides the bytes a prepare writes (besides the inputs and the tokenizer).

    Chat data only: ``train_on`` names the roles whose turns carry labels (``hyper_parallel.data.chat``);
    ``drop_unlabeled`` leaves out the records that would carry none, instead of refusing them.
    """

    format: str | None = None
    text_field: str = "text"
    shard_bytes: int = 64 << 20
    chat_template: str | None = None
    train_on: tuple[str, ...] = ("assistant",)
    drop_unlabeled: bool = False


@attrs.define
class Unlabeled:
    """The chat records whose rendering carries no label: how many, and where the first ``_NAMED`` are."""

    count: int = 0
    first: list[str] = attrs.Factory(list)

    def add(self, where: str) -> None:
        self.count += 1
        if len(self.first) < _NAMED:
            self.first.append(where)

    def merge(self, other: Unlabeled) -> None:
        self.count += other.count
        self.first.extend(other.first[: _NAMED - len(self.first)])


@attrs.frozen
class Piece:
    """A part of one input file that becomes (part of) one shard: a byte range of lines, or row groups."""

    file: str
    format: str  # of the input, or "chat-parquet": chat records in a Parquet file's messages column
    start: int  # byte offset (jsonl, chat, text) or first row group (parquet, chat-parquet)
    end: int  # exclusive
    first_line: int = 1


# -- inputs --------------------------------------------------------------------------------------------
def _format_of(path: Path, forced: str | None) -> str | None:
    if forced is not None:
        return forced
    return _SUFFIXES.get(path.suffix)


def _under(folder: Path, forced: str | None) -> list[Path]:
    suffixes = [
        s
        for s, f in _SUFFIXES.items()
        if forced is None or f == forced or (forced == "chat" and f in ("jsonl", "parquet"))
    ]
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and p.suffix in suffixes
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def _component_matches(pattern: str, name: str) -> bool:
    """One path component against one glob component; a hidden name only against a hidden pattern."""
    return (not name.startswith(".") or pattern.startswith(".")) and fnmatch.fnmatchcase(name, pattern)


def _closure(patterns: Sequence[str], states: frozenset[int]) -> frozenset[int]:
    """``states`` with every state reached by letting a ``**`` match no folder."""
    reached = set(states)
    for i in sorted(states):
        while i < len(patterns) and patterns[i] == "**":
            i += 1
            reached.add(i)
    return frozenset(reached)


def _start(patterns: Sequence[str]) -> frozenset[int]:
    """The matcher's states before any component: ``i`` means ``patterns[:i]`` match what was read."""
    return _closure(patterns, frozenset({0}))


def _advance(patterns: Sequence[str], states: frozenset[int], name: str) -> frozenset[int]:
    """The states after one more component ``name`` (``**``: any number of non-hidden folders).

    The matcher reads a path one component at a time, so a walk passes each folder's states to its
    entries: ``len(patterns)`` steps per entry, whatever its depth (matching the whole path again at each
    entry made a deep tree cost depth squared), and a folder no state survives is not entered.
    """
    following = set()
    for i in states:
        if i == len(patterns):
            continue
        if patterns[i] == "**":
            if not name.startswith("."):
                following.add(i)
        elif _component_matches(patterns[i], name):
            following.add(i + 1)
    return _closure(patterns, frozenset(following))


def _parts_match(patterns: Sequence[str], parts: Sequence[str]) -> bool:
    """Whether a relative path's components match a pattern's (``**``: any number of folders)."""
    states = _start(patterns)
    for part in parts:
        states = _advance(patterns, states, part)
        if not states:
            return False
    return len(patterns) in states


def _matching(raw: str) -> list[Path]:
    """The paths a glob ``raw`` matches, sorted; ``**`` walks folders without following symbolic links.

    ``glob.glob(recursive=True)`` follows links to folders, so a link to a parent folder made it walk
    forever (two such links: 2^40 paths before the kernel's ELOOP); here a link to a folder is neither
    entered nor matched (a link to a file is an input like any file). A pattern without ``**`` cannot
    descend further than it names and is left to ``glob``. Each entry costs one step of the matcher
    (``_advance``) from its folder's states.
    """
    if "**" not in raw:
        return [Path(p) for p in sorted(glob.glob(raw))]
    parts = Path(raw).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    patterns = parts[fixed:]
    hidden_ok = any(p.startswith(".") for p in patterns)
    found: list[Path] = []
    states = {str(root): _start(patterns)}
    for current, folders, files in os.walk(root, followlinks=False):
        here = states.pop(current)
        folders[:] = sorted(f for f in folders if not f.startswith(".") or hidden_ok)
        links = {f for f in folders if os.path.islink(os.path.join(current, f))}  # listed by no match
        walked = {f for f in folders if f not in links}
        entered = []
        for name in [*(f for f in folders if f in walked), *files]:
            after = _advance(patterns, here, name)
            if len(patterns) in after:
                found.append(Path(current, name) if fixed else Path(current, name).relative_to(root))
            if name in walked and after:
                states[os.path.join(current, name)] = after
                entered.append(name)
        folders[:] = entered  # a folder no state survives holds no match: not walked
    return sorted(found)


def find_inputs(inputs: Sequence[str], forced: str | None) -> list[tuple[Path, str]]:
    """The files named by ``inputs`` (files, folders searched recursively, globs), each with its format."""
    found: list[tuple[Path, str]] = []
    for raw in inputs:
        if glob.has_magic(raw):
            matches = _matching(raw)
            if not matches:
                raise InputError(f"{raw}: no file matches this pattern")
        else:
            matches = [Path(raw)]
        for path in matches:
            if path.is_dir():
                files = _under(path, forced)
                if not files:
                    raise InputError(f"{path}: no .jsonl, .txt or .parquet file in this folder")
            elif path.is_file():
                files = [path]
            else:
                raise InputError(f"{path}: no such file or folder")
            for file in files:
                fmt = _format_of(file, forced)
                if fmt is None:
                    raise InputError(
                        f"{file}: unknown input format (expected .jsonl, .txt or .parquet; or give --format)"
                    )
                found.append((file, fmt))
    return found


def _scan_lines(path: Path, cut_bytes: int) -> tuple[str, list[Piece]]:
    """SHA-256 of a line-based file and its pieces: cut at the first line end after every ``cut_bytes``.

    Each byte is searched and counted once (``_newlines`` counts from the previous cut, never from the
    block's start): linear in the file however many cuts a block holds (a 1-byte ``--shard-mb`` cuts at
    every line).
    """
    digest = hashlib.sha256()
    pieces: list[Piece] = []
    start, start_line, block_start, target = 0, 1, 0, cut_bytes
    lines = 0  # line ends counted so far, up to ``counted`` in the current block
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            counted = 0
            search = max(target - block_start, 0)
            while search < len(block):
                newline = block.find(b"\n", search)
                if newline < 0:
                    break
                cut = block_start + newline + 1
                lines += _newlines(block, counted, newline + 1)
                counted = newline + 1
                pieces.append(Piece(str(path), "", start, cut, start_line))
                start, start_line = cut, lines + 1
                target = cut + cut_bytes
                search = target - block_start
            lines += _newlines(block, counted, len(block))
            block_start += len(block)
    if block_start > start or not pieces:
        pieces.append(Piece(str(path), "", start, block_start, start_line))
    return digest.hexdigest(), pieces


def _newlines(block: bytes, begin: int, end: int) -> int:
    """Line ends in ``block[begin:end]`` (one function, so that a test can count the bytes searched)."""
    return block.count(b"\n", begin, end)


def _piece_size(piece: Piece) -> int:
    """Input bytes of a piece (a Parquet piece counts as a whole unit: it is cut at about one)."""
    return _UNIT_BYTES if piece.format in _ROW_GROUPS else piece.end - piece.start


def _group(pieces: Sequence[Piece], size: int, sizes: Sequence[int] | None = None) -> list[list[Piece]]:
    """Consecutive pieces, closed into a group once it holds at least ``size`` bytes."""
    groups: list[list[Piece]] = []
    current: list[Piece] = []
    held = 0
    for index, piece in enumerate(pieces):
        current.append(piece)
        held += sizes[index] if sizes is not None else _piece_size(piece)
        if held >= size:
            groups.append(current)
            current, held = [], 0
    if current:
        groups.append(current)
    return groups


def plan(inputs: Sequence[str], options: PrepareOptions) -> tuple[list[dict[str, Any]], list[list[Piece]]]:
    """The inputs (name, size, SHA-256) and the shards (each a list of pieces), from the inputs alone."""
    records: list[dict[str, Any]] = []
    tasks: list[list[Piece]] = []
    texts: list[Piece] = []
    text_bytes = 0
    for path, fmt in find_inputs(inputs, options.format):
        size = path.stat().st_size
        if fmt == "text":
            digest = shards.file_digest(path)
            if texts and text_bytes + size > options.shard_bytes:
                tasks.append(texts)
                texts, text_bytes = [], 0
            texts.append(Piece(str(path), fmt, 0, size))
            text_bytes += size
        else:
            if texts:
                tasks.append(texts)
                texts, text_bytes = [], 0
            if fmt == "parquet" or (fmt == "chat" and path.suffix == ".parquet"):
                digest = shards.file_digest(path)
                kind = "parquet" if fmt == "parquet" else "chat-parquet"
                tasks.extend(_parquet_shards(path, options.shard_bytes, kind))
            else:
                # Pieces of a unit each, closed into a shard once it holds shard_bytes.
                digest, pieces = _scan_lines(path, min(options.shard_bytes, _UNIT_BYTES))
                pieces = [attrs.evolve(piece, format=fmt) for piece in pieces]
                tasks.extend(_group(pieces, options.shard_bytes))
        records.append({"name": str(path), "format": fmt, "size": size, "sha256": digest})
    if texts:
        tasks.append(texts)
    return records, tasks


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        raise InputError("reading Parquet needs pyarrow: pip install 'hyper_parallel[parquet]'") from None
    return pq


def _parquet_shards(path: Path, shard_bytes: int, kind: str) -> list[list[Piece]]:
    """A Parquet file's shards: pieces of row groups of about a unit each, closed at ``shard_bytes``."""
    pq = _pyarrow_parquet()
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises its own error types for a file that is not Parquet
        raise InputError(f"{path}: not a Parquet file ({exc})") from None
    sizes = [meta.row_group(group).total_byte_size for group in range(meta.num_row_groups)]
    unit = min(shard_bytes, _UNIT_BYTES)
    pieces: list[Piece] = []
    piece_sizes: list[int] = []
    start = held = 0
    for group, size in enumerate(sizes):
        held += size
        if held >= unit:
            pieces.append(Piece(str(path), kind, start, group + 1))
            piece_sizes.append(held)
            start, held = group + 1, 0
    if start < len(sizes) or not pieces:
        pieces.append(Piece(str(path), kind, start, len(sizes)))
        piece_sizes.append(held)
    return _group(pieces, shard_bytes, piece_sizes)


# -- documents of a piece ------------------------------------------------------------------------------
#: What ``bytes.strip`` strips: a line of only these is blank (``str.strip`` would strip more).
_BLANK = " \t\n\r\x0b\x0c"


def _lines(piece: Piece) -> Iterator[tuple[int, str]]:
    with open(piece.file, "rb") as handle:
        handle.seek(piece.start)
        data = handle.read(piece.end - piece.start)
    try:
        text = data.decode("utf-8")  # once per piece: json then skips its encoding detection on each line
    except UnicodeDecodeError as exc:
        at = piece.first_line + data.count(b"\n", 0, exc.start)
        raise InputError(f"{piece.file}:{at}: not UTF-8 text") from None
    for number, line in enumerate(text.split("\n"), piece.first_line):
        if line.strip(_BLANK):
            yield number, line


def _record(piece: Piece, number: int, line: str) -> dict[str, Any]:
    try:
        record = loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{piece.file}:{number}: not a JSON object: {exc.msg}") from None
    if not isinstance(record, dict):
        raise InputError(f"{piece.file}:{number}: not a JSON object")
    return record


def texts_of(piece: Piece, text_field: str) -> Iterator[tuple[str, str]]:
    """The documents of a ``jsonl``, ``text`` or ``parquet`` piece, in order, each with its location
    (``FILE:LINE``, ``FILE: row N``, or the file)."""
    if piece.format == "text":
        try:
            yield piece.file, Path(piece.file).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{piece.file}: not UTF-8 text (byte {exc.start})") from None
        return
    if piece.format == "parquet":
        yield from _parquet_texts(piece, text_field)
        return
    for number, line in _lines(piece):
        record = _record(piece, number, line)
        text = record.get(text_field)
        if not isinstance(text, str):
            raise InputError(f"{piece.file}:{number}: no string field {text_field!r}")
        yield f"{piece.file}:{number}", text


def chats_of(piece: Piece) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A chat piece's conversations, checked, each with its location (``FILE:LINE`` or ``FILE: row N``):
    each record's shape (OpenAI, ShareGPT, Alpaca) is told apart by ``chat.conversation``."""
    from hyper_parallel.data.chat import conversation

    if piece.format == "chat-parquet":
        records: Iterator[tuple[str, dict[str, Any]]] = _parquet_chat_rows(piece)
    else:
        records = ((f"{piece.file}:{number}", _record(piece, number, line)) for number, line in _lines(piece))
    for where, record in records:
        try:
            messages = conversation(record)
        except ValueError as exc:
            raise InputError(f"{where}: {exc}") from None
        yield where, messages


#: The Parquet columns a chat record is read from (those of the three shapes).
_CHAT_COLUMNS = ("messages", "conversations", "instruction", "input", "output")


def _parquet_chat_rows(piece: Piece) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each row of a chat Parquet piece as a record of the chat columns the file has, with ``FILE: row N``."""
    pq = _pyarrow_parquet()
    handle = pq.ParquetFile(piece.file)
    names = handle.schema_arrow.names
    columns = [column for column in _CHAT_COLUMNS if column in names]
    if not {"messages", "conversations", "instruction", "output"} & set(columns):
        raise InputError(
            f"{piece.file}: no column 'messages', 'conversations' or 'instruction'/'output' "
            f"(columns: {names})"
        )
    row = sum(handle.metadata.row_group(g).num_rows for g in range(piece.start))
    for group in range(piece.start, piece.end):
        for record in handle.read_row_group(group, columns=columns).to_pylist():
            yield f"{piece.file}: row {row}", record
            row += 1


def _parquet_column(piece: Piece, column: str) -> Iterator[tuple[str, object]]:
    """Each row's value of ``column`` in the piece's row groups, with its location ``FILE: row N``."""
    pq = _pyarrow_parquet()
    handle = pq.ParquetFile(piece.file)
    if column not in handle.schema_arrow.names:
        raise InputError(f"{piece.file}: no column {column!r} (columns: {handle.schema_arrow.names})")
    row = sum(handle.metadata.row_group(g).num_rows for g in range(piece.start))
    for group in range(piece.start, piece.end):
        for value in handle.read_row_group(group, columns=[column]).column(0).to_pylist():
            yield f"{piece.file}: row {row}", value
            row += 1


def _parquet_texts(piece: Piece, text_field: str) -> Iterator[tuple[str, str]]:
    for where, value in _parquet_column(piece, text_field):
        if not isinstance(value, str):
            raise InputError(f"{where}: column {text_field!r} is not a string")
        yield where, value


# -- encoding ------------------------------------------------------------------------------------------
def _chars(item: Any) -> int:
    """Characters of a text, or of a conversation's message contents (alone or after its location)."""
    if isinstance(item, tuple):
        item = item[-1]
    if isinstance(item, str):
        return len(item)
    if isinstance(item, list):
        return sum(
            len(m["content"]) for m in item if isinstance(m, dict) and isinstance(m.get("content"), str)
        )
    return 0


def _batches(items: Iterator[Any]) -> Iterator[list[Any]]:
    """Batches of at most ``_BATCH`` items and, past the first item, ``_BATCH_CHARS`` characters: the Python
    side stays bounded (the tokenizer splits a batch again by its growth, ``MAX_ENCODE_CHARS``)."""
    batch: list[Any] = []
    chars = 0
    for item in items:
        batch.append(item)
        chars += _chars(item)
        if len(batch) >= _BATCH or chars >= _BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def encode_pieces(
    tokenizer: Any,
    pieces: Sequence[Piece],
    options: PrepareOptions,
    dtype: np.dtype[Any],
    unlabeled: Unlabeled | None = None,
    inputs: Mapping[str, int] | None = None,
) -> shards.ShardArrays:
    """The shard arrays of ``pieces``: each document encoded, EOS appended where packing needs it.

    Documents are encoded a batch at a time into one array per batch (``encode_batch_flat``), and the
    arrays are joined once per shard: no Python list or array per document on the text path. Chat
    documents also get their record's ``(input index, line)`` (``inputs``: each file's index; by
    default the order the pieces name them in).

    A chat record that carries no label is left out when ``options.drop_unlabeled``; either way it is
    counted in ``unlabeled`` (without one, a kept record is an ``InputError`` at its place).
    """
    inputs = (
        inputs if inputs is not None else {f: i for i, f in enumerate(dict.fromkeys(p.file for p in pieces))}
    )
    records: list[np.ndarray[Any, Any]] = []
    eos = getattr(tokenizer, "eos_id", None)
    tokens: list[np.ndarray[Any, Any]] = []
    lengths: list[np.ndarray[Any, Any]] = []
    appended: list[np.ndarray[Any, Any]] = []
    masks: list[np.ndarray[Any, Any]] = []
    chat = any(piece.format in _CHAT for piece in pieces)
    if chat:
        from hyper_parallel.data.chat import ChatRenderer

        renderer = ChatRenderer(tokenizer, options.chat_template, options.train_on)
    for piece in pieces:
        if piece.format in _CHAT:
            for batch in _batches(chats_of(piece)):
                kept = _labelled(_encode_chats(renderer, batch), batch, options, unlabeled)
                encoded = [pair for _, pair in kept]
                lines = [_line_of(where) for where, _ in kept]
                records.append(
                    np.column_stack([np.full(len(lines), inputs[piece.file]), lines]).astype(np.int64).ravel()
                )
                sizes = np.fromiter((len(i) for i, _ in encoded), dtype=np.int64, count=len(encoded))
                every = itertools.chain.from_iterable(i for i, _ in encoded)
                ids = np.fromiter(every, dtype=dtype, count=int(sizes.sum()))
                trained = np.fromiter(
                    itertools.chain.from_iterable(m for _, m in encoded), dtype=np.uint8, count=ids.size
                )
                ids, sizes, added, closed = _close_with_eos(ids, sizes, eos, trained)
                tokens.append(ids)
                lengths.append(sizes)
                appended.append(added)
                assert closed is not None
                masks.append(closed)
            continue
        for batch in _batches(texts_of(piece, options.text_field)):
            ids, sizes = _encode_flat(tokenizer, batch, dtype)
            ids, sizes, added, _ = _close_with_eos(ids, sizes, eos, None)
            tokens.append(ids)
            lengths.append(sizes)
            appended.append(added)
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return shards.ShardArrays(
        (np.concatenate(tokens) if tokens else np.zeros(0, dtype=dtype)).astype(dtype, copy=False),
        offsets,
        np.concatenate(appended) if appended else np.zeros(0, dtype=np.uint8),
        (np.concatenate(masks) if masks else np.zeros(0, dtype=np.uint8)) if chat else None,
        (np.concatenate(records) if records else np.zeros(0, dtype=np.int64)) if chat else None,
    )


def _line_of(where: str) -> int:
    """The line (or Parquet row) of a record's location, ``FILE:LINE`` or ``FILE: row N``: its last
    number, which is what a check names it by later (``records.npy``)."""
    digits = len(where) - len(where.rstrip("0123456789"))
    return int(where[-digits:]) if digits else 0


def _close_with_eos(
    ids: np.ndarray[Any, Any], sizes: np.ndarray[Any, Any], eos: int | None, mask: np.ndarray[Any, Any] | None
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    """Documents end to end with the EOS packing separates them by appended where one is missing.

    Returns the ids, the lengths, 1 per document whose EOS was appended (else 0) and the mask (0 on an
    appended EOS: it is not trained on).
    """
    ends = np.cumsum(sizes)
    if eos is None:
        return ids, sizes, np.zeros(sizes.size, dtype=np.uint8), mask
    last = ids[np.maximum(ends - 1, 0)] if ids.size else np.zeros(sizes.size, dtype=ids.dtype)
    add = (sizes == 0) | (last != eos)
    if not add.any():
        return ids, sizes, add.astype(np.uint8), mask
    closed = sizes + add
    new_ends = np.cumsum(closed)
    out = np.empty(int(new_ends[-1]), dtype=ids.dtype)
    added_at = np.zeros(out.size, dtype=bool)
    added_at[new_ends[add] - 1] = True
    out[added_at] = eos
    out[~added_at] = ids
    if mask is not None:
        closed_mask = np.zeros(out.size, dtype=np.uint8)
        closed_mask[~added_at] = mask
        mask = closed_mask
    return out, closed, add.astype(np.uint8), mask


def _labelled(
    encoded: list[tuple[list[int], list[int]]],
    batch: Sequence[tuple[str, object]],
    options: PrepareOptions,
    unlabeled: Unlabeled | None,
) -> list[tuple[str, tuple[list[int], list[int]]]]:
    """``encoded`` with its records' locations, the records that carry no label counted, and left out
    when dropping them."""
    kept: list[tuple[str, tuple[list[int], list[int]]]] = []
    for (where, _), (ids, mask) in zip(batch, encoded, strict=True):
        if any(mask):
            kept.append((where, (ids, mask)))
            continue
        if unlabeled is None and not options.drop_unlabeled:
            raise InputError(f"{where}: {_unlabeled_problem(options)}")
        if unlabeled is not None:
            unlabeled.add(where)
        if not options.drop_unlabeled:
            kept.append((where, (ids, mask)))
    return kept


def _unlabeled_problem(options: PrepareOptions) -> str:
    return f"no token carries a label (no turn of a role train_on names: {', '.join(options.train_on)})"


def _encode_flat(
    tokenizer: Any, batch: list[tuple[str, str]], dtype: np.dtype[Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The tokenizer's ``encode_batch`` of the texts of ``batch`` (location, text) end to end in one
    array, and each text's length; a text too long for one encoding (``text_problem``: its normalizer's
    growth: ``TextTooLong``) is an input error at its place."""
    texts = [text for _, text in batch]
    flat = getattr(tokenizer, "encode_batch_flat", None)
    try:
        if flat is not None:
            ids, sizes = flat(texts, dtype)
            return np.asarray(ids, dtype=dtype), np.asarray(sizes, dtype=np.int64)
        encoded = tokenizer.encode_batch(texts)
    except TextTooLong as exc:
        raise InputError(f"{batch[exc.index][0]}: {exc}") from None
    sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    return np.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype, count=int(sizes.sum())), sizes


def _encode_chats(
    renderer: Any, batch: list[tuple[str, list[dict[str, str]]]]
) -> list[tuple[list[int], list[int]]]:
    """The renderer's encodings of a batch, each conversation rendered once; one it cannot render (a
    ``ConversationError`` naming its index) is an input error at its place."""
    from hyper_parallel.data.chat import ConversationError

    try:
        encoded: list[tuple[list[int], list[int]]] = renderer.encode_batch(
            [messages for _, messages in batch]
        )
    except ConversationError as exc:
        raise InputError(f"{batch[exc.index][0]}: {exc}") from None
    return encoded


@attrs.frozen
class RunSettings:
    """What ``prepare`` takes of the training config (resolved by the command line, ``__main__``, so
    that this module, which the ``chat`` source encodes with, never imports the config package)."""

    #: The tokenizer the config's ``tokenizer`` group builds (nothing else of the config is built).
    tokenizer: Any
    #: The config file, as messages name it.
    config_file: str
    #: Its ``training.seq_len`` (None: the config has none), which chat data is checked against.
    seq_len: int | None = None
    #: Its dataset's ``overlong`` policy (``error`` when its dataset has none).
    overlong: Overlong = "error"


def _check_chat_rows(
    folder: Path,
    entries: Sequence[dict[str, Any]],
    names: Sequence[str],
    seq_len: int,
    policy: Overlong,
    where: str,
) -> list[str]:
    """The lines saying how the prepared conversations pack into rows of ``seq_len`` (``where``: whose
    seq_len), or an :class:`InputError` naming the first one longer than it when ``policy`` is ``error``."""
    lengths, located = [], []
    for entry in entries:
        shard = folder / str(entry["name"])
        offsets = np.load(shard / "offsets.npy", mmap_mode="r")
        lengths.append(np.diff(offsets) - np.load(shard / "appended.npy", mmap_mode="r"))
        located.append(np.load(shard / "records.npy", mmap_mode="r").reshape(-1, 2))  # every chat shard's
    every = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    over = packing.overlong(every, seq_len)
    lines = []
    if over.size:
        first = int(over[0])
        index, line = (int(x) for x in np.concatenate(located)[first])
        if policy == "error":
            raise InputError(
                f"{shards.record_where(names[index], line)}: a conversation of {int(every[first])} tokens, "
                f"longer than training.seq_len {seq_len} of {where} ({over.size} of {every.size} "
                "conversations are): give --overlong drop or truncate (and set dataloader.dataset.overlong "
                "to the same), or raise training.seq_len"
            )
        done = "dropped" if policy == "drop" else f"cut to {seq_len} tokens"
        lines.append(
            f"overlong: {over.size} of {every.size} conversations are longer than seq_len {seq_len}: "
            f"{done} when training (overlong: {policy})"
        )
    sizes, kept = packing.fitted(every, seq_len, policy)
    rows = packing.pack_rows(sizes, seq_len, kept)
    lines.append(
        f"packing at seq_len {seq_len}: {kept.size:,} conversations in {len(rows):,} rows, efficiency "
        f"{rows.efficiency(sizes, seq_len):.1%} (real tokens / row tokens; no conversation split)"
    )
    return lines


_WORKER: dict[str, Any] = {}


def _worker_init(tokenizer: Any, options: PrepareOptions, dtype: str, inputs: Mapping[str, int]) -> None:
    # The tokenizer the main process built, pickled: a worker loads no config, so it starts in the time
    # numpy and the tokenizer library take to import.
    _WORKER.update(tokenizer=tokenizer, options=options, dtype=np.dtype(dtype), inputs=inputs)


_Unit = tuple[int, int, list[Piece]]  # shard index, unit index in the shard, pieces
# shard, unit, arrays and unlabeled records, or the input error
_Done = tuple[int, int, tuple[shards.ShardArrays, Unlabeled] | None, str | None]


def _work(task: _Unit) -> _Done:
    """Encode one unit of a shard in a worker: its arrays and unlabeled records, or the input error."""
    shard, unit, pieces = task
    unlabeled = Unlabeled()
    try:
        arrays = encode_pieces(
            _WORKER["tokenizer"], pieces, _WORKER["options"], _WORKER["dtype"], unlabeled, _WORKER["inputs"]
        )
    except InputError as exc:
        return shard, unit, None, str(exc)
    return shard, unit, (arrays, unlabeled), None


def _units(shard: int, pieces: Sequence[Piece], unit_bytes: int) -> list[_Unit]:
    return [(shard, unit, group) for unit, group in enumerate(_group(pieces, unit_bytes))]


def _join(parts: Sequence[shards.ShardArrays]) -> shards.ShardArrays:
    """One shard's arrays from its units' (in order): what encoding all its pieces at once gives."""
    if len(parts) == 1:
        return parts[0]
    sizes = np.concatenate([np.diff(part.offsets) for part in parts])
    offsets = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    masks = [part.mask for part in parts if part.mask is not None]
    records = [part.records for part in parts if part.records is not None]
    return shards.ShardArrays(
        np.concatenate([part.tokens for part in parts]),
        offsets,
        np.concatenate([part.appended for part in parts]),
        np.concatenate(masks) if masks else None,
        np.concatenate(records) if records else None,
    )


class _Progress:
    """``shards N/M  docs N  tokens N  MB/s`` on one rewritten line, on a terminal only."""

    def __init__(self, stream: TextIO, total_shards: int, done_shards: int) -> None:
        self.stream, self.total = stream, total_shards
        self.tty = stream.isatty()
        self.started = time.perf_counter()
        self.docs = self.tokens = self.bytes = 0
        self.done = done_shards

    def update(self, arrays: shards.ShardArrays, input_bytes: int, shard_done: bool) -> None:
        self.docs += arrays.documents
        self.tokens += int(arrays.tokens.shape[0])
        self.bytes += input_bytes
        self.done += int(shard_done)
        if self.tty:
            rate = self.bytes / 1e6 / max(time.perf_counter() - self.started, 1e-9)
            self.stream.write(
                f"\rshards {self.done}/{self.total}  docs {self.docs:,}  tokens {self.tokens:,}  "
                f"{rate:,.1f} MB/s"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.docs:
            self.stream.write("\n")


def _piece_bytes(pieces: Sequence[Piece]) -> int:
    return sum(p.end - p.start if p.format not in _ROW_GROUPS else 0 for p in pieces)


def prepare(
    inputs: Sequence[str],
    output: str,
    run: RunSettings,
    *,
    options: PrepareOptions | None = None,
    workers: int = 1,
    stream: TextIO | None = None,
    overlong: Overlong | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into the prepared folder ``output`` with ``run``'s tokenizer; returns the
    manifest written.

    Raises :class:`InputError` for an input or an output folder that cannot be used (nothing is left
    half-written: only finished shards, which a later run with the same plan keeps). Chat data is
    checked against the config's ``training.seq_len`` before the manifest is written: a conversation
    longer than it is refused unless ``overlong`` (default: ``run.overlong``) drops or cuts such ones;
    the shards never depend on it (the loader applies the policy), so a refused prepare run again with
    ``--overlong`` keeps them. How the conversations pack (rows, efficiency) is written to ``out``.
    """
    options = options or PrepareOptions()
    stream = stream if stream is not None else sys.stderr
    tokenizer, seq_len, config_file = run.tokenizer, run.seq_len, run.config_file
    overlong = run.overlong if overlong is None else overlong
    template = None
    if options.format == "chat":
        from hyper_parallel.data.chat import ChatRenderer, train_on_problem

        problem = train_on_problem(options.train_on)
        if problem is not None:
            raise InputError(f"train_on: {problem}")
        try:
            template = ChatRenderer(tokenizer, options.chat_template, options.train_on).template_text
        except ValueError as exc:
            raise InputError(str(exc)) from None
    fingerprint, description = shards.tokenizer_fingerprint(tokenizer)
    dtype = shards.token_dtype(int(tokenizer.vocab_size))
    records, tasks = plan(inputs, options)
    folder = Path(output)
    the_plan = {
        "tokenizer": fingerprint,
        "dtype": dtype.name,
        "options": attrs.asdict(options),
        "inputs": records,
        "shards": [[attrs.asdict(p) for p in pieces] for pieces in tasks],
    }
    with _output_lock(folder):
        with _writing(folder / _PLAN):
            _claim(folder, the_plan)
        entries: dict[int, dict[str, Any]] = {}
        todo: list[_Unit] = []
        for index, pieces in enumerate(tasks):
            entry = shards.finished_shard(folder, shards.shard_name(index))
            if entry is not None:
                entries[index] = entry
            else:
                todo.extend(_units(index, pieces, min(options.shard_bytes, _UNIT_BYTES)))
        names = {str(r["name"]): i for i, r in enumerate(records)}
        progress = _Progress(stream, len(tasks), len(entries))
        collector = _Collector(folder, todo, entries, progress)
        try:
            if workers <= 1 or len(todo) <= 1:
                _worker_init(tokenizer, options, dtype.name, names)
                collector.collect(map(_work, todo))
            else:
                context = multiprocessing.get_context("spawn")
                with context.Pool(
                    min(workers, len(todo)),
                    initializer=_worker_init,
                    initargs=(tokenizer, options, dtype.name, names),
                ) as pool:
                    collector.collect(pool.imap_unordered(_work, todo))
        finally:
            progress.close()
            _WORKER.clear()
        ordered = [entries[i] for i in range(len(tasks))]
        chat = any(p.format in _CHAT for pieces in tasks for p in pieces)
        labels = _labels(folder, len(tasks), ordered, options) if chat else None
        if chat and seq_len is not None:
            report = _check_chat_rows(folder, ordered, list(names), seq_len, overlong, config_file)
            if out is not None:
                out.write("".join(f"{line}\n" for line in report))
        manifest = {
            "format": shards.FORMAT,
            "version": shards.FORMAT_VERSION,
            "tokenizer": {"fingerprint": fingerprint, "description": description},
            "dtype": dtype.name,
            "input_format": options.format,
            "text_field": options.text_field,
            "chat": chat,
            "chat_template_sha256": (
                None if template is None else hashlib.sha256(template.encode("utf-8")).hexdigest()
            ),
            "inputs": [{k: r[k] for k in ("name", "size", "sha256")} for r in records],
            "shards": ordered,
            "documents": sum(int(e["documents"]) for e in ordered),
            "tokens": sum(int(e["tokens"]) for e in ordered),
            "label_tokens": labels,
            "unlabeled_dropped": sum(int(e.get("unlabeled", 0)) for e in ordered) if chat else 0,
        }
        with _writing(folder / shards.MANIFEST):
            shards.write_manifest(folder, manifest)
        return manifest


def _labels(folder: Path, count: int, entries: Sequence[dict[str, Any]], options: PrepareOptions) -> int:
    """The label tokens of a chat corpus's shards; refused (its shards removed: ``_discard``) when kept
    records carry no label, or none at all does."""
    unlabeled = Unlabeled()
    for entry in entries:
        unlabeled.count += int(entry.get("unlabeled", 0))
        unlabeled.first.extend(entry.get("unlabeled_at", [])[: _NAMED - len(unlabeled.first)])
    labels = sum(int(entry.get("label_tokens", 0)) for entry in entries)
    try:
        check_labels(unlabeled, labels, options, str(folder), "--drop-unlabeled")
    except InputError:
        _discard(folder, count)
        raise
    return labels


def check_labels(unlabeled: Unlabeled, labels: int, options: PrepareOptions, where: str, drop: str) -> None:
    """Refuse (``InputError``) kept records that carry no label (``drop`` names the option that leaves
    them out), or a corpus at ``where`` in which no token carries one: a run would train on nothing."""
    if unlabeled.count and not options.drop_unlabeled:
        named = ", ".join(unlabeled.first) + (", ..." if unlabeled.count > len(unlabeled.first) else "")
        raise InputError(
            f"{unlabeled.first[0]}: {_unlabeled_problem(options)}; {unlabeled.count:,} record(s) in all "
            f"carry none ({named}): fix them, or leave them out with {drop}"
        )
    if labels == 0:
        dropped = f" ({unlabeled.count:,} record(s) without one dropped)" if unlabeled.count else ""
        raise InputError(
            f"{where}: no token carries a label{dropped}: a run would train on nothing "
            f"(train_on: {', '.join(options.train_on)})"
        )


def _discard(folder: Path, count: int) -> None:
    """Remove the ``count`` shards of the plan claiming ``folder`` and the plan: a refused corpus leaves an
    empty folder, which any prepare may claim (a resumed one would keep them, refused again)."""
    for index in range(count):
        shutil.rmtree(folder / shards.shard_name(index), ignore_errors=True)
    (folder / _PLAN).unlink(missing_ok=True)


class _Collector:
    """Joins each shard's units as they arrive (in any order) and writes the shard once it is whole."""

    def __init__(
        self,
        folder: Path,
        todo: Sequence[_Unit],
        entries: dict[int, dict[str, Any]],
        progress: _Progress,
    ) -> None:
        self.folder, self.entries, self.progress = folder, entries, progress
        self.units: dict[int, int] = {}
        self.sizes: dict[tuple[int, int], int] = {}
        for shard, unit, pieces in todo:
            self.units[shard] = self.units.get(shard, 0) + 1
            self.sizes[shard, unit] = _piece_bytes(pieces)
        self.parts: dict[int, dict[int, tuple[shards.ShardArrays, Unlabeled]]] = {}

    def collect(self, results: Iterator[_Done]) -> None:
        for shard, unit, done, error in results:
            if error is not None:
                raise InputError(error)
            assert done is not None
            parts = self.parts.setdefault(shard, {})
            parts[unit] = done
            whole = len(parts) == self.units[shard]
            if whole:
                ordered = [parts[u] for u in range(self.units[shard])]
                joined = _join([arrays for arrays, _ in ordered])
                unlabeled = Unlabeled()
                for _, part in ordered:
                    unlabeled.merge(part)
                del self.parts[shard]
                name = shards.shard_name(shard)
                notes = {"unlabeled": unlabeled.count, "unlabeled_at": unlabeled.first}
                with _writing(self.folder / name):
                    self.entries[shard] = shards.write_shard(
                        self.folder, name, joined, notes if joined.mask is not None else None
                    )
            self.progress.update(done[0], self.sizes[shard, unit], whole)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A failed write (a full disk) inside the block as an ``InputError`` naming ``path``: such errors
    often carry no file name, and the user must know what to free and that the work done is kept."""
    try:
        yield
    except OSError as exc:
        raise InputError(
            f"{path}: {write_problem(exc)}; the shards finished so far are kept: free space and run the "
            "same command again to continue"
        ) from None


@contextlib.contextmanager
def _output_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder/.prepare.lock`` (``fcntl.flock``) inside the block; refuse a folder another holds.

    Two prepares of the same plan into one folder would both pass ``_claim`` and write the same shards
    at once. The file stays empty (a finished folder is byte-identical whoever wrote it) and is opened
    without following a symbolic link; the kernel drops the lock with the descriptor or the process.
    """
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / _LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InputError(f"{path}: cannot open the lock file: {write_problem(exc)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(
                f"{folder}: another prepare is writing this folder; wait for it to end or give another "
                "--output"
            ) from None
        yield
    finally:
        os.close(fd)


def _claim(folder: Path, the_plan: dict[str, Any]) -> None:
    """Make ``folder`` this prepare's: new or empty, or holding an unfinished prepare of the same plan."""
    text = json.dumps(the_plan, sort_keys=True)
    marker = folder / _PLAN
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: exists and is not a folder")
    if folder.is_dir() and any(p.name != _LOCK for p in folder.iterdir()):
        if not marker.is_file() or marker.read_text(encoding="utf-8") != text:
            raise InputError(
                f"{folder}: not empty and not an unfinished prepare of these inputs with this tokenizer and "
                "these options: give an empty or new --output folder"
            )
        (folder / shards.MANIFEST).unlink(missing_ok=True)
        return
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{_PLAN}.tmp"
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, marker)
