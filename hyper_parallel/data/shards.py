"""The prepared-corpus format: token shards and their manifest, written by ``prepare`` and read by training.

One module owns the format so that the writer (``python -m hyper_parallel.data prepare``) and the reader
(the data loader's ``tokenized`` source) cannot drift apart. A prepared folder holds::

    manifest.json              written last: its presence means the folder is complete
    shard-00000/tokens.npy     token ids of the shard's documents, concatenated (uint16, or uint32)
    shard-00000/offsets.npy    int64, documents + 1 entries: document d is tokens[offsets[d]:offsets[d+1]]
    shard-00000/appended.npy   uint8 per document: 1 where prepare appended the EOS packing needs
    shard-00000/mask.npy       uint8 per token, chat data only: 1 on the tokens trained on (labels)
    shard-00000/records.npy    int64, 2 per document, chat data only: the input (its index in the
                               manifest's inputs) and line (a Parquet row) of the record it comes from

Every array is a plain ``.npy`` file, read with ``numpy.load(mmap_mode="r", allow_pickle=False)``: nothing
is loaded into memory until a sample touches it, and nothing read can run code. A document is stored as the
tokenizer encodes it, plus the EOS that packing separates documents with when the encoding does not end
with one (``appended`` says where, so unpacked samples can leave it out again): the packed stream of a
corpus is its shards' ``tokens`` end to end, exactly what the in-memory sources pack. ``records`` lets a
check name a conversation (one longer than ``seq_len``) as ``FILE:LINE``; folders prepared before it was
written are read as well (their conversations are named by folder and document number).

A shard is written under a temporary name and renamed into place when complete, so an interrupted prepare
keeps every finished shard; the manifest records each file's size and SHA-256 (and a quick digest of its
first and last MiB, which training checks at start-up without reading the whole corpus). For chat data it
also records how many tokens carry a label (``label_tokens``): a corpus with none is refused at launch,
and for a folder prepared before the count was recorded it is counted from the masks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from hyper_parallel._json import loads

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "SHARD_ENTRY",
    "PreparedCorpus",
    "PreparedError",
    "ShardArrays",
    "file_digest",
    "finished_shard",
    "open_prepared",
    "read_manifest",
    "record_where",
    "shard_name",
    "token_dtype",
    "tokenizer_fingerprint",
    "verify",
    "write_manifest",
    "write_shard",
]

FORMAT = "hyper_parallel.tokens"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: Each finished shard's manifest entry, inside its folder: what a resumed prepare keeps.
SHARD_ENTRY = "shard.json"

#: Bytes hashed at each end of a file for the quick digest checked at start-up.
_QUICK_BYTES = 1 << 20
#: Offsets checked at a time when a shard is opened.
_OFFSETS_BLOCK = 1 << 20
#: Mask entries counted at a time (a memory-mapped mask is read in blocks: memory stays flat).
_MASK_BLOCK = 64 << 20


class PreparedError(ValueError):
    """A prepared folder (or a file in it) that cannot be trained on: ``where`` (a path) and ``problem``."""

    def __init__(self, where: object, problem: str) -> None:
        self.where, self.problem = str(where), problem
        super().__init__(f"{where}: {problem}")


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """``uint16`` when every id fits, else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def tokenizer_fingerprint(tokenizer: Any) -> tuple[str, dict[str, Any]]:
    """A digest of everything that decides a built tokenizer's ids, and the description it hashes.

    The class, the vocabulary size, the special ids, the bos/eos flags and, for a Hugging Face tokenizer,
    its whole serialized ``tokenizer.json`` (normalizer, pre-tokenizer, model, added tokens): two
    tokenizers with the same fingerprint encode every text to the same ids.
    """
    description: dict[str, Any] = {
        "class": type(tokenizer).__name__,
        "vocab_size": int(tokenizer.vocab_size),
        **{name: getattr(tokenizer, name, None) for name in ("bos_id", "eos_id", "pad_id")},
        "add_bos": bool(getattr(tokenizer, "add_bos", False)),
        "add_eos": bool(getattr(tokenizer, "add_eos", False)),
    }
    inner = getattr(tokenizer, "_tok", None)
    if inner is not None:
        description["tokenizer_json_sha256"] = hashlib.sha256(inner.to_str().encode("utf-8")).hexdigest()
    text = json.dumps(description, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], description


