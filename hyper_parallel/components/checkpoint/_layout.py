"""The on-disk layout of a checkpoint folder: step folder names, discovery, atomic publish and pruning.

Part of ``Checkpoint``; file operations only (no torch, no collectives), run by rank 0. ``folder/step-<N>/``
holds one DCP checkpoint. A save writes into ``folder/.step-<N>.partial``; DCP's coordinator writes
``.metadata`` only after every rank has written its data, and rank 0 then renames the folder to
``step-<N>``. Only ``step-<N>`` folders holding ``.metadata`` count as complete: a kill mid-save leaves a
``.partial`` folder (or, from older layouts, a ``step-<N>`` folder without ``.metadata``); neither is ever
loaded, and rank 0 removes both when the manager starts.

Every published ``step-<N>`` folder also holds ``config.yaml`` (``CONFIG_FILE``), the resolved config of
the run that saved it, as the trainer dumped it, which ``hyper_parallel.export`` reads to rebuild the
model's Hugging Face layout, and, written last before the rename, ``checksums.json`` (``_manifest``): the
size and SHA-256 of every other file, verified before any load. A complete folder that fails that check is
skipped by the loaders, never deleted here.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from hyper_parallel.components.checkpoint._manifest import write_manifest

__all__ = ["CONFIG_FILE", "complete_steps", "partial_folder", "publish", "remove_incomplete", "step_folder"]

#: The resolved config a checkpoint was saved with, as YAML, in every ``step-<N>`` folder (when known).
CONFIG_FILE = "config.yaml"

_STEP_DIR = re.compile(r"step-(\d+)")
_PARTIAL_DIR = re.compile(r"\.step-(\d+)\.partial")

_log = logging.getLogger(__name__)


def step_folder(folder: Path, step: int) -> Path:
    """Where the published checkpoint of ``step`` lives."""
    return folder / f"step-{step}"


def partial_folder(folder: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is published."""
    return folder / f".step-{step}.partial"


def complete_steps(folder: str | Path) -> list[int]:
    """Steps with a complete (published) checkpoint in ``folder``, oldest first."""
    root = Path(folder)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / ".metadata").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def remove_incomplete(folder: Path) -> None:
    """Delete ``.step-N.partial`` folders and ``step-N`` folders without ``.metadata`` (half-written)."""
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        step_dir = _STEP_DIR.fullmatch(child.name) and not (child / ".metadata").is_file()
        if child.is_dir() and (step_dir or _PARTIAL_DIR.fullmatch(child.name)):
            _log.warning("removing incomplete checkpoint folder %s", child)
            shutil.rmtree(child, ignore_errors=True)


def publish(partial: Path, final: Path, *, keep_latest_k: int, config_yaml: str | None) -> None:
    """Rename a finished save (``.metadata`` written) to its step folder, then keep the newest ``k``.

    ``config_yaml`` (the run's config) is written into it first, then the checksum manifest;
    ``keep_latest_k`` 0 keeps every step. Only steps up to the one published count and are pruned: a
    newer step left from before a resume (one skipped as damaged, or past ``load_step``) is never why an
    intact older step is deleted; it is replaced when the run saves that step again.
    """
    if config_yaml is not None:
        (partial / CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
    write_manifest(partial)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep_latest_k > 0:
        published = int(_STEP_DIR.fullmatch(final.name).group(1))  # type: ignore[union-attr]
        reached = [step for step in complete_steps(final.parent) if step <= published]
        for old in reached[:-keep_latest_k]:
            shutil.rmtree(step_folder(final.parent, old), ignore_errors=True)
