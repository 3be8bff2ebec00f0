"""Real text for ``bench gpu --check``'s packed rows: the Python standard library's own source files.

The synthetic rows train on random tokens, one document a row, so attention is plain causal; a user's run
packs documents of varied lengths into each row, and document masking then takes another kernel
(FlexAttention's block mask in compiled blocks, one causal call per document in eager CUDA runs). The
packed rows measure that figure on real text, prepared as users prepare theirs: ``python -m
hyper_parallel.data prepare FILE... --format text`` (each file one document) with the GPU config's own
tokenizer, then the trainer's command line pointed at the folder with document masking on.

Why the standard library: the device machine has no network and the GPU configs' tokenizer is the byte
tokenizer (no files), so the text must be on the machine already; every Python carries its standard
library, real code and prose (docstrings, comments) in files of every length, read here in a fixed order.
Which files (:func:`chosen_files`): every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, outside
``site-packages`` and test folders, sorted by path, that is UTF-8 and between 1/16 of a row and a whole
row in bytes (the byte tokenizer makes one token of each byte, plus BOS and EOS). The bounds make rows of
several documents: a row of 4,096 tokens holds some 3 of them (on CPython 3.11: 238 files, 1,825 tokens
on average; 3.2 documents a row over 20 logged steps of batch 2), about what a subword tokenizer makes of
short web pages at that length, where the whole
library (median file 7 KB) would give mostly windows of one long file, and files under 1/16 of a row
are mostly empty ``__init__.py`` files. The set depends on the Python version: each row records its
files, documents and mean length (:func:`describe`).
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["KIND", "chosen_files", "describe", "documents_per_row", "prepare_command", "training_overrides"]

#: What the packed rows train on, as check.json and the table name it.
KIND = "python stdlib source files"
#: Folders of the standard library left out: third-party packages and the test suites (some of whose
#: files are deliberately not UTF-8 or not Python).
_SKIPPED = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def chosen_files(seq_len: int, root: Path | None = None) -> list[Path]:
    """The standard library's source files whose size is between ``seq_len // 16`` and ``seq_len``
    bytes (the module docstring says why), UTF-8 only, sorted by their path under ``root`` (default: this
    interpreter's standard library)."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    low = seq_len // 16
    chosen = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if _SKIPPED.intersection(path.relative_to(root).parts) or not path.is_file():
            continue
        if not low <= path.stat().st_size <= seq_len:
            continue
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue  # prepare would refuse it (exit 2)
        chosen.append(path)
    return chosen


def prepare_command(files: Sequence[Path], output: Path, config: Path) -> list[str]:
    """The command line that prepares ``files`` (each one document) into ``output`` with ``config``'s
    tokenizer: ``python -m hyper_parallel.data prepare``, as a user runs it."""
    return [sys.executable, "-m", "hyper_parallel.data", "prepare", *map(str, files), "--format", "text",
            "--output", str(output), "--config-file", str(config)]  # fmt: skip


def training_overrides(folder: Path) -> dict[str, str]:
    """The trainer's override that reads the prepared ``folder`` packed, with document masking on
    (the whole dataset section: the GPU configs' synthetic fields are no field of a prepared source)."""
    dataset = {
        "source": "tokenized",
        "paths": [str(folder)],
        "pack_sequences": True,
        "document_masking": True,
    }
    return {"dataloader.dataset": json.dumps(dataset)}  # JSON is YAML's flow style


def describe(folder: Path, files: Sequence[Path]) -> dict[str, Any]:
    """What a packed row trained on, from the prepared folder's manifest: the kind, the files chosen, the
    documents and tokens prepared and the mean document length in tokens (BOS and EOS included)."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    documents, tokens = int(manifest["documents"]), int(manifest["tokens"])
    return {
        "kind": KIND,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "files": len(files),
        "documents": documents,
        "tokens": tokens,
        "mean_tokens": tokens / documents if documents else None,
    }


def documents_per_row(records: Iterable[dict[str, Any]]) -> float | None:
    """The mean of the trainer's ``documents_per_row`` over its logged steps (each the mean of that
    step's rows), None when no record carries it."""
    found = [r["documents_per_row"] for r in records if "documents_per_row" in r]
    return sum(found) / len(found) if found else None
