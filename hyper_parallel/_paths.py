"""What kind of thing a path we read names: a regular file (or a folder where one is expected), never a
FIFO, a socket or a device, told without waiting.

Opening a FIFO for reading blocks until a writer appears, and reading a device such as ``/dev/zero`` never
ends, so every file a command reads (metrics, ``plot``'s input, a chat template, the data, the tokenizer and
weights files the config names) is checked here first. :func:`open_regular` opens without blocking
(``O_NONBLOCK``) and checks the descriptor itself, so nothing can swap the file between the check and the
read; :func:`kind_problem` is the check on a path alone (``stat`` never blocks), for the launch's file
checks that only look. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["NotRegularFileError", "entry_kinds", "kind_problem", "open_regular", "read_regular"]


class NotRegularFileError(OSError):
    """A path that names a FIFO, a socket or a device where a file is read; its text is the phrase after
    ``PATH: `` (no errno, so :func:`hyper_parallel._disk.write_problem` says it as it is)."""


def _kind(mode: int) -> str | None:
    """What a non-regular ``st_mode`` is, in words; None for a regular file or a folder."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


def _phrase(kind: str) -> str:
    return f"is {kind}, not a regular file: give a file (it would be waited on or read forever)"


def kind_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (links followed) cannot be read as a file or folder, or None: missing paths are the
    caller's to report."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kind = _kind(mode)
    return None if kind is None else _phrase(kind)


def entry_kinds(folder: str | os.PathLike[str]) -> Iterator[str]:
    """``'PATH' is a FIFO, ...`` for each FIFO, socket or device among the entries of ``folder`` (the
    files a weights, tokenizer, data or checkpoint folder holds; not its subfolders): reading one would
    wait or never end, so it is refused before any is read. An unreadable folder yields nothing: its
    reader says why."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_file() or entry.is_dir():
                    continue
                problem = kind_problem(entry.path)  # None for a dangling link: its reader says
                if problem is not None:
                    yield f"{entry.path!r} {problem}"
    except OSError:
        return


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading in binary, refused at once (``NotRegularFileError``) unless it is a
    regular file; the descriptor is blocking again for the reads."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        kind = "a folder" if stat.S_ISDIR(mode) else _kind(mode)
        if kind is not None:
            raise NotRegularFileError(_phrase(kind) if kind != "a folder" else "is a folder, not a file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``ValueError`` beyond)."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return data
