"""Strict, path-aware structuring of raw YAML values into typed attrs instances.

cattrs' default hooks coerce (``int("1")``, ``bool("false")``, a string into a tuple of characters) and stop
at the first error without the field's path. This module compiles, once per type, a function that checks a
raw value against a type annotation with no coercion, records *every* problem with its path, and builds the
value only when it is sound. The converter plugs these functions into cattrs as hooks.

A compiled function has the signature ``fn(value, path, problems) -> result``; on failure it appends
:class:`Problem` records and returns :data:`INVALID`.
"""

import math
import re
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union

import attrs

from hyper_parallel.config.codegen import generate
from hyper_parallel.config.errors import PathPart, did_you_mean, echo

__all__ = [
    "INVALID",
    "TARGET_KEY",
    "Problem",
    "Structurer",
    "describe_type",
    "describe_value",
    "field_default",
    "run_cross_check",
    "union_args",
]

#: The key that names a Config class or factory; allowed on root groups only.
TARGET_KEY = "_target_"

#: Largest magnitude accepted for an integer field (int64, what every training runtime stores).
INT_LIMIT = 2**63 - 1


class _Invalid:
    """Sentinel type of :data:`INVALID`."""

    def __repr__(self) -> str:
        return "INVALID"


INVALID: Any = _Invalid()

Path = tuple[PathPart, ...]
Anchor = Literal["value", "key", "parent"]


class Problem(typing.NamedTuple):
    """A problem found while structuring, before it is given a source location.

    ``anchor`` says which source position locates it: the value at ``path`` (a wrong value), the key at
    ``path`` (an unknown key), or the mapping holding ``path`` (a missing key).
    """

    path: Path
    message: str
    anchor: Anchor = "value"


StructureFn = Callable[[Any, Path, list[Problem]], Any]