def file_digest(path: Path) -> str:
    """SHA-256 of a whole file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _quick_digest(path: Path, size: int) -> str:
    """SHA-256 of the first and last MiB of a file (all of it when smaller), with its size."""
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_QUICK_BYTES))
        if size > _QUICK_BYTES:
            handle.seek(max(size - _QUICK_BYTES, _QUICK_BYTES))
            digest.update(handle.read())
    return digest.hexdigest()


@attrs.frozen
class ShardArrays:
    """The arrays of one shard in memory (as ``prepare`` builds them) or memory-mapped (as training reads)."""

    tokens: npt.NDArray[Any]
    offsets: npt.NDArray[np.int64]
    appended: npt.NDArray[np.uint8]
    mask: npt.NDArray[np.uint8] | None = None
    #: ``(input index, line)`` of each document's record, interleaved (chat data; None before it existed).
    records: npt.NDArray[np.int64] | None = None

    @property
    def documents(self) -> int:
        """Number of documents."""
        return int(self.offsets.shape[0]) - 1


#: A shard's files, one ``KEY.npy`` per array: ``ShardArrays``' fields.
_ARRAYS = tuple(field.name for field in attrs.fields(ShardArrays))


def write_shard(
    folder: Path, name: str, arrays: ShardArrays, notes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Write shard ``name`` of ``folder`` atomically (a temporary folder renamed); its manifest entry.

    The entry lists the shard's documents and tokens (and label tokens, with a mask), each file's size,
    SHA-256 and quick digest, and ``notes`` (what the writer counted, kept with a resumed shard).
    """
    final, temporary = folder / name, folder / f".{name}.tmp"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir(parents=True)
    files: dict[str, dict[str, Any]] = {}
    try:
        for key in _ARRAYS:
            array = getattr(arrays, key)
            if array is None:
                continue
            path = temporary / f"{key}.npy"
            with path.open("wb") as handle:
                np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
                handle.flush()
                os.fsync(handle.fileno())
            size = path.stat().st_size
            files[key] = {"size": size, "sha256": file_digest(path), "quick": _quick_digest(path, size)}
        entry = {
            **(notes or {}),
            "name": name,
            "documents": arrays.documents,
            "tokens": int(arrays.tokens.shape[0]),
            "files": files,
        }
        if arrays.mask is not None:
            entry["label_tokens"] = _nonzero(arrays.mask)
        (temporary / SHARD_ENTRY).write_text(json.dumps(entry, sort_keys=True) + "\n", encoding="utf-8")
    except OSError:  # a full disk: give back what the half-written shard holds
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    os.replace(temporary, final)
    return entry


