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

One run per folder: the run's rank 0 holds ``folder/.lock`` (``LOCK_FILE``, ``fcntl.flock``, the holder's PID
and host written inside) from start to ``close()``; a second launch on the folder is refused at start
naming that PID. Rank 0 alone locks because rank 0 alone creates, publishes and prunes step folders (a
lock per node would make the nodes of one job refuse each other on a shared file system). Entries are
``lstat``-ed, never followed: a symbolic link named like a step, partial or lock entry is refused naming
it; a partial folder is created with ``os.mkdir`` (never through an existing entry) after a stale real
folder of that name is removed. The folder itself may be a symbolic link (it is the configured path).
These refusals are input errors (:class:`CheckpointFolderError`, an ``InputFileError``: exit status 2).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import stat
import weakref
from pathlib import Path

from hyper_parallel._disk import write_problem
from hyper_parallel.components.checkpoint._manifest import write_manifest
from hyper_parallel.errors import InputFileError

__all__ = [
    "CONFIG_FILE",
    "LOCK_FILE",
    "CheckpointFolderError",
    "FolderLock",
    "complete_steps",
    "discard_partial",
    "lock_folder",
    "make_partial",
    "partial_folder",
    "publish",
    "remove_incomplete",
    "step_folder",
    "step_of",
]

#: The resolved config a checkpoint was saved with, as YAML, in every ``step-<N>`` folder (when known).
CONFIG_FILE = "config.yaml"
#: The lock file of the run that uses the folder (holds ``"<pid> <host>"``).
LOCK_FILE = ".lock"
_FIELD = "checkpoint.folder"

_STEP_DIR = re.compile(r"step-(\d+)")
_PARTIAL_DIR = re.compile(r"\.step-(\d+)\.partial")

_log = logging.getLogger(__name__)


class CheckpointFolderError(InputFileError):
    """The checkpoint folder cannot be used: another run holds it, or an entry is a symbolic link.

    An input error (exit status 2); its one issue reads ``ENTRY: checkpoint.folder: PROBLEM``.
    """


def _folder_error(where: Path | str, message: str) -> CheckpointFolderError:
    return CheckpointFolderError.at(where, message, _FIELD)


class _Held:
    """One locked lock file of this process, shared by every manager of that folder in it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.users = path, fd, 0


#: Lock files this process holds, by the real path of their folder: managers of one folder built in one
#: process (a resumed run in a test, a trainer rebuilt in a notebook) share the lock; other processes are
#: refused.
_HELD: dict[str, _Held] = {}


def _release(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held.users -= 1
    if held.users > 0:
        return
    del _HELD[key]
    with contextlib.suppress(OSError):  # removed while still locked: a waiting launch sees another file
        if os.lstat(held.path).st_ino == os.fstat(held.fd).st_ino:
            os.unlink(held.path)
    os.close(held.fd)


class FolderLock:
    """This run's hold on a checkpoint folder's ``LOCK_FILE`` (``fcntl.flock``), until :meth:`release`.

    The last release in this process removes the lock file and unlocks; collecting the object releases
    it too, and the kernel drops the lock when the process ends (a killed run leaves a stale file that
    the next launch takes over).
    """

    def __init__(self, key: str) -> None:
        _HELD[key].users += 1
        self.path = _HELD[key].path
        self._finalizer = weakref.finalize(self, _release, key)

    def release(self) -> None:
        """Give up this hold (idempotent)."""
        self._finalizer()


def _refuse_link(entry: Path) -> None:
    """Refuse ``entry`` when it is a symbolic link (``lstat``: never followed)."""
    try:
        mode = entry.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise _folder_error(
            entry,
            f"{entry.name!r} is a symbolic link (to {os.readlink(entry)!r}); a checkpoint folder holds only "
            "real files and folders, so it is never followed: remove it",
        )


def lock_folder(folder: Path) -> FolderLock:
    """Create ``folder`` if needed and lock it for this run; refuses a folder another process holds.

    The lock file is opened without following a symbolic link; the holder's PID and host are written
    into it, and a refused launch names them.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _folder_error(folder, f"{str(folder)!r} exists and is not a directory") from None
    key = os.path.realpath(folder)
    if key not in _HELD:
        path = folder / LOCK_FILE
        _HELD[key] = _Held(path, _acquire(folder, path))
    return FolderLock(key)


