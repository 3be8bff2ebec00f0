"""Compiling small generated functions, the way attrs and cattrs generate ``__init__`` and hooks.

Unstructuring a config touches every field of every class on each call; a function generated once per
class, with each field's access written out, runs several times faster than a generic loop over field
descriptions. Generated source is registered with ``linecache`` under a name no other function has, so
tracebacks and profilers show the right source even for two classes with the same qualified name.
"""

import itertools
import linecache
from typing import Any

__all__ = ["generate"]


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
