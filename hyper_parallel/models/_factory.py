"""Helpers shared by the model factories: flavor lookup and typed ``overrides``.

``create_model_spec(flavor=..., overrides={...})`` must fail loudly and early: an unknown flavor or
override key names the closest valid one, a value of the wrong type is refused instead of coerced, and
the architecture validators and ``cross_check`` run on the result. Every problem becomes a ``ValueError``.
"""

import types
import typing
from collections.abc import Mapping
from typing import Literal, TypeVar

import attrs

from hyper_parallel.models.spec import ModelArgs

__all__ = ["OverrideValue", "apply_overrides", "lookup_flavor", "require_torch", "suggest"]

#: Values ``overrides`` may carry: model arguments are scalars (nested sections via dotted keys).
OverrideValue = int | float | bool | str | None

A = TypeVar("A", bound=ModelArgs)


def suggest(name: str, candidates: typing.Iterable[str]) -> str:
    """A ``"; did you mean 'x'?"`` suffix for the closest candidate (case-insensitive), or ``""``."""
    by_lower = {c.lower(): c for c in sorted(candidates)}
    import difflib  # only a mistake pays for it

    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""


def lookup_flavor(family: str, table: Mapping[str, A], flavor: str) -> A:
    """The args of ``flavor`` in ``table``; ``ValueError`` with the valid flavors otherwise."""
    if flavor in table:
        return table[flavor]
    known = ", ".join(repr(name) for name in table)
    raise ValueError(f"unknown {family} flavor {flavor!r}{suggest(str(flavor), table)} (known: {known})")


def _options(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _describe(annotation: object) -> str:
    parts = []
    for option in _options(annotation):
        if option is type(None):
            parts.append("None")
        elif typing.get_origin(option) is Literal:
            parts.extend(repr(v) for v in typing.get_args(option))
        else:
            parts.append(getattr(option, "__name__", repr(option)))
    return " | ".join(parts)


def _coerce(annotation: object, value: object) -> tuple[bool, object]:
    """``(True, value)`` if ``value`` fits ``annotation`` exactly (an int may fill a float field)."""
    for option in _options(annotation):
        if option is type(None) and value is None:
            return True, None
        if typing.get_origin(option) is Literal:
            if any(type(v) is type(value) and v == value for v in typing.get_args(option)):
                return True, value
        elif option in (int, bool, str) and type(value) is option:
            return True, value
        elif option is float and type(value) in (int, float):
            return True, float(typing.cast(float, value))
    return False, value


def _field_type(obj: object, name: str) -> object | None:
    cls = type(obj)
    if not attrs.has(cls) or name not in attrs.fields_dict(cls):
        return None
    hint: object = typing.get_type_hints(cls)[name]
    return hint


def _replace(obj: object, parts: list[str], value: object) -> object:
    head, *rest = parts
    if not rest:
        return attrs.evolve(obj, **{head: value})  # type: ignore[misc]
    return attrs.evolve(obj, **{head: _replace(getattr(obj, head), rest, value)})  # type: ignore[misc]


def apply_overrides(args: A, overrides: Mapping[str, OverrideValue] | None, what: str) -> A:
    """Return ``args`` with ``overrides`` applied (dotted keys reach nested sections), fully checked.

    ``what`` names the flavor in messages. Raises one ``ValueError`` listing every problem.
    """
    problems: list[str] = []
    result: A = args
    for key, value in (overrides or {}).items():
        parts = str(key).split(".")
        owner: object = result
        annotation: object | None = None
        for depth, part in enumerate(parts):
            annotation = _field_type(owner, part)
            if annotation is None:
                prefix = ".".join(parts[:depth])
                names = [
                    (f"{prefix}." if prefix else "") + f.name
                    for f in attrs.fields(typing.cast("type[attrs.AttrsInstance]", type(owner)))
                ]
                problems.append(
                    f"unknown override {key!r} for {what} ({type(owner).__name__}){suggest(str(key), names)}"
                )
                break
            if depth < len(parts) - 1:
                owner = getattr(owner, part)
                if owner is None or not attrs.has(type(owner)):
                    section = ".".join(parts[: depth + 1])
                    state = "null in this flavor" if owner is None else "not a section"
                    problems.append(f"override {key!r}: {section} is {state}")
                    annotation = None
                    break
        if annotation is None:
            continue
        current = getattr(owner, parts[-1])
        if attrs.has(type(current)):
            problems.append(f"override {key!r} is a section; override its fields as '{key}.<field>'")
            continue
        ok, checked = _coerce(annotation, value)
        if not ok:
            problems.append(
                f"override {key!r} must be {_describe(annotation)}, got {type(value).__name__} {value!r}"
            )
            continue
        try:
            result = typing.cast(A, _replace(result, parts, checked))
        except (TypeError, ValueError) as exc:
            problems.append(f"override {key!r}: {exc}")
    if not problems:
        problems.extend(f"{path or 'args'}: {message}" for path, message in result.cross_check())
    if problems:
        raise ValueError(f"invalid model arguments for {what}: " + "; ".join(problems))
    return result


def require_torch(model: str, what: str) -> None:
    """Raise a helpful ``ImportError`` when a runtime hook is called without the optional torch extra."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ImportError(
            f"{model} {what} needs PyTorch, which is not installed: "
            "pip install 'hyper_parallel[torch]' (torch==2.13.0)"
        )