def _acquire(folder: Path, path: Path) -> int:
    """The descriptor of ``path``, created if needed and exclusively locked, with this PID written."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                _refuse_link(path)
            raise _folder_error(path, f"cannot open the lock file: {write_problem(exc)}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode("utf-8", "replace").split()
            os.close(fd)
            who = "a process" if not holder else f"PID {holder[0]}" + "".join(f" on {h}" for h in holder[1:2])
            raise _folder_error(
                folder,
                f"in use by another run: {who} holds {str(path)!r}; wait for it to end or use another "
                "checkpoint.folder",
            ) from None
        try:
            same = os.lstat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its holder removed between our open and our lock: ours now
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    except OSError as exc:  # a full disk (ENOSPC), a quota
        os.close(fd)
        raise _folder_error(path, f"cannot write the lock file: {write_problem(exc)}") from None
    return fd


def step_folder(folder: Path, step: int) -> Path:
    """Where the published checkpoint of ``step`` lives."""
    return folder / f"step-{step}"


def step_of(path: Path) -> int | None:
    """The step a ``step-<N>`` folder holds (its name's N), or None for any other name."""
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def partial_folder(folder: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is published."""
    return folder / f".step-{step}.partial"


def _entries(root: Path) -> list[Path]:
    """The step, partial and lock entries of ``root``; refuses any of them that is a symbolic link."""
    entries = []
    for child in root.iterdir():
        if _STEP_DIR.fullmatch(child.name) or _PARTIAL_DIR.fullmatch(child.name) or child.name == LOCK_FILE:
            _refuse_link(child)
            entries.append(child)
    return entries


def complete_steps(folder: str | Path) -> list[int]:
    """Steps with a complete (published) checkpoint in ``folder``, oldest first.

    Raises :class:`CheckpointFolderError` when a step, partial or lock entry is a symbolic link.
    """
    root = Path(folder)
    if not root.is_dir():
        return []
    steps = []
    for child in _entries(root):
        step = step_of(child)
        if step is not None and child.is_dir() and (child / ".metadata").is_file():
            steps.append(step)
    return sorted(steps)


def remove_incomplete(folder: Path) -> None:
    """Delete ``.step-N.partial`` folders and ``step-N`` folders without ``.metadata`` (half-written).

    Refuses symbolic links among the entries first (:class:`CheckpointFolderError`); removes real folders.
    """
    if not folder.is_dir():
        return
    for child in _entries(folder):
        step_dir = _STEP_DIR.fullmatch(child.name) and not (child / ".metadata").is_file()
        if child.is_dir() and (step_dir or _PARTIAL_DIR.fullmatch(child.name)):
            _log.warning("removing incomplete checkpoint folder %s", child)
            shutil.rmtree(child, ignore_errors=True)


def discard_partial(partial: Path) -> None:
    """Remove the partial folder of a save that failed (a real folder only; a link is left alone)."""
    if not partial.is_symlink() and partial.is_dir():
        shutil.rmtree(partial, ignore_errors=True)


def make_partial(folder: Path, step: int) -> Path:
    """Create the partial folder of ``step`` exclusively and return it.

    A stale real folder of that name (a failed save of the same step) is removed first; a symbolic link
    is refused (:class:`CheckpointFolderError`), never followed or removed.
    """
    partial = partial_folder(folder, step)
    _refuse_link(partial)
    if partial.is_dir():
        shutil.rmtree(partial)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(partial)
    except FileExistsError:  # not a folder, or created under us: this run does not own the folder
        raise _folder_error(partial, f"{partial.name!r} exists and is not this save's folder") from None
    return partial


def publish(
    partial: Path,
    final: Path,
    *,
    keep_latest_k: int,
    config_yaml: str | None,
    extra: dict[str, str] | None = None,
) -> None:
    """Rename a finished save (``.metadata`` written) to its step folder, then keep the newest ``k``.

    ``config_yaml`` (the run's config) and ``extra`` (more files by name: the base record) are written
    into it first, then the checksum manifest;
    ``keep_latest_k`` 0 keeps every step. Only steps up to the one published count and are pruned: a
    newer step left from before a resume (one skipped as damaged, or past ``load_step``) is never why an
    intact older step is deleted; it is replaced when the run saves that step again.
    """
    _refuse_link(partial)
    _refuse_link(final)
    if config_yaml is not None:
        (partial / CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
    for name, text in (extra or {}).items():
        (partial / name).write_text(text, encoding="utf-8")
    write_manifest(partial)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    if keep_latest_k > 0:
        published = step_of(final)
        assert published is not None, final  # the callers give step_folder(folder, step)
        reached = [step for step in complete_steps(final.parent) if step <= published]
        for old in reached[:-keep_latest_k]:
            shutil.rmtree(step_folder(final.parent, old), ignore_errors=True)
