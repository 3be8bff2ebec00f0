"""Compiling small generated functions, the way attrs and cattrs generate ``__init__`` and hooks.

Unstructuring a config touches every field of every class on each call; a function generated once per
class, with each field's access written out, runs several times faster than a generic loop over field
descriptions. Generated source is registered with ``linecache`` under a name no other function has, so
tracebacks and profilers show the right source even for two classes with the same qualified name.
"""

import itertools
import linecache
from collections.abc import Callable
from typing import Any

__all__ = ["COMPILE_AFTER", "compiled_when_used", "generate"]

#: Calls a hook answers with a generic loop before the function written out for its class is compiled
#: (about half a millisecond a class): a command that uses each class once or twice (a cold ``--dry-run``)
#: never pays for compiling; a process that resolves again switches on the next call.
COMPILE_AFTER = 2


def compiled_when_used(
    loop: Callable[..., Any],
    write: Callable[[], Callable[..., Any]],
    installed: Callable[[Callable[..., Any]], object] | None = None,
) -> Callable[..., Any]:
    """A function that answers its first :data:`COMPILE_AFTER` calls with ``loop``, then compiles
    ``write()`` (the same work, written out) and answers with that; ``installed`` is given the compiled
    function, for a caller that keeps the hook where it can put that function instead."""
    written: Callable[..., Any] | None = None
    calls = 0

    def call(*args: Any) -> Any:
        nonlocal written, calls
        if written is not None:
            return written(*args)
        calls += 1
        if calls <= COMPILE_AFTER:
            return loop(*args)
        written = write()
        if installed is not None:
            installed(written)
        return written(*args)

    return call


def generate(label: str, source: str, scope: dict[str, Any]) -> Any:
    """Compile ``source``, which defines one function, with ``scope`` as its globals; return the function."""
    lines = source.splitlines(True)
    for n in itertools.count(1):
        filename = f"<hyper_parallel generated: {label}{'' if n == 1 else f' ({n})'}>"
        entry = (len(source), None, lines, filename)
        if linecache.cache.setdefault(filename, entry) == entry:  # a free name, or this very source
            break
    code = compile(source, filename, "exec")
    namespace = dict(scope)
    exec(code, namespace)
    (fn,) = (v for k, v in namespace.items() if k not in scope and k != "__builtins__")
    return fn
