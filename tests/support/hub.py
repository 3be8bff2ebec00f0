"""A Hugging Face Hub cache written by a test, in ``huggingface_hub``'s layout (no network)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

__all__ = ["COMMIT", "hub_cache"]

#: The commit every test repository is at.
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache: Path, repo: str, write: Callable[[Path], object]) -> Path:
    """``cache`` holding ``repo`` at ``COMMIT`` (its ``main``): ``write(folder)`` fills the snapshot folder.
    Returns the snapshot folder."""
    entry = cache / ("models--" + repo.replace("/", "--"))
    snapshot = entry / "snapshots" / COMMIT
    write(snapshot)
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / "main").write_text(COMMIT)
    return snapshot
