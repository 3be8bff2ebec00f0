"""JSON read from files with a depth limit: the one ``loads`` every reader of a file's JSON uses.

``json.loads`` parses nesting by recursion: a few hundred kilobytes of ``[`` end in a ``RecursionError``
(or, in a thread with a small stack, worse) in whichever reader met them, each with its own traceback.
``loads`` refuses documents nested deeper than ``MAX_DEPTH`` levels (no file this project reads nests
past ten) with :class:`JSONDepthError`, a ``json.JSONDecodeError``, so every reader's existing handling of
malformed JSON reports it as one line naming the file. Standard library only.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "JSONDepthError", "loads"]

#: Deepest nesting of arrays and objects accepted.
MAX_DEPTH = 100


class JSONDepthError(json.JSONDecodeError):
    """A JSON document nested deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_DEPTH} levels", "", 0)
        self.args = (self.msg,)  # the message alone: there is no one position to point at


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests arrays/objects deeper than ``MAX_DEPTH`` (iterative: no recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        current, depth = pending.pop()
        children = current.values() if isinstance(current, dict) else current
        if isinstance(current, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``; :class:`JSONDepthError` when nested deeper than :data:`MAX_DEPTH`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONDepthError() from None
    if isinstance(value, (dict, list)) and _too_deep(value):
        raise JSONDepthError()
    return value
