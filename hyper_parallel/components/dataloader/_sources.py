"""Reading the documents of a ``jsonl``, ``text`` or ``python_docs`` dataset (part of ``DataLoader``).

- ``jsonl``: one JSON object per line, the document is ``obj[text_field]``; blank lines are skipped.
- ``text``: each file is one document.
- ``python_docs``: the docstrings of a fixed list of standard-library modules (``python_docs()``): about
  450 KB of English prose and code in some 1,600 documents, on every machine, without files or network.

A path may be a file or a directory (searched recursively, sorted: ``*.jsonl`` for ``jsonl``, ``*.txt``
for ``text``; hidden files and folders are skipped).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

# Unused here, but imported first on purpose: torch replaces some standard-library functions when it is
# imported (``inspect.getfile``, for one), and a replaced function is documented elsewhere, so without it
# ``python_docs()`` would depend on whether the caller had imported torch yet.
import torch  # noqa: F401

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import DatasetConfig

__all__ = ["python_docs", "read_documents"]

_SUFFIX = {"jsonl": ".jsonl", "text": ".txt"}


def _files(paths: Sequence[str], source: str) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.rglob(f"*{_SUFFIX[source]}")
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"dataset path {raw!r} is neither a file nor a directory")
    if not found:
        raise FileNotFoundError(f"no {_SUFFIX[source]} file under {list(paths)!r}")
    return found


# Pure-library modules whose import only defines names (no threads, no I/O, no GUI, no easter eggs),
# present in CPython 3.10-3.13. Their docstrings change a little between versions; their kind does not.
_PYTHON_DOCS_MODULES = (
    *("abc", "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv"),
    *("dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions", "functools"),
    *("gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "inspect", "io"),
    *("ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging", "math", "numbers"),
    *("operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "reprlib", "sched"),
    *("secrets", "selectors", "shlex", "shutil", "socket", "statistics", "string", "struct"),
    *("subprocess", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback"),
    *("types", "typing", "urllib.parse", "uuid", "warnings", "weakref", "zipfile", "zlib"),
)


def _documented(prefix: str, obj: object) -> Iterator[str]:
    doc = getattr(obj, "__doc__", None)
    if isinstance(doc, str) and doc.strip():
        yield f"{prefix}\n\n{inspect.cleandoc(doc)}\n"


def _defined_in(member: object, homes: set[str]) -> bool:
    """A method or property written in the class's own module: not one another library patched in.

    (transformers, for one, adds methods to ``logging.Logger``; methods of C types have no module.)
    """
    if isinstance(member, property):
        member = member.fget
    elif isinstance(member, (classmethod, staticmethod)):
        member = member.__func__
    if not inspect.isroutine(member):
        return False
    module = getattr(member, "__module__", None)
    return module is None or module in homes


def _module_docs(name: str) -> Iterator[str]:
    """The module's docstring, then each public class or function it defines, then their methods."""
    module = importlib.import_module(name)
    yield from _documented(name, module)
    homes = {name, f"_{name.rpartition('.')[2]}"}  # C accelerators report themselves as _name
    for attr in sorted(getattr(module, "__all__", None) or dir(module)):
        obj = getattr(module, attr, None)
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) not in homes:
            continue  # imported from elsewhere: documented there, if at all
        yield from _documented(f"{name}.{attr}", obj)
        if inspect.isclass(obj):
            for member, value in sorted(vars(obj).items()):
                if not member.startswith("_") and _defined_in(value, homes):
                    yield from _documented(f"{name}.{attr}.{member}", value)


@functools.cache
def python_docs() -> tuple[str, ...]:
    """Docstrings of the standard library, one document per module, class, function or method.

    Each document is its dotted name, a blank line and the cleaned docstring, in a fixed order (modules as
    listed, names sorted). Collected from the running interpreter, so nothing is read from disk beyond
    the imports (about 0.15 s when the modules are not imported yet) and nothing from the network. A
    module this interpreter lacks is skipped.
    """
    docs: list[str] = []
    for name in _PYTHON_DOCS_MODULES:
        try:
            docs.extend(_module_docs(name))
        except ImportError:
            continue
    return tuple(docs)


def read_documents(cfg: DatasetConfig) -> Iterator[str]:
    """The documents of a ``jsonl``, ``text`` or ``python_docs`` dataset, in file (or listed) order."""
    if cfg.source == "python_docs":
        yield from python_docs()
        return
    for file in _files(cfg.paths, cfg.source):
        if cfg.source == "text":
            yield file.read_text(encoding="utf-8")
            continue
        with file.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{file}:{number}: not a JSON object: {exc.msg}") from None
                if not isinstance(record, dict) or not isinstance(record.get(cfg.text_field), str):
                    raise ValueError(f"{file}:{number}: no string field {cfg.text_field!r}")
                yield record[cfg.text_field]
