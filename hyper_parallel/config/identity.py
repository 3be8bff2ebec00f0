"""Facts attached to objects by identity, forgotten when the object dies.

Resolved configs are frozen, slotted attrs instances (or whatever a factory returns): they cannot carry
extra attributes, and equal values are not the same fact (two equal configs may have been set by the user
in different fields). So facts about them (what the user set in a root config, the recipe of a factory
result whose class has no field for it) live beside them in an identity map whose entries go away with the
object. Such facts do not survive a copy; a fact that must (a ``ModelSpec``'s recipe) is stored on the
value itself.
"""

import threading
import weakref
from typing import Any, Generic, TypeVar

__all__ = ["IdentityMap"]

V = TypeVar("V")


class IdentityMap(Generic[V]):
    """``obj -> value`` by ``id(obj)``, holding ``obj`` weakly; safe to use from many threads."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], V]] = {}
        # Re-entrant: a weakref callback may run while the lock is held by the same thread.
        self._lock = threading.RLock()

    def set(self, obj: object, value: V) -> None:
        """Attach ``value`` to ``obj``; objects that cannot be weakly referenced are silently skipped."""
        key = id(obj)

        def forget(ref: "weakref.ref[Any]") -> None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0] is ref:
                    del self._entries[key]

        try:
            ref = weakref.ref(obj, forget)
        except TypeError:
            return
        with self._lock:
            self._entries[key] = (ref, value)

    def __len__(self) -> int:
        """How many objects have a value (an empty map answers every lookup without one)."""
        return len(self._entries)

    def get(self, obj: object) -> V | None:
        """The value attached to ``obj`` (this very object, not an equal one), or None."""
        entry = self._entries.get(id(obj))
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None
