"""The base a checkpoint was trained on, recorded at save and compared wherever the base is built again.

A LoRA or QLoRA checkpoint leaves its frozen base out: resume, export and generate build it again from
``model.weights_path`` (or draw it from the run's seed). Nothing tied the adapters to the base they were
trained on: a base folder updated in place, or a ``config.yaml`` whose ``weights_path`` names another
model of the same architecture, changed what a resume trained and what an export published, without a word.
So every run with ``model.weights_path``, and every run that leaves its base out of its checkpoints, writes
``base.json`` (``BASE_FILE``) into each checkpoint (before the checksum manifest, which covers it):

- ``weights_path``: the folder as the run named it (for the message; the identity is the content);
- ``parameters``: the base's parameter count from the model's arguments (the preflight's), or null;
- ``files`` (a base read from ``weights_path``): for each safetensors file, its size, the SHA-256 of its
  header (tensor names, dtypes, shapes and offsets: 8 bytes and the JSON header) and the SHA-256 of
  ``SAMPLES`` blocks of ``SAMPLE_BYTES`` at evenly spaced offsets of its data (``sampled_sha256``);
- ``seed`` (a base drawn at random): the seed every parameter is drawn from.

The identity is computed once per launch, when the base is loaded, from at most ``MAX_HEADER_BYTES`` and
256 KiB per file: about 2 ms for a 1B-parameter model's single 2.5 GB file (a header of 146 tensors, about
15 KB), where the SHA-256 of the whole file would read 2.5 GB. The header digest tells another model or
a re-saved file; the sampled digest tells another model of the same architecture and a base trained
further in place (every weight moves). A change confined to the bytes between the samples (one tensor
edited by hand) is not seen: compare the files' ``sha256sum`` when that matters.

``changes(saved, current)`` says what differs, in words; the readers refuse a differing base naming the
step's ``base.json`` and the folder, unless told to accept it (``checkpoint.accept_changed_base`` on
resume, ``--accept-changed-base`` for export and generate). A checkpoint saved before this record existed
holds none and is read as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hyper_parallel._json import loads
from hyper_parallel.errors import InputFileError

__all__ = ["BASE_FILE", "SAMPLES", "SAMPLE_BYTES", "base_identity", "changes", "read_record", "record_text"]

#: The record's file name in a step folder.
BASE_FILE = "base.json"
#: Blocks of each file's data hashed into ``sampled_sha256``, and their size in bytes.
SAMPLES = 64
SAMPLE_BYTES = 4096
#: Largest ``base.json`` read (a record lists a few hundred files at most).
_MAX_RECORD_BYTES = 1 << 20


def _file_identity(file: Path) -> dict[str, Any]:
    """Size, header digest and sampled data digest of one safetensors file (bounded reads)."""
    from hyper_parallel.models import MAX_HEADER_BYTES

    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 <= length <= min(MAX_HEADER_BYTES, size - 8):
                raise InputFileError.at(file, f"not a safetensors file: its header claims {length} bytes")
            header = hashlib.sha256(head + handle.read(length))
            start, data = 8 + length, size - 8 - length
            sampled = hashlib.sha256()
            if data <= SAMPLES * SAMPLE_BYTES:
                sampled.update(handle.read(data))
            else:
                step = (data - SAMPLE_BYTES) // (SAMPLES - 1)
                for i in range(SAMPLES):
                    handle.seek(start + i * step)
                    sampled.update(handle.read(SAMPLE_BYTES))
    except OSError as exc:
        raise InputFileError.at(file, f"cannot be read: {exc.strerror or exc}") from None
    return {"size": size, "header_sha256": header.hexdigest(), "sampled_sha256": sampled.hexdigest()}


def base_identity(weights_path: str | None, *, parameters: int | None, seed: int) -> dict[str, Any]:
    """The record of the base a run builds: from ``weights_path``'s files, or drawn from ``seed``.

    ``InputFileError`` naming a file that cannot be read as safetensors.
    """
    record: dict[str, Any] = {"version": 1, "weights_path": weights_path, "parameters": parameters}
    if weights_path is None:
        record["seed"] = seed
        return record
    from hyper_parallel.models import weight_files

    folder = Path(weights_path)
    record["files"] = {file.name: _file_identity(file) for file in weight_files(folder)}
    return record


def read_record(step: Path) -> dict[str, Any] | None:
    """The ``base.json`` of ``step``, or None when it holds none (saved before the record existed).

    ``InputFileError`` naming the file when it is not a record this version writes.
    """
    path = step / BASE_FILE
    if not path.exists():
        return None
    try:
        if not path.is_file() or path.stat().st_size > _MAX_RECORD_BYTES:
            raise ValueError(f"not a regular file of at most {_MAX_RECORD_BYTES} bytes")
        record = loads(path.read_bytes().decode("utf-8"))
        if not isinstance(record, dict) or record.get("version") != 1:
            raise ValueError("not a base record of version 1")
        files = record.get("files", {})
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise ValueError("its files are not a mapping of file records")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputFileError.at(path, f"not a readable base record ({exc})") from None
    return record


def changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between the ``saved`` record and the ``current`` base, in words (empty: the same)."""
    found: list[str] = []
    if saved.get("parameters") != current.get("parameters") and None not in (
        saved.get("parameters"),
        current.get("parameters"),
    ):
        found.append(f"{current['parameters']:,} parameters, {saved['parameters']:,} at save")
    was_drawn, is_drawn = "files" not in saved, "files" not in current
    if was_drawn != is_drawn:
        found.append(
            "drawn from the seed at save, read from a folder now"
            if was_drawn
            else f"read from {saved.get('weights_path')!r} at save, drawn from the seed now"
        )
        return found
    if is_drawn:
        if saved.get("seed") != current.get("seed"):
            found.append(f"drawn from seed {current.get('seed')}, {saved.get('seed')} at save")
        return found
    old, new = saved["files"], current["files"]
    for name in sorted(set(old) | set(new)):
        if name not in new:
            found.append(f"{name}: missing")
        elif name not in old:
            found.append(f"{name}: not there at save")
        elif old[name].get("header_sha256") != new[name]["header_sha256"]:
            found.append(f"{name}: its header differs (tensor names, dtypes, shapes or layout)")
        elif (old[name].get("size"), old[name].get("sampled_sha256")) != (
            new[name]["size"],
            new[name]["sampled_sha256"],
        ):
            found.append(f"{name}: its values differ")
    return found


def record_text(record: dict[str, Any]) -> str:
    """``record`` as the text of ``base.json``."""
    return json.dumps(record, indent=1, sort_keys=True) + "\n"
