"""What a test run leaves in the checkout: every file git would report, tracked, untracked or ignored.

The suite must leave no trace in the checkout (issue 35): runs, metrics, checkpoints and exports go to the
test's temporary folder. ``git status --porcelain`` alone cannot say so, because ``runs/`` and ``out/`` are
ignored and a file there that already existed would only grow; so the snapshot lists every file git reports
with ``--ignored --untracked-files=all`` and its size and modification time. Caches that importing or
running the tools writes (bytecode, pytest's, mypy's, ruff's) are not the run's output and are left out.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import ROOT

__all__ = ["checkout_snapshot"]

_CACHES = ("__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".egg-info")


def checkout_snapshot() -> dict[str, tuple[str, int, int]]:
    """Each reported path of the checkout with its git status code, size and modification time (ns)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the checkout is not a git repository")
    listed = subprocess.run(
        ["git", "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode("utf-8", "surrogateescape")
    snapshot: dict[str, tuple[str, int, int]] = {}
    for entry in filter(None, listed.split("\0")):
        code, path = entry[:2], entry[3:]
        if any(cache in path for cache in _CACHES):
            continue
        target = ROOT / path
        stat = target.stat() if target.exists() else None
        snapshot[path] = (code, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1)
    return snapshot
