"""Checksums of a checkpoint's files, written at publish and verified before a load (part of ``Checkpoint``).

A shard changed on disk (a flipped block, a truncated copy) would otherwise load silently into NaN
training and be saved again as the newest checkpoint. Rank 0 writes ``checksums.json`` (``MANIFEST``) into
the partial folder last, after every other file (DCP's ``.metadata``, the shards, ``config.yaml``) and
just before the rename that publishes it: ``{"version": 1, "algorithm": "sha256", "files": {name: {"size":
bytes, "sha256": hex}}}``. SHA-256 reads at about 1 GB/s on one core, a small fraction of writing the
same bytes.

``verify_files(folder)`` checks that the files the manifest lists exist with their sizes and digests
(no torch here: ``_layout`` writes manifests without it); ``_safe_read.inspect`` adds the checks of
``.metadata`` and is what every reader calls before loading.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hyper_parallel._json import loads

__all__ = ["MANIFEST", "UnreadableCheckpointError", "verify_files", "write_manifest"]

#: The checksum manifest in every checkpoint folder saved by this version.
MANIFEST = "checksums.json"
_VERSION = 1
_METADATA = ".metadata"
_BLOCK = 1 << 22
# Files a reader can do without: the run's config (``_layout.CONFIG_FILE``), which export reports missing
# on its own; when present it is verified like every other file.
_OPTIONAL = frozenset({"config.yaml"})


class UnreadableCheckpointError(ValueError):
    """A checkpoint file is missing, empty, truncated, changed or refused; the message starts with it."""


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """Write ``folder/checksums.json`` over every other file in ``folder`` (last, before publishing)."""
    files: dict[str, dict[str, Any]] = {}
    for child in sorted(folder.iterdir(), key=lambda p: p.name):
        if child.name != MANIFEST and child.is_file():
            files[child.name] = {"size": child.stat().st_size, "sha256": _digest(child)}
    text = json.dumps({"version": _VERSION, "algorithm": "sha256", "files": files}, indent=1) + "\n"
    with open(folder / MANIFEST, "w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())


def _manifest_files(folder: Path) -> dict[str, dict[str, Any]] | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("version") != _VERSION or not isinstance(files, dict):
            raise ValueError("unknown layout")
        for entry in files.values():
            int(entry["size"]), str(entry["sha256"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpointError(f"{path}: not a readable checksum manifest ({exc})") from None
    return files


def verify_files(folder: Path, *, digests: bool = True) -> bool:
    """Check the files ``folder``'s manifest lists; False when it has none (saved by an older version).

    Raises ``UnreadableCheckpointError`` naming the first file that is missing, of another size or (with
    ``digests``) of another SHA-256 than when it was saved, or an unreadable manifest.
    """
    files = _manifest_files(folder)
    if files is None:
        return False
    if _METADATA not in files:
        raise UnreadableCheckpointError(f"{folder / MANIFEST}: lists no {_METADATA}")
    for name, entry in files.items():
        path = folder / name
        if name in _OPTIONAL and not path.exists():
            continue
        if "/" in name or name in ("", ".", "..") or not path.is_file():
            raise UnreadableCheckpointError(f"{path}: missing (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry["size"]:
            raise UnreadableCheckpointError(f"{path}: {size} bytes, {entry['size']} when it was saved")
        if digests and _digest(path) != entry["sha256"]:
            raise UnreadableCheckpointError(
                f"{path}: checksum mismatch (its contents changed after the save)"
            )
    return True