def finished_shard(folder: Path, name: str) -> dict[str, Any] | None:
    """The manifest entry of shard ``name`` when an earlier prepare finished writing it, else None."""
    path = folder / name / SHARD_ENTRY
    if not path.is_file():
        return None
    try:
        entry = loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return entry if isinstance(entry, dict) and entry.get("name") == name else None


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest.json`` last and atomically: a folder with a manifest is a complete corpus."""
    temporary = folder / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, folder / MANIFEST)


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of a prepared folder, checked for this format and version."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise PreparedError(folder, "not a folder (prepare one with python -m hyper_parallel.data prepare)")
    if not path.is_file():
        raise PreparedError(
            path,
            f"missing: {folder} is not a prepared corpus, or its prepare did not finish (run "
            "python -m hyper_parallel.data prepare again to complete it)",
        )
    if path.stat().st_size > 64 << 20:
        raise PreparedError(path, "larger than 64 MiB, not a manifest")
    try:
        manifest = loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreparedError(path, f"not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PreparedError(path, f"not a {FORMAT} manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise PreparedError(
            path,
            f"format version {manifest.get('version')!r}, this release reads version "
            f"{FORMAT_VERSION}: prepare the corpus again",
        )
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise PreparedError(path, f"not a valid manifest: {problem}")
    return manifest


_SHARD_NAME = re.compile(r"shard-\d{5,}")


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """What makes a manifest of the right format and version unusable, or None (nothing in it trusted).

    The token dtype must be one ``prepare`` writes; every shard entry must name a folder ``shard-NNNNN``
    of the prepared folder (never a path elsewhere), carry non-negative counts and the files entries of
    the arrays a shard has; the totals must be the sums of the shards' counts.
    """
    if manifest.get("dtype") not in ("uint16", "uint32"):
        return f"token dtype {str(manifest.get('dtype'))[:40]!r} (prepare writes uint16 or uint32)"
    recorded = manifest.get("tokenizer")
    if not (isinstance(recorded, dict) and isinstance(recorded.get("fingerprint"), str)):
        return "'tokenizer' is not an object with a string 'fingerprint' (the tokenizer it was prepared with)"
    entries = manifest.get("shards")
    if not isinstance(entries, list):
        return "'shards' is not a list"
    documents = tokens = 0
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            return f"shard entry {number} is not an object"
        name = entry.get("name")
        if not isinstance(name, str) or not _SHARD_NAME.fullmatch(name):
            return f"shard entry {number} names {str(name)[:60]!r}, not a shard-NNNNN folder of its own"
        if not (_count(entry.get("documents")) and _count(entry.get("tokens"))):
            return f"shard {name}: its documents and tokens are not non-negative integers"
        if "label_tokens" in entry and not _count(entry["label_tokens"]):
            return f"shard {name}: its label_tokens is not a non-negative integer"
        files = entry.get("files")
        required = {"tokens", "offsets", "appended"}
        if not isinstance(files, dict) or not required <= set(files) <= set(_ARRAYS):
            return f"shard {name}: its files are not {sorted(required)} (and optionally mask, records)"
        for key, recorded in files.items():
            if not (
                isinstance(recorded, dict)
                and _count(recorded.get("size"))
                and isinstance(recorded.get("sha256"), str)
                and isinstance(recorded.get("quick"), str)
            ):
                return f"shard {name}: its {key} entry is not a size and digests"
        documents += entry["documents"]
        tokens += entry["tokens"]
    if manifest.get("documents") != documents or manifest.get("tokens") != tokens:
        said = f"{str(manifest.get('documents'))[:20]} documents, {str(manifest.get('tokens'))[:20]} tokens"
        return f"its totals ({said}) are not the sums of its shards' ({documents}, {tokens})"
    labels = manifest.get("label_tokens")
    if labels is not None and not (_count(labels) and labels <= tokens):
        return f"its label_tokens {str(labels)[:20]} is not a count of at most its {tokens} tokens"
    return None


@attrs.frozen
class PreparedCorpus:
    """A prepared folder opened for training: its manifest and its shards, memory-mapped."""

    folder: Path
    manifest: dict[str, Any]
    shards: tuple[ShardArrays, ...]

    @property
    def tokens(self) -> int:
        """Tokens of every shard together."""
        return int(self.manifest["tokens"])

    @property
    def documents(self) -> int:
        """Documents of every shard together."""
        return int(self.manifest["documents"])

    @property
    def chat(self) -> bool:
        """Whether the shards carry a label mask (chat data)."""
        return bool(self.manifest.get("chat"))

    @property
    def label_tokens(self) -> int | None:
        """Tokens that carry a label (chat data; None for text, where every token does): the manifest's
        count, or counted from the memory-mapped masks of a folder prepared before it was recorded."""
        if not self.chat:
            return None
        recorded = self.manifest.get("label_tokens")
        if recorded is not None:
            return int(recorded)
        return sum(_nonzero(shard.mask) for shard in self.shards if shard.mask is not None)


def _nonzero(mask: npt.NDArray[np.uint8]) -> int:
    """Non-zero entries of a mask, counted in blocks (a memory-mapped one is never read at once)."""
    return sum(
        int(np.count_nonzero(mask[start : start + _MASK_BLOCK]))
        for start in range(0, mask.shape[0], _MASK_BLOCK)
    )


def _load(path: Path, entry: Mapping[str, Any], dtype: np.dtype[Any] | None) -> npt.NDArray[Any]:
    size = path.stat().st_size if path.is_file() else None
    if size is None:
        raise PreparedError(path, "missing")
    if size != entry.get("size"):
        raise PreparedError(
            path, f"{size} bytes, the manifest says {entry.get('size')}: truncated or changed"
        )
    if _quick_digest(path, size) != entry.get("quick"):
        raise PreparedError(path, "its content differs from the manifest's checksum: changed")
    try:
        array: npt.NDArray[Any] = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise PreparedError(path, f"not a numpy array file ({exc})") from None
    if array.ndim != 1 or (dtype is not None and array.dtype != dtype):
        raise PreparedError(path, f"a {array.dtype} array of shape {array.shape}, expected 1-D {dtype}")
    return array


def open_prepared(
    folder: str | os.PathLike[str], *, tokenizer: tuple[str, dict[str, Any]] | None = None
) -> PreparedCorpus:
    """Open a prepared folder: the manifest, then each shard memory-mapped after cheap integrity checks.

    Every file must have the size the manifest records and the same quick digest (first and last MiB);
    ``tokenizer`` (the training tokenizer's ``tokenizer_fingerprint``) must equal the manifest's. Nothing
    else is read: the whole checksums are for ``python -m hyper_parallel.data verify``.
    """
    root = Path(folder)
    manifest = read_manifest(root)
    recorded = manifest.get("tokenizer", {})
    if tokenizer is not None and recorded.get("fingerprint") != tokenizer[0]:
        raise PreparedError(
            root / MANIFEST,
            f"prepared with tokenizer {recorded.get('fingerprint')} "
            f"({_describe(recorded.get('description'))}), "
            f"but the config's tokenizer is {tokenizer[0]} ({_describe(tokenizer[1])}): prepare the corpus "
            "again with this config, or train with the tokenizer it was prepared with",
        )
    dtype = np.dtype(str(manifest.get("dtype")))
    shards = []
    for entry in manifest.get("shards", []):
        files = entry.get("files", {})
        where = root / str(entry.get("name"))
        arrays = {
            key: _load(where / f"{key}.npy", files[key], dtype if key == "tokens" else None)
            for key in _ARRAYS
            if key in files
        }
        shard = ShardArrays(**arrays)  # (the manifest check made tokens, offsets and appended required)
        if shard.documents != entry.get("documents") or shard.tokens.shape[0] != entry.get("tokens"):
            raise PreparedError(where, "its arrays disagree with the manifest's counts")
        problem = _arrays_problem(shard)
        if problem is not None:
            raise PreparedError(where, problem)
        shards.append(shard)
    return PreparedCorpus(root, manifest, tuple(shards))


def _arrays_problem(shard: ShardArrays) -> str | None:
    """What makes a shard's arrays disagree with each other, or None (cheap: no pass over the tokens).

    The offsets must start at 0, end at the token count and never decrease (one pass over ``documents +
    1`` integers, a small fraction of the tokens); ``appended`` has one entry per document, ``mask`` one
    per token.
    """
    offsets, count = shard.offsets, int(shard.tokens.shape[0])
    if offsets.dtype.kind not in "iu" or offsets.shape[0] < 1:
        return f"offsets.npy is a {offsets.dtype} array of {offsets.shape[0]} entries"
    if int(offsets[0]) != 0 or int(offsets[-1]) != count:
        return f"offsets.npy runs from {int(offsets[0])} to {int(offsets[-1])}, the tokens from 0 to {count}"
    for start in range(0, offsets.shape[0] - 1, _OFFSETS_BLOCK):  # in blocks: memory stays flat
        block = np.asarray(offsets[start : start + _OFFSETS_BLOCK + 1])
        if bool((np.diff(block) < 0).any()):
            return "offsets.npy decreases somewhere: documents would overlap"
    if shard.appended.shape[0] != shard.documents:
        return f"appended.npy has {shard.appended.shape[0]} entries for {shard.documents} documents"
    if shard.mask is not None and shard.mask.shape[0] != count:
        return f"mask.npy has {shard.mask.shape[0]} entries for {count} tokens"
    if shard.records is not None and shard.records.shape[0] != 2 * shard.documents:
        return f"records.npy has {shard.records.shape[0]} entries for {shard.documents} documents (2 each)"
    return None


def _describe(description: object) -> str:
    if not isinstance(description, dict):
        return "unknown"
    keys = ("class", "vocab_size", "bos_id", "eos_id", "add_bos", "add_eos")
    return ", ".join(f"{key} {description[key]}" for key in keys if key in description)


def verify(folder: str | os.PathLike[str]) -> list[str]:
    """Every file of a prepared folder whose full SHA-256 differs from the manifest's (empty: all intact).

    An intact folder is then checked as training checks it (``open_prepared``: the manifest, each shard's
    sizes, arrays and offsets; a ``PreparedError`` on the first problem), and every token id against the
    vocabulary size the manifest records, which training checks only as each sample is read: a folder
    ``verify`` passes is one training takes (with the tokenizer it was prepared with).
    """
    root = Path(folder)
    manifest = read_manifest(root)
    bad = []
    for entry in manifest.get("shards", []):
        for key, recorded in entry.get("files", {}).items():
            path = root / str(entry["name"]) / f"{key}.npy"
            if not path.is_file() or file_digest(path) != recorded.get("sha256"):
                bad.append(str(path))
    if bad:
        return bad
    corpus = open_prepared(root)
    description = manifest["tokenizer"].get("description")
    vocab_size = description.get("vocab_size") if isinstance(description, dict) else None
    if type(vocab_size) is int:
        for entry, shard in zip(manifest["shards"], corpus.shards, strict=True):
            _check_ids(root / str(entry["name"]) / "tokens.npy", shard.tokens, vocab_size)
    return bad


def record_where(name: str, line: int) -> str:
    """Where a record of input ``name`` is: ``FILE:LINE``, or ``FILE: row N`` in a Parquet file."""
    return f"{name}: row {line}" if name.endswith(".parquet") else f"{name}:{line}"


def _check_ids(path: Path, tokens: npt.NDArray[Any], vocab_size: int) -> None:
    """Refuse the first token id of ``tokens`` (the file ``path``) at or above ``vocab_size``, in the
    words training uses, reading a block at a time (memory stays flat)."""
    for start in range(0, tokens.shape[0], _OFFSETS_BLOCK):
        block = np.asarray(tokens[start : start + _OFFSETS_BLOCK])
        outside = block >= vocab_size
        if bool(outside.any()):
            at = int(np.argmax(outside))
            raise PreparedError(
                path, f"offset {start + at}: token id {int(block[at])} >= vocab_size {vocab_size}"
            )


def shard_name(index: int) -> str:
    """The folder name of shard ``index``."""
    return f"shard-{index:05d}"
