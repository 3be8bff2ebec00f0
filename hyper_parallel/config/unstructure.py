"""Turning a resolved root config back into the raw tree a YAML file would hold.

Each root group gets its ``_target_`` back: the runtime class of a Config (never the declared base class,
which would lose the subclass's fields), or the factory and the arguments it was called with. Anything
that could not be named in a file (a lambda, a local class, ``__main__``) is an error now, not a file that
fails to load later.
"""

import math
from collections.abc import Mapping
from typing import Any

import attrs

from hyper_parallel.config.errors import ConfigError
from hyper_parallel.config.root import recipe_of, to_config_error
from hyper_parallel.config.structure import TARGET_KEY, Path, Problem
from hyper_parallel.config.targets import qualified_name

__all__ = ["unstructure_root", "unstructure_value"]


def _nameable(obj: object) -> str | None:
    """Why ``obj`` cannot be named by a dotted path, or None if it can."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", "")
    if module in (None, "__main__"):
        return f"it is defined in {module or 'no module'!s}"
    if "<" in qualname:
        return f"{qualname!r} is a lambda or a local definition"
    return None


#: Exact types returned unchanged by :func:`unstructure_value` (floats are checked for finiteness).
_PLAIN = frozenset({bool, int, str})
#: attrs class -> names of its ``init`` fields, in declaration order; None for a non-attrs class.
_INIT_NAMES: dict[type, tuple[str, ...] | None] = {}


def _init_names(cls: type) -> tuple[str, ...] | None:
    try:
        return _INIT_NAMES[cls]
    except KeyError:
        names = tuple(f.name for f in attrs.fields(cls) if f.init) if attrs.has(cls) else None
        _INIT_NAMES[cls] = names
        return names


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
    names = _init_names(type(value))
    if names is not None:
        out = {}
        for name in names:
            item = getattr(value, name)
            # Plain scalars are the common case: skip the recursive call and its path tuple.
            out[name] = (
                item
                if item is None or type(item) in _PLAIN
                else unstructure_value(item, (*path, name), problems)
            )
        return out
    kind = getattr(value, "__qualname__", type(value).__qualname__)
    problems.append(Problem(path, f"{kind} cannot be written to a config file"))
    return None


def _unstructure_group(name: str, value: Any, problems: list[Problem]) -> dict[str, Any]:
    path: Path = (name,)
    recipe = recipe_of(value)
    if recipe is not None:
        target, args = recipe.target, recipe.args
        body = {k: unstructure_value(v, (*path, k), problems) for k, v in args.items()}
        return {TARGET_KEY: target, **body}
    cls = type(value)
    if not attrs.has(cls):
        problems.append(Problem(path, f"a {cls.__qualname__} cannot be written to a config file"))
        return {}
    why = _nameable(cls)
    if why is not None:
        problems.append(Problem(path, f"{cls.__qualname__} cannot be named as a '_target_': {why}"))
        return {}
    body = unstructure_value(value, path, problems)
    return {TARGET_KEY: qualified_name(cls), **body}


def unstructure_root(root: Any) -> dict[str, Any]:
    """Every root group of ``root`` with its ``_target_`` and every field explicit, in declaration order.

    Raises :class:`ConfigError` naming each value that cannot be written.
    """
    problems: list[Problem] = []
    out = {
        f.name: _unstructure_group(f.name, getattr(root, f.name), problems)
        for f in attrs.fields(type(root))
        if f.init
    }
    if problems:
        raise _dump_error(problems)
    return out


def _dump_error(problems: list[Problem]) -> ConfigError:
    return to_config_error(problems, None)
