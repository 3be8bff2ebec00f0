"""Compiling small generated functions, the way attrs and cattrs generate ``__init__`` and hooks.

Structuring and unstructuring a config touch every field of every class on each call; a function
generated once per class, with each field's access and check written out, runs several times faster than a
generic loop over field descriptions. Generated source is registered with ``linecache`` so tracebacks and
profilers show it.
"""

import linecache
from typing import Any

__all__ = ["generate"]


def generate(label: str, source: str, scope: dict[str, Any]) -> Any:
    """Compile ``source``, which defines one function, with ``scope`` as its globals; return the function."""
    filename = f"<hyper_parallel generated: {label}>"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = dict(scope)
    exec(code, namespace)
    return namespace[source[4 : source.index("(")]]