def describe_value(value: object) -> str:
    """How a raw value reads in a message: ``the string '1'``, ``the boolean true``, ``null`` ..."""
    if value is None:
        return "null"
    if value is True or value is False:
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {echo(value)}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {echo(value)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"a value of type {type(value).__name__}"


def union_args(tp: object) -> tuple[object, ...] | None:
    """The members of a ``Union``/``X | Y`` annotation, or None for any other annotation."""
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def describe_type(tp: object) -> str:
    """Readable name of an annotation for messages and ``--help``: ``int | None``, ``'a' | 'b'`` ..."""
    members = union_args(tp)
    if members is not None:
        return " | ".join(describe_type(m) for m in members)
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (list, tuple, Sequence, dict, Mapping):
        name = {list: "list", tuple: "list", Sequence: "list", dict: "mapping", Mapping: "mapping"}[origin]
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"list[{', '.join(describe_type(a) for a in args)}]"
        inner = [a for a in args if a is not Ellipsis]
        return f"{name}[{', '.join(describe_type(a) for a in inner)}]" if inner else name
    if isinstance(tp, type):
        return {int: "int", float: "float", bool: "bool", str: "str"}.get(tp, tp.__qualname__)
    return str(tp)


_EXPECTED = {int: "an integer", float: "a number", bool: "a boolean (true or false)", str: "a string"}


def _expected(tp: object) -> str:
    if tp in _EXPECTED:
        return _EXPECTED[tp]
    if tp is type(None):
        return "null"
    if attrs.has(tp):  # type: ignore[arg-type]
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        return "a list"
    if origin in (dict, Mapping):
        return "a mapping"
    return describe_type(tp)


_VALIDATOR_MESSAGE = re.compile(r"^'[^']*' (must .*?)(?:: (.*))?$", re.DOTALL)


def _validator_message(exc: Exception) -> str:
    """attrs says ``'lr' must be > 0.0: -1.0``; the path already names the field, so say the rest."""
    text = str(exc) if not exc.args or isinstance(exc.args[0], str) else str(exc.args[0])
    match = _VALIDATOR_MESSAGE.match(text)
    if match:
        rule, got = match.groups()
        return f"{rule}, got {got}" if got is not None else rule
    return text


def run_cross_check(obj: object, path: Path, problems: list[Problem]) -> None:
    """Collect what ``obj.cross_check()`` yields: ``(relative dotted field path, message)`` pairs."""
    check = getattr(obj, "cross_check", None)
    if check is None:
        return
    try:
        for relative, message in check():
            extra: Path = tuple(relative.split(".")) if relative else ()
            problems.append(Problem(path + extra, message))
    except Exception as exc:  # a broken check is reported where it belongs, never as a traceback
        problems.append(Problem(path, f"{type(obj).__qualname__}.cross_check failed: {exc!r}"))


class Structurer:
    """Compiles and caches one strict structuring function per annotation.

    Compilation happens once per type and process, under a lock so that threads never see a half-built
    entry; the fast path is a plain dictionary lookup.
    """

    def __init__(self) -> None:
        self._cache: dict[object, StructureFn] = {}
        self._building: dict[object, StructureFn] = {}
        self._groups: dict[type, StructureFn] = {}
        self._lock = threading.RLock()

    def for_type(self, tp: object) -> StructureFn:
        """The structuring function for annotation ``tp``."""
        try:
            return self._cache[tp]
        except KeyError:
            pass
        except TypeError:  # an unhashable annotation: compile every time
            return self._compile(tp)
        with self._lock:
            fn = self._cache.get(tp) or self._building.get(tp)
            if fn is not None:
                return fn
            # A class that refers to itself compiles to a lookup that is resolved once compilation is done.
            self._building[tp] = lambda v, p, pr: self._cache[tp](v, p, pr)
            try:
                fn = self._compile(tp)
            finally:
                del self._building[tp]
            self._cache[tp] = fn
            return fn

    def for_group(self, cls: type) -> StructureFn:
        """The structuring function for a root group's Config class: like ``for_type``, but the mapping
        may carry the group's ``_target_`` (already used to pick ``cls``)."""
        try:
            return self._groups[cls]
        except KeyError:
            with self._lock:
                fn = self._groups.get(cls) or self._compile_attrs(cls, group=True)
                self._groups[cls] = fn
                return fn

    def structure(self, value: object, tp: object, path: Path, problems: list[Problem]) -> Any:
        """Structure ``value`` as ``tp``, appending every problem found under ``path``."""
        return self.for_type(tp)(value, path, problems)

    # -- compilation -------------------------------------------------------------------------------------

    def _compile(self, tp: object) -> StructureFn:
        if tp is Any or tp is object:
            return _structure_any
        if tp is int:
            return _structure_int
        if tp is float:
            return _structure_float
        if tp is bool:
            return _structure_bool
        if tp is str:
            return _structure_str
        if tp is type(None):
            return _structure_none
        members = union_args(tp)
        if members is not None:
            return self._compile_union(tp, members)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is Literal:
            return _compile_literal(args)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return self._compile_fixed_tuple(args)
        if origin in (list, tuple, Sequence):
            item = args[0] if args else Any
            return self._compile_sequence(item, as_tuple=origin is not list)
        if origin in (dict, Mapping):
            key_tp, value_tp = args if args else (str, Any)
            return self._compile_mapping(key_tp, value_tp)
        if isinstance(tp, type) and attrs.has(tp):
            return self._compile_attrs(tp)
        return _unsupported(tp)

    def _compile_union(self, tp: object, members: tuple[object, ...]) -> StructureFn:
        nullable = type(None) in members
        rest = [m for m in members if m is not type(None)]
        fns = [self.for_type(m) for m in rest]
        if len(fns) == 1:
            only = fns[0]

            def structure_optional(value: Any, path: Path, problems: list[Problem]) -> Any:
                if value is None:
                    return None
                return only(value, path, problems)

            return structure_optional
        expected = " or ".join(_expected(m) for m in members)

        def structure_union(value: Any, path: Path, problems: list[Problem]) -> Any:
            if value is None and nullable:
                return None
            attempts: list[list[Problem]] = []
            for fn in fns:
                scratch: list[Problem] = []
                result = fn(value, path, scratch)
                if not scratch:
                    return result
                attempts.append(scratch)
            # A mapping can only have meant the one member that takes mappings: report its details.
            deep = [a for a in attempts if any(p.path != path for p in a)]
            if len(deep) == 1:
                problems.extend(deep[0])
            else:
                problems.append(Problem(path, f"expected {expected}, got {describe_value(value)}"))
            return INVALID

        return structure_union

    def _compile_sequence(self, item_tp: object, *, as_tuple: bool) -> StructureFn:
        item = self.for_type(item_tp)

        def structure_sequence(value: Any, path: Path, problems: list[Problem]) -> Any:
            if not isinstance(value, (list, tuple)):
                problems.append(Problem(path, f"expected a list, got {describe_value(value)}"))
                return INVALID
            before = len(problems)
            out = [item(v, (*path, i), problems) for i, v in enumerate(value)]
            if len(problems) > before:
                return INVALID
            return tuple(out) if as_tuple else out

        return structure_sequence

    def _compile_fixed_tuple(self, item_tps: tuple[object, ...]) -> StructureFn:
        items = [self.for_type(t) for t in item_tps]
        size = len(items)

        def structure_fixed_tuple(value: Any, path: Path, problems: list[Problem]) -> Any:
            if not isinstance(value, (list, tuple)):
                problems.append(
                    Problem(path, f"expected a list of {size} items, got {describe_value(value)}")
                )
                return INVALID
            if len(value) != size:
                problems.append(Problem(path, f"expected a list of {size} items, got {len(value)}"))
                return INVALID
            before = len(problems)
            out = tuple(
                fn(v, (*path, i), problems) for i, (fn, v) in enumerate(zip(items, value, strict=True))
            )
            return INVALID if len(problems) > before else out

        return structure_fixed_tuple

    def _compile_mapping(self, key_tp: object, value_tp: object) -> StructureFn:
        key_fn = self.for_type(key_tp)
        value_fn = self.for_type(value_tp)

        def structure_mapping(value: Any, path: Path, problems: list[Problem]) -> Any:
            if not isinstance(value, Mapping):
                problems.append(Problem(path, f"expected a mapping, got {describe_value(value)}"))
                return INVALID
            before = len(problems)
            out = {}
            for k, v in value.items():
                if k == TARGET_KEY:
                    problems.append(_nested_target((*path, k)))
                    continue
                kpath = (*path, k if isinstance(k, str) else echo(k))
                key = key_fn(k, kpath, problems)
                out[key] = value_fn(v, kpath, problems)
            return INVALID if len(problems) > before else out

        return structure_mapping

    def _compile_attrs(self, cls: type, *, group: bool = False) -> StructureFn:
        attrs.resolve_types(cls)
        fields = [f for f in attrs.fields(cls) if f.init]
        names = {f.name for f in fields}
        title = cls.__qualname__
        scope: dict[str, Any] = {"_ABSENT": _ABSENT, "Problem": Problem}
        lines = []
        for i, f in enumerate(fields):
            scope[f"f{i}"] = self.for_type(f.type)
            fast = _inline_check(f.type, f"c{i}", scope)
            alias = f.alias or f.name
            lines.append(f"    v = value.get({f.name!r}, _ABSENT)")
            lines.append("    if v is not _ABSENT:")
            lines.append("        seen += 1")
            if fast is not None:
                lines.append(f"        if {fast}:")
                lines.append(f"            kwargs[{alias!r}] = v")
                lines.append("        else:")
                lines.append(f"            kwargs[{alias!r}] = f{i}(v, (*path, {f.name!r}), problems)")
            else:
                lines.append(f"        kwargs[{alias!r}] = f{i}(v, (*path, {f.name!r}), problems)")
            if f.default is attrs.NOTHING:
                message = f"missing required field {f.name!r}"
                lines.append("    else:")
                lines.append(f"        problems.append(Problem((*path, {f.name!r}), {message!r}, 'parent'))")

        def not_a_mapping(value: Any, path: Path, problems: list[Problem]) -> Any:
            problems.append(Problem(path, f"expected a mapping for {title}, got {describe_value(value)}"))
            return INVALID

        def unsound(
            value: Any, path: Path, problems: list[Problem], kwargs: dict[str, Any], before: int
        ) -> Any:
            for key in value:
                if key not in names and not (group and key == TARGET_KEY):
                    problems.append(_unknown_key(path, key, names, title))
            if len(problems) > before:
                # Still check the fields that were sound, so that one bad field hides nothing else.
                sound = {k: v for k, v in kwargs.items() if v is not INVALID}
                _report_validators(cls, sound, path, problems)
                return INVALID
            return build_attrs(cls, kwargs, path, problems)

        scope.update(cls=cls, Mapping=Mapping, not_a_mapping=not_a_mapping, unsound=unsound)
        scope.update(build_attrs=build_attrs, run_cross_check=run_cross_check, INVALID=INVALID)
        checked = getattr(cls, "cross_check", None) is not None
        source = "\n".join(
            [
                "def structure(value, path, problems):",
                "    if type(value) is not dict and not isinstance(value, Mapping):",
                "        return not_a_mapping(value, path, problems)",
                "    before = len(problems)",
                "    kwargs = {}",
                "    seen = 0",
                *lines,
                # The happy path ends here; anything unusual (unknown keys, problems) takes the slow path.
                # A root group's mapping also holds its '_target_' (``for_group`` is called only then).
                f"    if seen != len(value){' - 1' if group else ''} or len(problems) != before:",
                "        return unsound(value, path, problems, kwargs, before)",
                "    try:",
                "        obj = cls(**kwargs)",
                "    except Exception:",
                "        return build_attrs(cls, kwargs, path, problems)",
                *(
                    [
                        "    run_cross_check(obj, path, problems)",
                        "    if len(problems) != before:",
                        "        return INVALID",
                    ]
                    if checked
                    else []
                ),
                "    return obj",
            ]
        )
        return generate(f"structure {cls.__module__}.{title}", source + "\n", scope)  # type: ignore[no-any-return]


_ABSENT: Any = object()


def _inline_check(tp: object, name: str, scope: dict[str, Any]) -> str | None:
    """A Python expression over ``v`` that is true when ``v`` is already sound for ``tp``, or None.

    Plain scalars, optional scalars and string literals are the bulk of any config; checking them inline
    in generated code, without a call, is what keeps a warm resolve within a few times a compiled peer.
    Anything else, and any value that fails the inline check, takes the full structuring function.
    """
    if tp is str or tp is bool:
        return f"type(v) is {tp.__name__}"
    if tp is int:
        return f"(type(v) is int and {-INT_LIMIT - 1} <= v <= {INT_LIMIT})"
    if tp is float:
        return "(type(v) is float and v - v == 0.0)"  # finite: inf - inf and nan - nan are nan
    if typing.get_origin(tp) is Literal and all(type(c) is str for c in typing.get_args(tp)):
        scope[name] = frozenset(typing.get_args(tp))
        return f"(type(v) is str and v in {name})"
    members = union_args(tp)
    if members is not None and len(members) == 2 and type(None) in members:
        (other,) = [m for m in members if m is not type(None)]
        inner = _inline_check(other, name, scope)
        return f"(v is None or {inner})" if inner is not None else None
    return None


def build_attrs(cls: type, kwargs: dict[str, Any], path: Path, problems: list[Problem]) -> Any:
    """Construct ``cls(**kwargs)`` from checked values, reporting every validator failure by its path.

    attrs runs validators inside ``__init__`` and the first failure hides the rest, without a path. The
    happy path constructs once; on failure every validator is re-run on an unvalidated instance so all
    failures are reported, each at its own field.
    """
    try:
        obj = cls(**kwargs)
    except Exception as exc:  # a Config's own code failing is the user's problem to see, not a traceback
        before = len(problems)
        _report_validators(cls, kwargs, path, problems)
        if len(problems) == before:
            detail = _validator_message(exc) if isinstance(exc, (ValueError, TypeError)) else repr(exc)
            problems.append(Problem(path, f"{cls.__qualname__}: {detail}"))
        return INVALID
    before = len(problems)
    run_cross_check(obj, path, problems)
    return INVALID if len(problems) > before else obj


def field_default(field: "attrs.Attribute[Any]", instance: object = None) -> Any:
    """The default of an attrs field, calling a ``Factory`` (with ``instance`` if it takes self);
    ``attrs.NOTHING`` when there is none (or it needs an instance that was not given)."""
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return attrs.NOTHING if instance is None else default.factory(instance)
        return default.factory()
    return default


def _report_validators(cls: type, kwargs: dict[str, Any], path: Path, problems: list[Problem]) -> None:
    shell: Any = object.__new__(cls)
    fields = attrs.fields(cls)
    for f in fields:
        alias = f.alias or f.name
        value = kwargs[alias] if alias in kwargs else field_default(f, shell)
        if value is not attrs.NOTHING:
            object.__setattr__(shell, f.name, value)
    for f in fields:
        if f.validator is None or not hasattr(shell, f.name):
            continue
        try:
            f.validator(shell, f, getattr(shell, f.name))
        except (ValueError, TypeError) as exc:
            problems.append(Problem((*path, f.name), _validator_message(exc)))
        except AttributeError:  # a validator reading a field that is itself invalid: reported there
            pass
        except Exception as exc:
            problems.append(Problem((*path, f.name), f"validator failed: {exc!r}"))


def _unknown_key(path: Path, key: object, names: Iterable[str], title: str) -> Problem:
    if key == TARGET_KEY:
        return _nested_target((*path, key))
    if not isinstance(key, str):
        return Problem((*path, echo(key)), f"field names must be strings, got {describe_value(key)}", "key")
    return Problem((*path, key), f"unknown field {echo(key)} for {title}{did_you_mean(key, names)}", "key")


def _nested_target(path: Path) -> Problem:
    return Problem(
        path,
        "'_target_' is only allowed at the top of a root group; nested sections are configured by their "
        "fields, and the owning Config decides what they build",
        "key",
    )


def _structure_any(value: Any, path: Path, problems: list[Problem]) -> Any:
    return value


def _structure_int(value: Any, path: Path, problems: list[Problem]) -> Any:
    if type(value) is int:
        if -INT_LIMIT - 1 <= value <= INT_LIMIT:
            return value
        problems.append(Problem(path, f"integer out of range (must fit in 64 bits), got {echo(value)}"))
        return INVALID
    problems.append(Problem(path, f"expected an integer, got {describe_value(value)}"))
    return INVALID


def _structure_float(value: Any, path: Path, problems: list[Problem]) -> Any:
    kind = type(value)
    if kind is float:
        if math.isfinite(value):
            return value
        problems.append(Problem(path, f"expected a finite number, got {value!r}"))
        return INVALID
    if kind is int:
        try:
            return float(value)
        except OverflowError:
            problems.append(Problem(path, f"number too large, got {echo(value)}"))
            return INVALID
    hint = _YAML11_FLOAT_HINT if kind is str and _YAML11_STRING_FLOAT.fullmatch(value) else ""
    problems.append(Problem(path, f"expected a number, got {describe_value(value)}{hint}"))
    return INVALID


# PyYAML's own loaders follow YAML 1.1, where a float needs a dot: ``1e-4`` reads as the string "1e-4".
_YAML11_STRING_FLOAT = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+")
_YAML11_FLOAT_HINT = (
    " (a YAML 1.1 reader such as yaml.safe_load reads 1e-4 as text: write 1.0e-4, or load the file with "
    "load_config, which reads YAML 1.2)"
)


def _structure_bool(value: Any, path: Path, problems: list[Problem]) -> Any:
    if value is True or value is False:
        return value
    problems.append(Problem(path, f"expected a boolean (true or false), got {describe_value(value)}"))
    return INVALID


def _structure_str(value: Any, path: Path, problems: list[Problem]) -> Any:
    if type(value) is str:
        return value
    problems.append(Problem(path, f"expected a string, got {describe_value(value)}"))
    return INVALID


def _structure_none(value: Any, path: Path, problems: list[Problem]) -> Any:
    if value is None:
        return None
    problems.append(Problem(path, f"expected null, got {describe_value(value)}"))
    return INVALID


def _compile_literal(choices: tuple[object, ...]) -> StructureFn:
    allowed = {(type(c), c) for c in choices}
    words = [c for c in choices if isinstance(c, str)]
    expected = ", ".join(repr(c) for c in choices)

    def structure_literal(value: Any, path: Path, problems: list[Problem]) -> Any:
        try:
            if (type(value), value) in allowed:
                return value
        except TypeError:  # unhashable value
            pass
        hint = did_you_mean(value, words) if isinstance(value, str) else ""
        problems.append(Problem(path, f"expected one of {expected}, got {describe_value(value)}{hint}"))
        return INVALID

    return structure_literal


def _unsupported(tp: object) -> StructureFn:
    name = describe_type(tp)

    def structure_unsupported(value: Any, path: Path, problems: list[Problem]) -> Any:
        problems.append(Problem(path, f"a value of type {name} cannot be given in a config file"))
        return INVALID

    return structure_unsupported
