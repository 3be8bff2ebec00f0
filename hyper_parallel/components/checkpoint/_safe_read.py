"""Reading a checkpoint folder without running code from it (part of ``Checkpoint``).

A checkpoint folder is data, yet torch DCP reads its ``.metadata`` with ``pickle.load`` and its non-tensor
items with ``torch.load(weights_only=False)``: a crafted folder would run code in a resume, through
``initial_load_path`` or in ``hyper_parallel.export``. Everything here reads them with loaders that
cannot:

- ``.metadata`` through ``_MetadataUnpickler``, whose ``find_class`` admits only the classes DCP's
  ``Metadata`` is built from (its dataclasses and enum, ``torch.Size``, the dtypes and layouts, the path
  its writer records) and refuses any other global with ``RefusedContentError`` naming the file and the
  global;
- non-tensor items through ``torch.load(weights_only=True)`` (torch's restricted unpickler), kept only
  when they are plain values (numbers, strings, lists and dicts of them): the optimizer's
  ``param_groups`` hyperparameters, and in checkpoints of earlier versions the JSON parts as strings
  (this version saves those as ``uint8`` tensors of UTF-8 JSON, see ``_state``). Tensor data DCP
  already reads with ``weights_only=True``.

``SafeReader`` (a ``FileSystemReader``) and ``SafePlanner`` (a ``DefaultLoadPlanner``) are passed to
``dcp.load`` as ``storage_reader`` and ``planner`` by every reader of checkpoints in this package, after
``inspect(folder)``: the checksum manifest's files must exist with their sizes and digests (``_manifest``),
``.metadata`` must be non-empty and unpickle through the restricted loader, and every byte range it points
at must lie inside an existing file of the folder. A checkpoint saved before manifests existed is inspected
the same way without digests (``Inspection.verified`` is False: the caller warns), and its stored zip
records are checked against their CRC-32 instead (``_check_records``). ``inspect`` also checks the sizes
``.metadata`` declares against what the folder stores (``_bounds.check_declared``) before any reader
allocates them.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from hyper_parallel.components.checkpoint._bounds import check_declared, chunk_bytes
from hyper_parallel.components.checkpoint._manifest import UnreadableCheckpointError, verify_files

__all__ = [
    "Inspection",
    "RefusedContentError",
    "SafePlanner",
    "SafeReader",
    "UnreadableCheckpointError",
    "inspect",
    "read_metadata",
    "unreadable",
]

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_DCP_FILESYSTEM = "torch.distributed.checkpoint.filesystem"

#: The globals a DCP ``.metadata`` pickle may name, by module (torch 2.13's Metadata and what it holds).
_ALLOWED: dict[str, frozenset[str]] = {
    _DCP_METADATA: frozenset(
        {
            "Metadata",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    _DCP_FILESYSTEM: frozenset({"_StorageInfo", "_StoragePrefix"}),
    "torch": frozenset({"Size"}),  # and every torch.dtype, checked by value in find_class
    "torch.serialization": frozenset({"_get_layout"}),  # how a torch.layout pickles (a lookup by name)
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class RefusedContentError(UnreadableCheckpointError):
    """A checkpoint file holds something other than data this package reads (a pickled global, an object)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``Metadata`` and nothing else (see ``_ALLOWED``)."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise RefusedContentError(
            f"{self._path}: refused to unpickle global {module}.{name}: a checkpoint's .metadata may "
            "only hold torch.distributed.checkpoint metadata"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedContentError(f"{self._path}: refused a persistent id in a checkpoint's .metadata")


def read_metadata(path: Path) -> Metadata:
    """The DCP ``Metadata`` of the file ``path``, read with the restricted unpickler.

    Raises ``RefusedContentError`` for a global outside DCP's metadata classes, and
    ``UnreadableCheckpointError`` naming the file when it is empty, truncated or not a DCP metadata pickle.
    """
    with open(path, "rb") as stream:
        try:
            metadata = _MetadataUnpickler(stream, path).load()  # type: ignore[arg-type]
        except RefusedContentError:
            raise
        except Exception as exc:  # EOFError, UnpicklingError, ... from an empty or truncated file
            raise UnreadableCheckpointError(
                f"{path}: not a readable DCP .metadata file ({type(exc).__name__}: {exc})"
            ) from None
    if not isinstance(metadata, Metadata):
        raise UnreadableCheckpointError(
            f"{path}: not a DCP .metadata file (it holds a {type(metadata).__name__})"
        )
    return metadata


