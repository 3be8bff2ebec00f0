"""Turning a resolved root config back into the raw tree a YAML file would hold.

Each root group gets its ``_target_`` back: the runtime class of a Config (never the declared base class,
which would lose the subclass's fields), or the factory and the arguments it was called with. Anything
that could not be named in a file (a lambda, a local class, ``__main__``) is an error now, not a file that
fails to load later.
"""

import functools
import math
from collections.abc import Mapping
from typing import Any

import attrs

from hyper_parallel.config.codegen import generate
from hyper_parallel.config.identity import IdentityMap
from hyper_parallel.config.root import recipe_of, to_config_error
from hyper_parallel.config.structure import TARGET_KEY, Path, Problem
from hyper_parallel.config.targets import qualified_name

__all__ = ["shared_tree", "unstructure_root", "unstructure_value"]


def _nameable(obj: object) -> str | None:
    """Why ``obj`` cannot be named by a dotted path, or None if it can."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    if module in (None, "__main__"):
        return f"it is defined in {module or 'no module'!s}"
    if "<" in qualname:
        return f"{qualname!r} is a lambda or a local definition"
    return None


#: True when ``v`` is a scalar that unstructures to itself (a finite float included).
_PLAIN_CHECK = (
    "v is None or type(v) is str or type(v) is int or type(v) is bool or (type(v) is float and v - v == 0.0)"
)
#: attrs class -> generated function unstructuring its ``init`` fields; None for a non-attrs class.
_FIELD_READERS: dict[type, Any] = {}


def _field_reader(cls: type) -> Any:
    """A function ``(obj, path, problems) -> dict`` written out for ``cls``'s fields (None if not attrs)."""
    try:
        return _FIELD_READERS[cls]
    except KeyError:
        pass
    reader = None
    if attrs.has(cls):
        lines = ["def read_fields(o, path, problems):", "    out = {}"]
        for f in attrs.fields(cls):
            if f.init:
                lines.append(f"    v = o.{f.name}")
                # Plain scalars are the common case: no call, no path tuple.
                full = f"unstructure_value(v, (*path, {f.name!r}), problems)"
                lines.append(f"    out[{f.name!r}] = v if {_PLAIN_CHECK} else {full}")
        lines.append("    return out")
        scope = {"unstructure_value": unstructure_value}
        reader = generate(f"unstructure {cls.__module__}.{cls.__qualname__}", "\n".join(lines) + "\n", scope)
    _FIELD_READERS[cls] = reader
    return reader


def unstructure_value(value: Any, path: Path, problems: list[Problem]) -> Any:
    """The raw form of a structured value: scalars as they are, tuples as lists, attrs as mappings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            problems.append(Problem(path, f"{value!r} cannot be written to a config file"))
        return value
    if isinstance(value, (list, tuple)):
        return [unstructure_value(v, (*path, i), problems) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {k: unstructure_value(v, (*path, str(k)), problems) for k, v in value.items()}
    reader = _field_reader(type(value))
    if reader is not None:
        return reader(value, path, problems)
    kind = getattr(value, "__qualname__", type(value).__qualname__)
    problems.append(Problem(path, f"{kind} cannot be written to a config file"))
    return None


#: Each resolved group's unstructured form. Groups are immutable, so the form never changes; the dicts are
#: shared between calls, so code that changes a tree copies what it changes (``overrides`` does).
_GROUPS: IdentityMap[dict[str, Any]] = IdentityMap()


def _unstructure_group(name: str, value: Any, problems: list[Problem]) -> dict[str, Any]:
    cached = _GROUPS.get(value)
    if cached is not None:
        return cached
    before = len(problems)
    body = _unstructure_group_body(name, value, problems)
    if len(problems) == before:
        _GROUPS.set(value, body)
    return body


def _unstructure_group_body(name: str, value: Any, problems: list[Problem]) -> dict[str, Any]:
    path: Path = (name,)
    recipe = recipe_of(value)
    if recipe is not None:
        target, args = recipe.target, recipe.args
        body = {k: unstructure_value(v, (*path, k), problems) for k, v in args.items()}
        return {TARGET_KEY: target, **body}
    cls: Any = type(value)
    name, why = _target_name(cls)
    if why is not None:
        problems.append(Problem(path, why))
        return {}
    return {TARGET_KEY: name, **unstructure_value(value, path, problems)}


@functools.lru_cache(maxsize=1024)
def _target_name(cls: Any) -> tuple[str, str | None]:
    """The ``_target_`` naming ``cls``, and why it cannot be written (None if it can)."""
    if not attrs.has(cls):
        return "", f"a {cls.__qualname__} cannot be written to a config file"
    why = _nameable(cls)
    if why is not None:
        return "", f"{cls.__qualname__} cannot be named as a '_target_': {why}"
    return qualified_name(cls), None


def unstructure_root(root: Any) -> dict[str, Any]:
    """Every root group of ``root`` with its ``_target_`` and every field explicit, in declaration order.

    The result is the caller's own (a fresh tree). Raises :class:`ConfigError` naming each value that
    cannot be written.
    """
    tree: dict[str, Any] = _copy_tree(shared_tree(root))
    return tree


def shared_tree(root: Any) -> dict[str, Any]:
    """Like :func:`unstructure_root`, but the group mappings are shared and must not be changed in place."""
    problems: list[Problem] = []
    root_cls: Any = type(root)
    out = {name: _unstructure_group(name, getattr(root, name), problems) for name in _group_names(root_cls)}
    if problems:
        raise to_config_error(problems, None)
    return out


def _copy_tree(node: Any) -> Any:
    if type(node) is dict:
        return {k: _copy_tree(v) for k, v in node.items()}
    if type(node) is list:
        return [_copy_tree(v) for v in node]
    return node


@functools.lru_cache(maxsize=64)
def _group_names(root_cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in attrs.fields(root_cls) if f.init)
