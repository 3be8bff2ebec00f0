"""What a failed write says to the user: ``no space left on device (ENOSPC)``, one phrase for every writer.

A full disk (or a quota, a read-only remount, an I/O error) surfaces as an ``OSError`` from whichever
call wrote last: a ``write``, a ``flush``, a ``close``, a background writer's re-raise. Those often carry
no file name, so each writer names its own path and asks this module for the rest of the phrase, so the
metrics sinks, ``prepare`` and the lock files say it alike. Standard library only.
"""

from __future__ import annotations

import errno
import os

__all__ = ["write_problem"]


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