def unreadable(folder: Path, exc: BaseException) -> UnreadableCheckpointError:
    """A DCP load of ``folder`` that failed otherwise than through our reader (its ``.metadata`` gone
    while read, a plan that does not fit) as the error every reader falls back on, naming the folder."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    lines = str(exc).strip().splitlines()
    return UnreadableCheckpointError(
        f"{folder}: cannot be read ({type(exc).__name__}: {lines[-1][:300] if lines else ''})"
    )


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose ``read_metadata`` runs no code from the folder (``read_metadata``).

    ``read_data`` reads file by file, so a chunk that fails to load (one that is a pickle torch's
    ``weights_only`` loader refuses, bytes that are not a saved tensor, a file gone) is an
    ``UnreadableCheckpointError`` naming its file: the loaders then fall back to an older step as they do
    for a step that fails ``inspect``.
    """

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for relative, items in per_file.items():
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except UnreadableCheckpointError:
                raise
            except Exception as exc:  # MemoryError, RecursionError, UnpicklingError, OSError, ...
                raise UnreadableCheckpointError(
                    f"{Path(self.path) / relative}: cannot be read ({type(exc).__name__}: {_why(exc)})"
                ) from None
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _why(exc: BaseException) -> str:
    """The first line of ``exc``, short; what a refused pickle or a file cut short is, said plainly.

    torch's own message goes on to advise loading with ``weights_only=False``: the one thing a file that
    may be hostile must never be given, so it is not repeated.
    """
    if isinstance(exc, pickle.UnpicklingError):
        return "a pickle that is not a saved tensor, refused by torch's weights-only loader"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not first and isinstance(exc, EOFError):  # a file cut after it was listed and inspected
        return "the file ends inside the data .metadata points at (truncated)"
    return first.split(". ")[0][:200]  # the first sentence: torch's further ones are advice, cut mid-way


#: Most values a pickled item may hold, counted as the tree a walk of it visits: a container referred to
#: twice counts twice (a list that holds itself 40 times over is a 2^40-node tree). The optimizer's
#: hyperparameters of a large model (its ``param_names``, ``params``) are a few thousand values.
MAX_PLAIN_NODES = 1_000_000
#: Deepest nesting of containers accepted in a pickled item (the JSON readers' bound).
MAX_PLAIN_DEPTH = 100


class _NotPlain(Exception):
    """Why a pickled item is refused (``SafePlanner.load_bytes`` adds the file and the item)."""


def _plain_nodes(value: Any, memo: dict[int, int | None], depth: int = 0) -> int:
    """The nodes of ``value`` as a tree, when it is plain data (None, a bool, number or string, lists,
    tuples and dicts of them); raises ``_NotPlain`` otherwise, or beyond ``MAX_PLAIN_NODES`` or
    ``MAX_PLAIN_DEPTH``.

    Each container is walked once, keyed on its identity (``memo``: id -> its tree size, None while it is
    being walked): a shared part costs one visit however often it is referred to, its size is counted
    each time, and a container inside itself is a cycle. The work is the pickle's own size.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return 1
    key = id(value)
    if key in memo:
        known = memo[key]
        if known is None:
            raise _NotPlain("a container that holds itself (a cycle)")
        return known
    if depth >= MAX_PLAIN_DEPTH:
        raise _NotPlain(f"containers nested more than {MAX_PLAIN_DEPTH} deep (MAX_PLAIN_DEPTH)")
    if isinstance(value, (list, tuple)):
        children: list[Any] = list(value)
    elif isinstance(value, dict):
        if not all(isinstance(k, (str, int)) for k in value):
            raise _NotPlain("a dict with keys other than strings and integers")
        children = [*value.keys(), *value.values()]
    else:
        raise _NotPlain(
            f"a {type(value).__name__}, where a checkpoint holds plain values (numbers, strings, lists and "
            "dicts of them)"
        )
    memo[key] = None
    total = 1
    for child in children:
        total += _plain_nodes(child, memo, depth + 1)
        if total > MAX_PLAIN_NODES:
            raise _NotPlain(
                f"more than {MAX_PLAIN_NODES:,} values once its shared parts are counted each time they are "
                "referred to (MAX_PLAIN_NODES)"
            )
    memo[key] = total
    return total


class SafePlanner(DefaultLoadPlanner):
    """A ``DefaultLoadPlanner`` reading non-tensor items with torch's restricted loader, as plain data only.

    Such items are the optimizer's hyperparameters (``param_groups``: numbers, flags, parameter names)
    and, in checkpoints of earlier versions, the JSON parts as strings.
    """

    def __init__(self, reader: SafeReader) -> None:
        super().__init__()
        self._reader = reader

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        file = Path(self._reader.path) / self._reader.storage_data[read_item.storage_index].relative_path
        try:
            loaded = torch.load(value, weights_only=True)
        except Exception as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise RefusedContentError(f"{file}: refused item {fqn!r}: {first}") from None
        try:
            _plain_nodes(loaded, {})
        except _NotPlain as exc:
            raise RefusedContentError(f"{file}: refused item {fqn!r}: {exc}") from None
        # DefaultLoadPlanner places the item (in the nested state dict it flattened); it unpickles what it
        # is given without restriction, so it is given only the plain value checked above, pickled again.
        plain = io.BytesIO()
        torch.save(loaded, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)


@attrs.frozen
class Inspection:
    """A checkpoint that passed ``inspect``: its DCP metadata, and whether a manifest verified its files."""

    metadata: Metadata
    verified: bool


def inspect(folder: Path, *, digests: bool = True) -> Inspection:
    """Check ``folder`` before loading it; raises ``UnreadableCheckpointError`` naming the first bad file.

    ``digests`` False checks sizes but skips hashing (ranks other than 0 do, rank 0 hashes for them).
    """
    verified = verify_files(folder, digests=digests)
    meta_path = folder / ".metadata"
    if not meta_path.is_file():
        raise UnreadableCheckpointError(f"{meta_path}: missing")
    if meta_path.stat().st_size == 0:
        raise UnreadableCheckpointError(f"{meta_path}: empty")
    metadata = read_metadata(meta_path)
    check_declared(meta_path, metadata)
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        relative = getattr(info, "relative_path", None)
        if not isinstance(relative, str):
            continue
        if not relative or "/" in relative or "\\" in relative or relative in (".", ".."):
            raise UnreadableCheckpointError(f"{meta_path}: names a file outside its folder: {relative!r}")
        if relative not in sizes:
            shard = folder / relative
            if not shard.is_file():
                raise UnreadableCheckpointError(f"{shard}: missing (named by .metadata)")
            sizes[relative] = shard.stat().st_size
        if int(info.offset) + int(info.length) > sizes[relative]:
            raise UnreadableCheckpointError(
                f"{folder / relative}: truncated ({sizes[relative]} bytes, .metadata reads up to "
                f"{int(info.offset) + int(info.length)})"
            )
    _check_records(folder, metadata, crc=not verified and digests)
    return Inspection(metadata=metadata, verified=verified)


class _Slice(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file, as a seekable file of their own."""

    def __init__(self, stream: io.BufferedReader, start: int, length: int) -> None:
        super().__init__()
        self._stream, self._start, self._length, self._at = stream, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._length}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        size = max(0, min(len(buffer), self._length - self._at))
        self._stream.seek(self._start + self._at)
        data = self._stream.read(size)
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)


