"""Read the scalars an offline W&B run kept in its ``run-<id>.wandb`` file (no network, no wandb service).

The file is wandb's transaction log: a 7-byte header (``:W&B``, a magic number, a version), then
LevelDB-style records in 32 KiB blocks (each chunk: CRC-32, length, type FULL/FIRST/MIDDLE/LAST), each
record one ``wandb_internal_pb2.Record`` protobuf message; history records hold the logged scalars.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["logged_history", "run_names"]

_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log")
    position, pending = 7, b""
    while position + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - position % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # the block's tail is padding
            position += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, position)
        chunk = data[position + _CHUNK_HEADER : position + _CHUNK_HEADER + length]
        position += _CHUNK_HEADER + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""
        else:  # zero padding at the end of the file
            break


def _messages(folder: Path, kind: str) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        for data in _records(path.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == kind:
                yield record


def run_names(folder: Path) -> list[tuple[str, str]]:
    """``(project, display name)`` of each offline run under ``folder``."""
    return [(record.run.project, record.run.display_name) for record in _messages(folder, "run")]


def logged_history(folder: Path) -> list[dict[str, Any]]:
    """Every history row (``{"_step": ..., "loss": ...}``) of each offline run under ``folder``."""
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in _messages(folder, "history")
    ]
