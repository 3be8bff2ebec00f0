"""Ranks agree or stop: the resolved config and the checkpoint step each rank sees, compared at start-up.

Every rank resolves its own config (``${env:RANK}`` in a file, per-node environments) and reads its own view
of the checkpoint folder (node-local disks), so nothing guarantees they match; ranks that differ would wait on
each other's collectives until a timeout, or diverge silently (another seed). Right after the process group
starts, the ranks gather a SHA-256 of their dumped config (a fixed 32-byte tensor); only when the digests
differ do they gather the YAML itself (length-prefixed bytes, read back with ``yaml.safe_load``: nothing is
unpickled) to name the differing fields. Every rank computes the same message from the same gathered data,
so every rank stops at once with the same error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from hyper_parallel.parallel.process_group import all_gather_bytes

__all__ = ["config_disagreement", "step_disagreement"]

#: Fields shown in a message before "and N more".
_SHOWN = 8


def config_disagreement(config_yaml: str) -> str | None:
    """Why the ranks' resolved configs differ (the fields and each rank's value), or None when they agree."""
    digest = hashlib.sha256(config_yaml.encode()).digest()
    if len(set(all_gather_bytes(digest))) == 1:
        return None
    documents = [yaml.safe_load(text.decode()) for text in all_gather_bytes(config_yaml.encode())]
    leaves = [_leaves(document) for document in documents]
    paths = sorted({path for leaf in leaves for path in leaf})
    differing = [path for path in paths if len({_shown(leaf.get(path, _MISSING)) for leaf in leaves}) > 1]
    parts = []
    for path in differing[:_SHOWN]:
        values = ", ".join(
            f"rank {rank}: {_shown(leaf.get(path, _MISSING))}" for rank, leaf in enumerate(leaves)
        )
        parts.append(f"{path} ({values})")
    more = f" and {len(differing) - _SHOWN} more" if len(differing) > _SHOWN else ""
    return (
        f"the ranks resolved different configs: {'; '.join(parts)}{more}; every rank must resolve the same "
        "config (check ${env:...} interpolations and files that differ between nodes)"
    )


def step_disagreement(latest_step: int | None, folder: str) -> str | None:
    """Why the ranks see different newest checkpoints in ``folder``, or None when they see the same one."""
    seen = [json.loads(data) for data in all_gather_bytes(json.dumps(latest_step).encode())]
    if len(set(seen)) == 1:
        return None
    views = ", ".join(
        f"rank {rank}: {'no checkpoint' if step is None else f'step {step}'}"
        for rank, step in enumerate(seen)
    )
    return (
        f"checkpoint.folder {folder!r}: the ranks see different newest checkpoints ({views}); every rank "
        "must see the same folder (a shared file system, not node-local disks)"
    )


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING = _Missing()


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a YAML document by dotted path (``a.b``, ``a.list[0]``); an empty mapping is a leaf."""
    if isinstance(node, dict) and node:
        found: dict[str, Any] = {}
        for key, value in node.items():
            found.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return found
    if isinstance(node, list) and node:
        found = {}
        for index, value in enumerate(node):
            found.update(_leaves(value, f"{prefix}[{index}]"))
        return found
    return {prefix or "$": node}


def _shown(value: Any) -> str:
    if isinstance(value, _Missing):
        return repr(value)
    return json.dumps(value, default=str)