#: How a zip (what ``torch.save`` writes for each item) begins: an item that does is read as one by torch.
_ZIP_MAGIC = b"PK\x03\x04"


def _check_records(folder: Path, metadata: Metadata, *, crc: bool) -> None:
    """Every stored item's zip records: stored, not compressed, and no larger than the item's data; with
    ``crc`` (a step without a manifest) each record read once against its CRC-32.

    ``torch.save`` (how DCP stores each item) writes its records uncompressed, and torch's reader inflates
    a compressed one to the size its zip directory claims: a 1 MB deflated chunk became 1 GiB in memory,
    and the chunk's narrowed zeros loaded silently. A record's size is therefore checked here, from the
    zip's directory alone (bounded: ``_bounds`` caps each item's stored bytes near its chunk's), before
    torch reads it: the data records (``.../data/N``) may hold at most the chunk's bytes. An item that is
    no zip at all is left to the reader (torch's ``weights_only`` loader refuses it).

    Without a manifest the records are also read against their CRC-32, which torch does not check when it
    reads them: a flipped byte in tensor data loaded silently. A record saved without a CRC
    (``torch.serialization.set_crc32_options(False)``: 0) is left to the reader.
    """
    limits = chunk_bytes(metadata)
    per_file: dict[str, list[tuple[Any, Any]]] = {}
    for index, info in (metadata.storage_data or {}).items():
        per_file.setdefault(info.relative_path, []).append((index, info))
    for relative, infos in per_file.items():
        path = folder / relative
        with open(path, "rb") as stream:
            for index, info in infos:
                stream.seek(info.offset)
                if stream.read(4) != _ZIP_MAGIC:
                    continue
                try:  # torch would read it as a zip: it must be one whose directory reads
                    archive = zipfile.ZipFile(_Slice(stream, info.offset, info.length))  # type: ignore[arg-type]
                except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
                    raise UnreadableCheckpointError(
                        f"{path}: item {index.fqn} at byte {info.offset}: not a readable zip ({exc})"
                    ) from None
                with archive:
                    _check_members(path, info, archive, limits.get(index, info.length), crc=crc)


def _check_members(path: Path, info: Any, archive: zipfile.ZipFile, limit: int, *, crc: bool) -> None:
    """``_check_records`` for the records of one item (``info`` its storage entry, ``limit`` its data's
    bytes)."""
    data = 0
    length = info.length
    for member in archive.infolist():
        name = member.filename
        where = f"{path}: record {name} at byte {info.offset}"
        if member.compress_type != zipfile.ZIP_STORED:
            raise UnreadableCheckpointError(
                f"{where} is compressed (method {member.compress_type}); torch.save stores "
                "its records, and a compressed one could expand past the bytes stored"
            )
        if member.file_size != member.compress_size or member.header_offset + member.file_size > length:
            raise UnreadableCheckpointError(
                f"{where} claims {member.file_size} bytes, more than its item stores ({length})"
            )
        if "/data/" in f"/{name}":
            data += member.file_size
            if data > limit:
                raise UnreadableCheckpointError(
                    f"{where}: the item's data records hold {data} bytes, more than its chunk's {limit}"
                )
        if not crc or member.CRC == 0:
            continue
        try:
            with archive.open(member) as record:
                while record.read(1 << 22):
                    pass
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise UnreadableCheckpointError(f"{where} is damaged ({exc})") from None
