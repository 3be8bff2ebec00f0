"""Reading the documents of a ``jsonl``, ``text`` or ``python_docs`` dataset (part of ``DataLoader``).

- ``jsonl``: one JSON object per line, the document is ``obj[text_field]``; blank lines are skipped.
- ``text``: each file is one document.
- ``python_docs``: the docstrings of a fixed list of standard-library modules (``python_docs()``): about
  450 KB of English prose and code in some 1,600 documents, on every machine, without files or network.

A path may be a file or a directory (searched recursively, sorted: ``*.jsonl`` for ``jsonl``, ``*.txt``
for ``text``; hidden files and folders are skipped). A file that is missing, not UTF-8, or (``jsonl``) holds a
line that is not a JSON object with the text field is an ``InputFileError`` (``FILE:LINE: problem``, exit
status 2); ``check_files`` looks at the first record of each file before anything is built (the first
``CHECKED_RECORDS`` conversations of an ``image_chat`` file, and their images' headers: ``_image_chat``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from hyper_parallel._json import loads
from hyper_parallel.errors import InputFileError, Issue

__all__ = [
    "CHECKED_RECORDS",
    "check_image_chat",
    "check_jsonl",
    "check_text",
    "image_chat_files",
    "jsonl_documents",
    "python_docs",
    "text_documents",
]

#: Conversations of each ``image_chat`` file that ``check_files`` parses, their images' headers read.
CHECKED_RECORDS = 16


def _files(paths: Sequence[str], suffix: str) -> list[Path]:
    """The files of ``paths``: each file, and the ``*suffix`` files under each folder (sorted)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.rglob(f"*{suffix}")
                    if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
                )
            )
        elif path.is_file():
            found.append(path)
        else:
            raise InputFileError.at(raw, "dataset path is neither a file nor a directory")
    if not found:
        raise InputFileError(
            Issue("", f"no {suffix} file under it (hidden files and folders are skipped)", raw)
            for raw in paths
        )
    return found


def _text(data: bytes, where: Path | str) -> str:
    """``data`` decoded as UTF-8, or an ``InputFileError`` at ``where`` naming the line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        message = f"not UTF-8 text: byte 0x{data[exc.start]:02x} at column {column}"
        raise InputFileError.at(f"{where}:{line}" if isinstance(where, Path) else where, message) from None


def _records(file: Path, text_field: str) -> Iterator[str]:
    """The documents of one ``jsonl`` file; a bad line is an ``InputFileError`` at ``FILE:LINE``."""
    with file.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            line = _text(raw, f"{file}:{number}")
            if not line.strip():
                continue
            try:
                record = loads(line)
            except json.JSONDecodeError as exc:
                message = f"not a JSON object: {exc.msg} at column {exc.colno}"
                raise InputFileError.at(f"{file}:{number}", message) from None
            if not isinstance(record, dict):
                raise InputFileError.at(f"{file}:{number}", "not a JSON object")
            if not isinstance(record.get(text_field), str):
                keys = ", ".join(repr(k) for k in sorted(record)[:8]) or "none"
                message = (
                    f"no string field {text_field!r} (the record's keys: {keys}); set "
                    "dataloader.dataset.text_field to the key holding the text"
                )
                raise InputFileError.at(f"{file}:{number}", message)
            yield record[text_field]


def check_jsonl(paths: Sequence[str], text_field: str) -> None:
    """Refuse, before anything is built, ``jsonl`` files that cannot be read as configured.

    Every path must exist (a folder must hold ``*.jsonl`` files), the first record of each file must be a
    JSON object with ``text_field``, and some file must hold a record: an ``InputFileError`` naming the
    file (``FILE:LINE``) otherwise. Later records are checked as they are read, with the same messages.
    """
    files = _files(paths, ".jsonl")
    empty: list[Path] = []
    for file in files:
        records = _records(file, text_field)
        try:
            if next(records, None) is None:
                empty.append(file)
        finally:
            records.close()  # type: ignore[attr-defined]
    if len(empty) == len(files):
        raise InputFileError(Issue("", "empty: no JSON record to train on", str(file)) for file in empty)


def check_text(paths: Sequence[str]) -> None:
    """Refuse missing paths, folders without ``*.txt`` files, and text files that are all empty."""
    files = _files(paths, ".txt")
    if all(file.stat().st_size == 0 for file in files):
        raise InputFileError(Issue("", "empty: no text to train on", str(file)) for file in files)


def image_chat_files(paths: Sequence[str]) -> list[Path]:
    """The JSON lines files of an ``image_chat`` dataset's paths (folders searched as for ``jsonl``)."""
    return _files(paths, ".jsonl")


def check_image_chat(paths: Sequence[str]) -> None:
    """The first ``CHECKED_RECORDS`` conversations of each file parse and their images can be opened."""
    _check_image_chat(image_chat_files(paths))


def _check_image_chat(files: list[Path]) -> None:
    """The first ``CHECKED_RECORDS`` conversations of each file parse and their images can be opened."""
    from hyper_parallel.components.dataloader._image_chat import read_records
    from hyper_parallel.models.qwen3_5.images import image_size

    empty: list[Path] = []
    for file in files:
        found = False
        for record in read_records(file, CHECKED_RECORDS):
            found = True
            for image in record.images:
                image_size(image, record.where)
        if not found:
            empty.append(file)
    if len(empty) == len(files):
        raise InputFileError(Issue("", "empty: no conversation to train on", str(file)) for file in empty)


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
    # Unused here, but imported first on purpose: torch replaces some standard-library functions when it
    # is imported (``inspect.getfile``, for one), and a replaced function is documented elsewhere, so
    # without it the documents would depend on whether the caller had imported torch yet. Imported here,
    # not at the top, so that ``check_files`` runs in a ``--dry-run``, which imports no torch.
    import torch  # noqa: F401

    docs: list[str] = []
    for name in _PYTHON_DOCS_MODULES:
        try:
            docs.extend(_module_docs(name))
        except ImportError:
            continue
    return tuple(docs)


def jsonl_documents(paths: Sequence[str], text_field: str) -> Iterator[str]:
    """The ``text_field`` of every record of the ``jsonl`` files of ``paths``, in file order (a record
    that is not a JSON object with that field is an ``InputFileError`` naming it: ``FILE:LINE``)."""
    for file in _files(paths, ".jsonl"):
        yield from _records(file, text_field)


def text_documents(paths: Sequence[str]) -> Iterator[str]:
    """Each ``*.txt`` file of ``paths`` as one document, in file order."""
    for file in _files(paths, ".txt"):
        yield _text(file.read_bytes(), file)
