"""What a failed write says to the user: ``no space left on device (ENOSPC)``, one phrase for every writer.

A full disk (or a quota, a read-only remount, an I/O error) surfaces as an ``OSError`` from whichever
call wrote last: a ``write``, a ``flush``, a ``close``, a background writer's re-raise. Those often carry
no file name, so each writer names its own path and asks this module for the rest of the phrase, so the
metrics sinks, ``prepare`` and the lock files say it alike. Standard library only.
"""

from __future__ import annotations

import errno
import os

__all__ = ["FULL_DISK_ERRNOS", "full_disk_errno", "write_problem"]

#: The errnos of a write the disk has no room for: no space (ENOSPC), a quota (EDQUOT), a file larger
#: than the file system or ``ulimit -f`` allows (EFBIG). Each is the user's to fix by freeing space or
#: moving the output, never a traceback.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: How writers that keep no ``OSError`` (torch's zip writer) say the same in text.
_FULL_DISK_TEXTS = {os.strerror(code): code for code in FULL_DISK_ERRNOS}


def full_disk_errno(exc: BaseException) -> int | None:
    """The errno of :data:`FULL_DISK_ERRNOS` that ``exc`` is, or that its text names; None otherwise."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS:
        return exc.errno
    text = str(exc)
    return next((code for phrase, code in _FULL_DISK_TEXTS.items() if phrase in text), None)


def write_problem(exc: OSError) -> str:
    """``exc`` as a phrase after ``PATH: ``: its reason in lower case and the errno's name.

    ``OSError(errno.ENOSPC, ...)`` gives ``no space left on device (ENOSPC)``; one without an errno gives
    its text.
    """
    code = exc.errno
    if code is None:
        return str(exc) or type(exc).__name__
    reason = os.strerror(code)
    name = errno.errorcode.get(code, str(code))
    return f"{reason[:1].lower()}{reason[1:]} ({name})"
