"""The table of type rules: every question the config layer asks about an annotation, answered in one place.

Each kind of annotation (a scalar, ``Literal``, ``Enum``, ``pathlib.Path``, a union, a list, a mapping, an
attrs class, ...) is one :class:`Rule`. A rule answers, for the annotations it matches: the strict structure
hook the converter registers (no coercion: ``"200"`` is not an int), how a structured value of that kind
unstructures, the words of "expected X" messages and of ``--help``, the JSON schema, whether command-line
text is taken as it is, and how an override path steps into it. A new field type is one rule here.

Hooks are cattrs hooks ``hook(value, type) -> value``; they raise :class:`~hyper_parallel.config.validation.
Invalid` for a value they refuse and cattrs' ``ClassValidationError`` / ``IterableValidationError`` (with
notes naming the attribute, index or key) for containers, so ``cattrs`` users can read them as usual.
"""

import enum
import functools
import itertools
import math
import operator
import pathlib
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union

import attrs
import cattrs
from cattrs.dispatch import _DispatchNotFound
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError
from cattrs.gen import make_dict_structure_fn

from hyper_parallel.config.attrs_validators import shape_of
from hyper_parallel.config.targets import TARGET_KEY
from hyper_parallel.config.validation import (
    NO_CHILD,
    CheckedGroup,
    Invalid,
    Path,
    Problem,
    Problems,
    at_attribute,
    at_index,
    class_error,
    cross_check_errors,
    field_default,
    nested_target,
    problems_of,
    unknown_key,
)
from hyper_parallel.config.yaml_load import _FLOAT_RE
from hyper_parallel.config_base import ConfigBase
from hyper_parallel.errors import did_you_mean, echo

__all__ = [
    "INT_LIMIT",
    "NO_CHILD",
    "Rule",
    "attrs_hook",
    "attrs_unstructure",
    "check_shape",
    "child_names",
    "child_type",
    "choice_hint",
    "constrain_schema",
    "describe_type",
    "describe_value",
    "expected",
    "plain_text",
    "register_rules",
    "rule_for",
    "strip_optional",
    "takes_text",
    "type_schema",
    "union_args",
]

#: Largest magnitude accepted for an integer field (int64, what every training runtime stores).
INT_LIMIT = 2**63 - 1

Hook = Callable[[Any, Any], Any]
Schema = dict[str, Any]


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


def strip_optional(tp: object) -> tuple[object, bool]:
    """``X | None`` -> ``(X, True)``; any other annotation -> ``(tp, False)``."""
    members = union_args(tp)
    if members is not None and type(None) in members:
        rest = [m for m in members if m is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return tp, False


class Rule:
    """One kind of annotation. The defaults describe a kind that cannot be given in a config file."""

    #: What an "expected ..., got ..." message asks for when it is the same for every annotation the rule
    #: matches (``a list``); empty: :meth:`describe` words it.
    words = ""

    def matches(self, tp: Any) -> bool:
        """Whether this rule answers for ``tp`` (an annotation, or the runtime class of a value)."""
        return True

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        """The strict structure hook for ``tp``."""
        name = describe_type(tp)

        def structure_unsupported(value: Any, _tp: Any) -> Any:
            raise Invalid(f"a value of type {name} cannot be given in a config file")

        return structure_unsupported

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        """How a value of runtime class ``cls`` is written to a file."""
        kind = getattr(cls, "__qualname__", repr(cls))

        def unstructure_unsupported(value: Any) -> Any:
            shown = getattr(value, "__qualname__", kind)
            raise Invalid(f"{shown} cannot be written to a config file")

        return unstructure_unsupported

    def describe(self, tp: Any, wanted: bool = False) -> str:
        """The annotation in ``--help`` and messages: ``int | None``, ``list[str]``; ``wanted``: what an
        "expected ..., got ..." message asks for (``one of 'a', 'b'``) where :attr:`words` does not say it."""
        return getattr(tp, "__qualname__", None) or str(tp)

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        """The JSON schema of ``tp``, as strict as the hook; ``default_of`` writes a default value."""
        return {"not": {}, "description": f"{describe_type(tp)} cannot be given in a config file"}

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        """Whether command-line text is the value itself (a string, a path), not a YAML scalar to parse; and
        whether a string can be a value of ``tp`` (then text that parses but does not fit stays text)."""
        return False, False

    def child(self, tp: Any, segment: str | int) -> Any:
        """The annotation one override path segment below ``tp``, or :data:`NO_CHILD`."""
        return NO_CHILD

    def names(self, tp: Any) -> list[str]:
        """The child names to suggest for a misspelled segment."""
        return []


class _Any(Rule):
    def matches(self, tp: Any) -> bool:
        return tp is Any or tp is object

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        return _structure_any

    def describe(self, tp: Any, wanted: bool = False) -> str:
        return str(tp)

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        return {}

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        return False, True


def _structure_any(value: Any, _tp: Any) -> Any:
    """Any value, as it is; but a ``_target_`` at any depth is refused (only root groups name targets)."""
    if type(value) is dict or type(value) is list:
        found = list(_nested_targets(value, ()))
        if found:
            problem = nested_target(())
            raise Problems("nested '_target_'", [problem._replace(path=path) for path in found])
    return value


def _nested_targets(value: Any, path: tuple[str | int, ...]) -> Any:
    """The path of every ``_target_`` key inside ``value``."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = (*path, key if isinstance(key, str) else echo(key))
            if key == TARGET_KEY:
                yield here
            else:
                yield from _nested_targets(item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nested_targets(item, (*path, i))


def _same(value: Any) -> Any:
    return value


class _Scalar(Rule):
    """``int``, ``float``, ``bool``, ``str`` and ``None``: exact YAML types, no coercion."""

    def __init__(self, cls: type, name: str, expected: str, schema: Schema, hook: Hook) -> None:
        self.cls, self.name, self.words, self.json, self.hook = cls, name, expected, schema, hook

    def matches(self, tp: Any) -> bool:
        return tp is self.cls

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        return self.hook

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        return {float: _unstructure_float, str: _unstructure_str}.get(self.cls, _same)

    def describe(self, tp: Any, wanted: bool = False) -> str:
        return self.name

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        return dict(self.json)

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        return (self.cls is str,) * 2


def _structure_int(value: Any, _tp: Any) -> Any:
    if type(value) is int:
        if -INT_LIMIT - 1 <= value <= INT_LIMIT:
            return value
        raise Invalid(f"integer out of range (must fit in 64 bits), got {echo(value)}")
    raise Invalid(f"expected an integer, got {describe_value(value)}")


# A number in quotes is text (a number as the core schema's table reads one); and PyYAML's own loaders
# follow YAML 1.1, where a float needs a dot: ``1e-4`` reads as the string "1e-4" there.
@functools.cache
def _yaml11_text() -> re.Pattern[str]:
    """A number that YAML 1.1 reads as text (compiled when a number is refused)."""
    return re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+")


_QUOTED_HINT = " (a number in quotes is text: remove the quotes"
_YAML11_FLOAT_HINT = (
    "; a YAML 1.1 reader such as yaml.safe_load also reads 1e-4 as text: write 1.0e-4, or load the file "
    "with load_config, which reads YAML 1.2"
)


def _structure_float(value: Any, _tp: Any) -> Any:
    kind = type(value)
    if kind is float:
        if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
            return value
        raise Invalid(f"expected a finite number, got {value!r}")
    if kind is int:
        try:
            return float(value)
        except OverflowError:
            raise Invalid(f"number too large, got {echo(value)}") from None
    hint = ""
    if kind is str and _FLOAT_RE.fullmatch(value):
        yaml11 = _YAML11_FLOAT_HINT if _yaml11_text().fullmatch(value) else ""
        hint = f"{_QUOTED_HINT}{yaml11})"
    raise Invalid(f"expected a number, got {describe_value(value)}{hint}")


def _unstructure_float(value: Any) -> Any:
    if math.isfinite(value):
        return value
    raise Invalid(f"{value!r} cannot be written to a config file")


def _structure_bool(value: Any, _tp: Any) -> Any:
    if value is True or value is False:
        return value
    raise Invalid(f"expected a boolean (true or false), got {describe_value(value)}")


def _structure_str(value: Any, _tp: Any) -> Any:
    if type(value) is str:
        if value.isascii() or _utf8(value):
            return value
        raise Invalid(_NOT_UTF8.format(echo(value)))
    raise Invalid(f"expected a string, got {describe_value(value)}")


#: A string Python holds but UTF-8 cannot encode: a lone surrogate, which is how a shell's non-UTF-8 bytes
#: reach ``sys.argv``. Such text could not be written to a config file and read back, so it never enters.
_NOT_UTF8 = "{} is not valid UTF-8 text (it holds a lone surrogate, as from bytes that are not UTF-8)"


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unstructure_str(value: Any) -> Any:
    if value.isascii() or _utf8(value):
        return value
    raise Invalid(_NOT_UTF8.format(echo(value)) + " and cannot be written to a config file")


def _structure_none(value: Any, _tp: Any) -> Any:
    if value is None:
        return None
    raise Invalid(f"expected null, got {describe_value(value)}")


def choice_hint(value: str, choices: Sequence[str]) -> str:
    """A did-you-mean for a value that is not one of ``choices``: the choice it equals but for case
    (``8b`` -> ``8B``), else a close choice with the same digits. A choice with other digits is another size
    or version (``7B`` is not a typo of ``70B``), so it is never suggested; the message lists them all."""
    folded = [c for c in choices if c.casefold() == value.casefold()]
    if folded:
        return f"; did you mean {folded[0]!r}?"
    digits = _DIGITS.sub("", value)
    return did_you_mean(value, [c for c in choices if _DIGITS.sub("", c) == digits])


_DIGITS = re.compile(r"\D")


class _Literal(Rule):
    """``Literal[...]``: one of its values, matched by type and value (``1`` is not ``true``)."""

    def matches(self, tp: Any) -> bool:
        return typing.get_origin(tp) is Literal

    def pairs(self, tp: Any) -> list[tuple[Any, Any]]:
        """Each choice as a file gives it, with the value it structures as."""
        return [(c, c) for c in typing.get_args(tp)]

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        pairs = self.pairs(tp)
        members = {(type(given), given): made for given, made in pairs}
        words = [given for given, _ in pairs if isinstance(given, str)]
        shown = ", ".join(repr(given) for given, _ in pairs)

        def structure_choice(value: Any, _tp: Any) -> Any:
            if type(value) is tp:  # an Enum member, given in Python
                return value
            try:
                return members[(type(value), value)]
            except (KeyError, TypeError):  # TypeError: an unhashable value
                hint = choice_hint(value, words) if isinstance(value, str) else ""
                raise Invalid(f"expected one of {shown}, got {describe_value(value)}{hint}") from None

        return structure_choice

    def describe(self, tp: Any, wanted: bool = False) -> str:
        shown = [repr(given) for given, _ in self.pairs(tp)]
        return "one of " + ", ".join(shown) if wanted else " | ".join(shown)

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        return {"enum": [given for given, _ in self.pairs(tp)]}

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        return (all(isinstance(given, str) for given, _ in self.pairs(tp)),) * 2


class _Enum(_Literal):
    """An ``Enum`` is written as its member's value; a file gives the value, Python code the member."""

    def matches(self, tp: Any) -> bool:
        return isinstance(tp, type) and issubclass(tp, enum.Enum)

    def pairs(self, tp: Any) -> list[tuple[Any, Any]]:
        return [(m.value, m) for m in tp]

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        return operator.attrgetter("value")


class _Path(Rule):
    """A ``pathlib`` path is written as its text."""

    words = "a path (a string)"

    def matches(self, tp: Any) -> bool:
        return isinstance(tp, type) and issubclass(tp, pathlib.PurePath)

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        def structure_path(value: Any, _tp: Any) -> Any:
            if isinstance(value, pathlib.PurePath):
                value = str(value)
            if type(value) is str:
                return tp(_structure_str(value, str))
            raise Invalid(f"expected a path (a string), got {describe_value(value)}")

        return structure_path

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        return lambda value: _unstructure_str(str(value))

    def describe(self, tp: Any, wanted: bool = False) -> str:
        return "path"

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        return {"type": "string"}

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        return True, True


class _Union(Rule):
    """``X | Y``: the first member that takes the value; ``X | None`` reads as an optional ``X``."""

    def matches(self, tp: Any) -> bool:
        return union_args(tp) is not None

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        members = typing.cast(tuple[Any, ...], union_args(tp))
        nullable = type(None) in members
        rest = [(m, conv.get_structure_hook(m)) for m in members if m is not type(None)]
        if len(rest) == 1:
            ((only, hook),) = rest

            def structure_optional(value: Any, _tp: Any) -> Any:
                return None if value is None else hook(value, only)

            return structure_optional
        words = " or ".join(expected(m) for m in members)

        def structure_union(value: Any, _tp: Any) -> Any:
            if value is None and nullable:
                return None
            deep: list[Exception] = []
            for member, hook in rest:
                try:
                    return hook(value, member)
                except (ClassValidationError, IterableValidationError) as exc:
                    deep.append(exc)
                except Exception:
                    continue
            # A mapping or list can only have meant the one member that takes it: report its details.
            if len(deep) == 1:
                raise deep[0]
            raise Invalid(f"expected {words}, got {describe_value(value)}")

        return structure_union

    def describe(self, tp: Any, wanted: bool = False) -> str:
        members = typing.cast(tuple[Any, ...], union_args(tp))
        return " or ".join(map(expected, members)) if wanted else " | ".join(map(describe_type, members))

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        members = [type_schema(m, default_of) for m in typing.cast(tuple[Any, ...], union_args(tp))]
        # ``str | None``: one schema with a list of types, so that a validator names the broken bound
        # ("'' should be non-empty") instead of "not valid under any of the given schemas".
        kinds = [m.get("type") for m in members]
        if all(isinstance(k, str) for k in kinds) and len(set(kinds)) == len(kinds):
            merged: Schema = {"type": kinds}
            for member in members:
                if merged.keys() & member.keys() - {"type"}:
                    break
                merged.update({k: v for k, v in member.items() if k != "type"})
            else:
                return merged
        if all(set(m) == {"enum"} or m == {"type": "null"} for m in members):  # ``Literal[...] | None``
            return {"enum": [value for m in members for value in m.get("enum", [None])]}  # names the choices
        return {"anyOf": members}

    def reads_text(self, tp: Any) -> tuple[bool, bool]:
        bare, _ = strip_optional(tp)
        members = typing.cast(tuple[Any, ...], union_args(tp))
        return bare is not tp and takes_text(bare)[0], any(takes_text(m)[1] for m in members)

    def child(self, tp: Any, segment: str | int) -> Any:
        bare, _ = strip_optional(tp)
        return NO_CHILD if bare is tp else rule_for(bare).child(bare, segment)

    def names(self, tp: Any) -> list[str]:
        bare, _ = strip_optional(tp)
        return [] if bare is tp else rule_for(bare).names(bare)


def _items(value: Any, hooks: Iterable[tuple[Hook, Any]], tp: Any) -> list[Any]:
    """Structure every item of a sequence by its ``(hook, type)``; one ``IterableValidationError`` naming
    each bad index."""
    out, errors = [], []
    for i, (v, (hook, item_tp)) in enumerate(zip(value, hooks, strict=False)):  # repeat() never ends
        try:
            out.append(hook(v, item_tp))
        except Exception as exc:
            errors.append(at_index(exc, i, item_tp))
    if errors:
        raise IterableValidationError(f"While structuring {tp!r}", errors, tp)
    return out


class _FixedTuple(Rule):
    """``tuple[X, Y]``: a list of exactly that many items."""

    words = "a list"

    def matches(self, tp: Any) -> bool:
        args = typing.get_args(tp)
        return typing.get_origin(tp) is tuple and bool(args) and args[-1] is not Ellipsis

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        hooks = [(conv.get_structure_hook(t), t) for t in typing.get_args(tp)]
        size = len(hooks)

        def structure_fixed_tuple(value: Any, _tp: Any) -> Any:
            if not isinstance(value, (list, tuple)):
                raise Invalid(f"expected a list of {size} items, got {describe_value(value)}")
            if len(value) != size:
                raise Invalid(f"expected a list of {size} items, got {len(value)}")
            return tuple(_items(value, hooks, tp))

        return structure_fixed_tuple

    def describe(self, tp: Any, wanted: bool = False) -> str:
        return f"list[{', '.join(describe_type(a) for a in typing.get_args(tp))}]"

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        items = [type_schema(a, default_of) for a in typing.get_args(tp)]
        return {"type": "array", "prefixItems": items, "items": False, "minItems": len(items)}

    def child(self, tp: Any, segment: str | int) -> Any:
        args = typing.get_args(tp)
        return args[segment] if isinstance(segment, int) and segment < len(args) else NO_CHILD


_SEQUENCES: dict[Any, type] = {
    list: list,
    tuple: tuple,
    Sequence: tuple,
    frozenset: frozenset,
    set: frozenset,
    typing.List: list,  # noqa: UP006 - the bare generic aliases are annotations too
    typing.Tuple: tuple,  # noqa: UP006
    typing.FrozenSet: frozenset,  # noqa: UP006
    typing.Sequence: tuple,
}


class _Sequence(Rule):
    """``list[X]``, ``tuple[X, ...]``, ``Sequence[X]``, ``frozenset[X]`` and their bare forms: a YAML list."""

    words = "a list"

    def matches(self, tp: Any) -> bool:
        try:
            return (typing.get_origin(tp) or tp) in _SEQUENCES
        except TypeError:  # an unhashable annotation
            return False

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        make = _SEQUENCES[typing.get_origin(tp) or tp]
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item_tp = args[0] if args else Any
        hook = conv.get_structure_hook(item_tp)
        sets = make is frozenset
        word = "a list" if not sets else "a list (of distinct items)"

        def structure_sequence(value: Any, _tp: Any) -> Any:
            if not isinstance(value, (list, tuple)) and not (sets and isinstance(value, (set, frozenset))):
                raise Invalid(f"expected {word}, got {describe_value(value)}")
            out = _items(value, itertools.repeat((hook, item_tp)), tp)
            return out if make is list else make(out)

        return structure_sequence

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        item = _unstructure_any(conv)
        if issubclass(cls, (set, frozenset)):

            def unstructure_set(value: Any) -> Any:
                out = [item(v) for v in value]
                try:
                    return sorted(out)
                except TypeError:  # items of several types: any stable order will do
                    return sorted(out, key=repr)

            return unstructure_set
        return lambda value: [item(v) for v in value]

    def describe(self, tp: Any, wanted: bool = False) -> str:
        name = "set" if _SEQUENCES[typing.get_origin(tp) or tp] is frozenset else "list"
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return f"{name}[{', '.join(describe_type(a) for a in args)}]" if args else name

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        out: Schema = {"type": "array", "items": type_schema(args[0], default_of) if args else {}}
        if _SEQUENCES[typing.get_origin(tp) or tp] is frozenset:
            out["uniqueItems"] = True
        return out

    def child(self, tp: Any, segment: str | int) -> Any:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return (args[0] if args else Any) if isinstance(segment, int) else NO_CHILD


class _Mapping(Rule):
    """``dict[K, V]``, ``Mapping[K, V]``, bare ``dict`` (any mapping class): a YAML mapping, structured as a
    ``dict`` (never with a ``_target_``)."""

    words = "a mapping"

    def matches(self, tp: Any) -> bool:
        origin = typing.get_origin(tp) or tp
        return isinstance(origin, type) and issubclass(origin, Mapping)

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        args = typing.get_args(tp)
        key_tp, value_tp = args if args else (str, Any)
        key_hook, value_hook = conv.get_structure_hook(key_tp), conv.get_structure_hook(value_tp)

        def structure_mapping(value: Any, _tp: Any) -> Any:
            if not isinstance(value, Mapping):
                raise Invalid(f"expected a mapping, got {describe_value(value)}")
            out, errors = {}, []
            for k, v in value.items():
                seg = k if isinstance(k, str) else echo(k)
                if k == TARGET_KEY:
                    p = nested_target(())
                    errors.append(at_index(Invalid(p.message, p.anchor), seg, value_tp))
                    continue
                try:
                    out[key_hook(k, key_tp)] = value_hook(v, value_tp)
                except Exception as exc:
                    errors.append(at_index(exc, seg, value_tp))
            if errors:
                raise IterableValidationError(f"While structuring {tp!r}", errors, tp)
            return out

        return structure_mapping

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        item = _unstructure_any(conv)
        return lambda value: {k: item(v) for k, v in value.items()}

    def describe(self, tp: Any, wanted: bool = False) -> str:
        args = typing.get_args(tp)
        return f"mapping[{', '.join(describe_type(a) for a in args)}]" if args else "mapping"

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        args = typing.get_args(tp)
        return {"type": "object", "additionalProperties": type_schema(args[1], default_of) if args else {}}

    def child(self, tp: Any, segment: str | int) -> Any:
        args = typing.get_args(tp)
        return (args[1] if args else Any) if isinstance(segment, str) else NO_CHILD


class _Variants(Rule):
    """A base class whose subclasses are one field's variants, told apart by the value of one key.

    The base (not an attrs class) declares ``__variant_key__`` (the key: a dataset's ``source``) and
    ``__variants__`` (attrs classes, each with that key as a field whose default is the value naming it;
    the first is the one a mapping without the key means). A mapping is structured as the variant its
    key names, by that class's own hook (its validators and ``cross_check``). Unknown keys are the
    base's (``unknown field 'x' for Base``, the did-you-mean among every variant's fields); a field of
    another variant is dropped when it holds that field's default (a dump from when one class had every
    field), and otherwise refused in the chosen variant's words: ``variant.refuse(name, value)`` gives
    ``(field path, message)``. Variants are written by their own class: the key is their first field.
    """

    words = "a mapping"

    def matches(self, tp: Any) -> bool:
        return isinstance(tp, type) and not attrs.has(tp) and hasattr(tp, "__variant_key__")

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        facts = _variant_facts(tp)
        key, title = facts.key, tp.__qualname__
        tag_hook = conv.get_structure_hook(facts.tag_type)

        def field_problems(value: Mapping[str, Any], names: Iterable[str]) -> list[Problem]:
            return [p for n in names for p in check_shape(conv, facts.fields[n].type, value[n], (n,))]

        def structure_variant(value: Any, _tp: Any) -> Any:
            if not isinstance(value, Mapping):
                raise Invalid(f"expected a mapping for {title}, got {describe_value(value)}")
            problems = [_unknown_variant_key(k, title, facts) for k in value if k not in facts.fields]
            try:
                tag = tag_hook(value.get(key, facts.absent), facts.tag_type)
            except Exception as exc:
                problems += problems_of(exc, (key,))
                raise Problems(
                    f"invalid {title}", problems + field_problems(value, _given(facts, value))
                ) from None
            cls = facts.by_tag[tag]
            own = attrs.fields_dict(cls)
            if problems:  # an unknown key: every field checked by names and types, nothing constructed
                problems += check_shape(conv, cls, {k: v for k, v in value.items() if k in own}, ())
                problems += field_problems(value, [k for k in _given(facts, value) if k not in own])
                raise Problems(f"invalid {title}", problems)
            typed: list[Problem] = []
            refused: list[Problem] = []
            for name in facts.fields:
                if name in value and name not in own:
                    field = facts.fields[name]
                    try:
                        given = conv.get_structure_hook(field.type)(value[name], field.type)
                    except Exception as exc:
                        typed += problems_of(exc, (name,))
                        continue
                    if given != field.default:
                        path, message = cls.refuse(name, given)
                        refused.append(Problem((path,), message))
            mine = {k: v for k, v in value.items() if k in own}
            if not typed and not refused:
                return conv.get_structure_hook(cls)(mine, cls)
            try:
                conv.get_structure_hook(cls)(mine, cls)
            except CheckedGroup as exc:  # its own checks refused it: reported beside the foreign fields
                own_found, checked = problems_of(exc), True
            except Exception as exc:
                own_found, checked = problems_of(exc), False
            else:
                own_found, checked = [], True
            # As for one class: a value of the wrong type hides the rules between fields.
            found = [*refused, *own_found] if checked and not typed else [*typed, *own_found]
            raise Problems(f"invalid {title}", found)

        return structure_variant

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        return _unstructure_any(conv)

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        facts = _variant_facts(tp)
        branches = []
        for cls in facts.by_tag.values():
            branch = class_schema(cls, None, default_of)
            own = branch["properties"]
            tag = attrs.fields_dict(cls)[facts.key].default
            described = {k: v for k, v in own[facts.key].items() if k in ("description", "default")}
            own[facts.key] = {"const": tag, **described}  # the value naming this branch, nothing else
            for name, field in facts.fields.items():
                if name not in own:  # another variant's field: only its default, which is dropped
                    own[name] = {"const": default_of(field.default)}
            if tag is not facts.absent:
                branch["required"] = [*branch.get("required", []), facts.key]
            branches.append(branch)
        return {"anyOf": branches}

    def child(self, tp: Any, segment: str | int) -> Any:
        facts = _variant_facts(tp)
        if segment == facts.key:
            return facts.tag_type
        field = facts.fields.get(segment) if isinstance(segment, str) else None
        return NO_CHILD if field is None else field.type

    def names(self, tp: Any) -> list[str]:
        return list(_variant_facts(tp).fields)


class _VariantFacts(typing.NamedTuple):
    key: str
    #: Each variant by the value of its key.
    by_tag: dict[Any, Any]
    #: Every variant's fields by name, the first variant's first (the key), each new one where it appears.
    fields: dict[str, Any]
    #: The annotation of the key: one of the variants' values.
    tag_type: Any
    #: The value a mapping without the key means.
    absent: Any


@functools.cache
def _variant_facts(tp: Any) -> _VariantFacts:
    key = tp.__variant_key__
    by_tag: dict[Any, Any] = {}
    fields: dict[str, Any] = {}
    for cls in tp.__variants__:
        attrs.resolve_types(cls)
        own = {f.name: f for f in attrs.fields(cls) if f.init}
        by_tag[own[key].default] = cls
        for name, field in own.items():
            fields.setdefault(name, field)
    tags = [t for t in by_tag if t is not None]
    tag_type: Any = Literal[tuple(tags)]
    if None in by_tag:
        tag_type = tag_type | None
    absent = attrs.fields_dict(tp.__variants__[0])[key].default
    return _VariantFacts(key, by_tag, fields, tag_type, absent)


def _given(facts: _VariantFacts, value: Mapping[str, Any]) -> list[str]:
    """The known fields ``value`` gives besides the key, in the variants' order."""
    return [k for k in facts.fields if k in value and k != facts.key]


def _unknown_variant_key(key: object, title: str, facts: _VariantFacts) -> Problem:
    """An unknown key of a variant mapping, in the words of an unknown key of one class."""
    if key == TARGET_KEY or not isinstance(key, str):
        return unknown_key((), key, object)
    return Problem((key,), f"unknown field {echo(key)} for {title}{did_you_mean(key, facts.fields)}", "key")


class _Attrs(Rule):
    """An attrs class: a mapping of its fields, structured by cattrs' generated function."""

    words = "a mapping"

    def matches(self, tp: Any) -> bool:
        return isinstance(tp, type) and attrs.has(tp)

    def structure(self, tp: Any, conv: cattrs.Converter) -> Hook:
        return attrs_hook(tp, conv)

    def unstructure(self, cls: Any, conv: cattrs.Converter) -> Callable[[Any], Any]:
        return attrs_unstructure(cls, conv)

    def schema(self, tp: Any, default_of: Callable[[Any], Any]) -> Schema:
        return class_schema(tp, None, default_of)

    def child(self, tp: Any, segment: str | int) -> Any:
        if not isinstance(segment, str):
            return NO_CHILD
        return class_fields(tp).get(segment, NO_CHILD)

    def names(self, tp: Any) -> list[str]:
        return list(class_fields(tp))


def attrs_hook(cls: type, conv: cattrs.Converter, also: frozenset[str] = frozenset()) -> Hook:
    """The structure hook of attrs class ``cls``: one loop over its fields, and, for a mapping it refuses,
    cattrs' generated function, whose errors are completed and reported.

    ``also`` names keys the mapping may hold besides the fields (a root group's ``_target_``). A sound
    mapping goes through every field's hook, ``cls(**fields)`` (attrs' ``__init__``: every validator) and
    the class's ``cross_check``; at the first thing that fails, it is structured again the detailed way,
    which finds and names every problem. So errors read as cattrs' always did, and a valid document pays
    neither for their bookkeeping nor for generating cattrs' function (made the first time a mapping of
    ``cls`` is refused: 13% of a cold ``--dry-run``). A mapping with a name that is not known, here or at
    any depth below (a class with sections walks their names first), is checked by :func:`check_shape`
    alone, so no ``__init__``, ``__attrs_post_init__`` or validator of it or of any section runs (RFC 9.2).
    """
    attrs.resolve_types(cls)

    @functools.cache
    def generated() -> Hook:  # cattrs' function, made once
        return make_dict_structure_fn(
            cls, conv, _cattrs_forbid_extra_keys=False, _cattrs_detailed_validation=True
        )

    init_fields = [f for f in attrs.fields(cls) if f.init]
    types = {f.name: f.type for f in init_fields}
    allowed = frozenset(types) | also
    title = cls.__qualname__
    # The base's cross_check finds nothing: a class that keeps it is not asked.
    checked = getattr(cls, "cross_check", ConfigBase.cross_check) is not ConfigBase.cross_check

    def structure(value: Any, field_tp: Any) -> Any:
        return conv.get_structure_hook(field_tp)(value, field_tp)

    def names_unknown(value: Mapping[str, Any]) -> bool:
        return bool(check_shape(conv, cls, value, (), also, leaves=False))

    def shape_error(value: Mapping[str, Any]) -> ClassValidationError:
        """The mapping with a name not known at any depth: every problem :func:`check_shape` finds (which
        constructs nothing), noted as cattrs notes its own."""
        extra = {k for k in value if k not in allowed}
        errors: list[Exception] = [ForbiddenExtraKeysError("", cls, extra)] if extra else []
        for p in check_shape(conv, cls, value, (), also):
            name = p.path[0]
            if name in types:  # a field's own problem (an unknown key is reported above)
                missing = p.anchor == "parent" and len(p.path) == 1
                exc = KeyError(name) if missing else Invalid(p.message, p.anchor, p.path[1:])
                errors.append(at_attribute(exc, cls, str(name), types[name]))
        return ClassValidationError(f"While structuring {title}", errors, cls)

    def detailed(value: Any) -> Any:
        if type(value) is not dict and not isinstance(value, Mapping):
            raise Invalid(f"expected a mapping for {title}, got {describe_value(value)}")
        if not value.keys() <= allowed or names_unknown(value):
            raise shape_error(value)
        try:
            obj = generated()(value, cls)
        except ClassValidationError as exc:
            raise class_error(cls, value, list(exc.exceptions), structure, child_type) from None
        if checked:
            found = cross_check_errors(obj)
            if found:
                refused = CheckedGroup(f"While checking {title}", found, cls)
                refused.made = obj
                raise refused
        return obj

    if any(f.type is None for f in init_fields):  # no annotation: cattrs passes the value on
        return lambda value, _tp: detailed(value)
    fields = [(f.name, f.alias or f.name, conv.get_structure_hook(f.type), f.type) for f in init_fields]

    # Fields that build classes of their own: their names, at every depth, are known before any is built.
    nested = any(_holds_attrs(tp) for tp in types.values())

    def structure_attrs(o: Any, _tp: Any = None) -> Any:
        if type(o) is dict and o.keys() <= allowed and not (nested and names_unknown(o)):
            try:
                obj = cls(**{key: hook(o[name], tp) for name, key, hook, tp in fields if name in o})
                sound = not checked or next(iter(obj.cross_check()), None) is None
            except Exception:
                sound = False
            if sound:
                return obj
        return detailed(o)

    return structure_attrs


def _holds_attrs(tp: Any) -> bool:
    """Whether annotation ``tp`` is, or contains, an attrs class or variants of one (whose structuring
    would construct it); answered once per annotation (the name walk asks it of every field)."""
    try:
        return _holds_attrs_once(tp)
    except TypeError:  # an unhashable annotation
        return _holds_attrs_once.__wrapped__(tp)


@functools.cache
def _holds_attrs_once(tp: Any) -> bool:
    if isinstance(tp, type) and (attrs.has(tp) or _VARIANTS.matches(tp)):
        return True
    return any(_holds_attrs(a) for a in typing.get_args(tp))


def check_shape(
    conv: cattrs.Converter,
    tp: Any,
    value: Any,
    path: Path,
    also: frozenset[str] = frozenset(),
    leaves: bool = True,
) -> list[Problem]:
    """The problems of structuring ``value`` as ``tp`` found by names and types alone, constructing nothing.

    Every unknown or missing name at every depth and every value of the wrong type is reported, but no
    Config class is built, so no ``__init__`` or validator runs: a document with a key that is not known
    (an unknown field at any depth, a group without its ``_target_``) is checked this way, and nothing of
    it is called. Scalars and other leaves are checked by their structure hooks, which build no attrs
    instance; with ``leaves=False`` only names are checked (an unknown or missing one: the cheap walk that
    decides whether anything may be called). ``also`` names keys an attrs mapping may hold besides its
    fields (a root group's ``_target_``).
    """
    if not leaves and not _holds_attrs(tp):  # nothing below has names of its own
        return []
    bare, nullable = strip_optional(tp)
    if nullable and value is None:
        return []
    if isinstance(bare, type) and attrs.has(bare):
        if type(value) is not dict and not isinstance(value, Mapping):
            shown = f"expected a mapping for {bare.__qualname__}, got {describe_value(value)}"
            return [Problem(path, shown)] if leaves else []
        fields = {f.name: f for f in attrs.fields(attrs.resolve_types(bare)) if f.init}
        found = [unknown_key(path, k, bare) for k in value if k not in fields and k not in also]
        for name, f in fields.items():
            if name in value:
                found += check_shape(conv, f.type, value[name], (*path, name), leaves=leaves)
            elif f.default is attrs.NOTHING:
                found.append(Problem((*path, name), f"missing required field {name!r}", "parent"))
        return found
    if _VARIANTS.matches(bare) and isinstance(value, Mapping):
        facts = _variant_facts(bare)
        try:
            cls = facts.by_tag.get(value.get(facts.key, facts.absent))
        except TypeError:  # an unhashable value names no variant
            cls = None
        if cls is not None and value.keys() <= facts.fields.keys():  # the variant it names, by its fields
            own = attrs.fields_dict(cls)
            found = check_shape(conv, cls, {k: v for k, v in value.items() if k in own}, path, leaves=leaves)
            for name in _given(facts, value):
                if name not in own:
                    found += check_shape(
                        conv, facts.fields[name].type, value[name], (*path, name), leaves=leaves
                    )
            return found
        if not leaves:  # the names of every variant: its own hook reports the rest, constructing nothing
            unknown = [
                _unknown_variant_key(k, describe_type(bare), facts) for k in value if k not in facts.fields
            ]
            return [p._replace(path=(*path, *p.path)) for p in unknown]
    if isinstance(value, (list, tuple, Mapping)) and _holds_attrs(bare):
        rule = rule_for(bare)  # a list or mapping of sections: each item by the annotation overrides see
        below = [
            (k, v, rule.child(bare, k))
            for k, v in (value.items() if isinstance(value, Mapping) else enumerate(value))
        ]
        if isinstance(rule, (_Sequence, _Mapping)) and all(t is not NO_CHILD for _, _, t in below):
            return [p for k, v, t in below for p in check_shape(conv, t, v, (*path, k), leaves=leaves)]
    if not leaves:
        return []
    try:
        conv.get_structure_hook(tp)(value, tp)
    except Exception as exc:
        return problems_of(exc, path)
    return []


def class_fields(cls: type) -> dict[str, Any]:
    """Each ``init`` field's annotation of an attrs class, by name."""
    attrs.resolve_types(cls)
    return {f.name: f.type for f in attrs.fields(cls) if f.init}


def class_schema(cls: type, target: str | None, default_of: Callable[[Any], Any]) -> Schema:
    """The JSON schema of an attrs class's mapping; with ``target``, the mapping of a root group."""
    import inspect  # the schema is written by a command, never on the resolve path

    attrs.resolve_types(cls)
    props: Schema = {}
    required: list[str] = []
    if target is not None:
        props[TARGET_KEY] = {"const": target}
        required.append(TARGET_KEY)
    for f in attrs.fields(cls):
        if not f.init:
            continue
        prop = constrain_schema(type_schema(f.type, default_of), f.validator)
        if f.metadata.get("help"):
            prop["description"] = plain_text(f.metadata["help"])
        default = field_default(f)
        if default is attrs.NOTHING:
            required.append(f.name)
        elif (d := default_of(default)) is not None or default is None:
            prop["default"] = d
        props[f.name] = prop
    schema: Schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    if cls.__doc__:
        schema["description"] = plain_text(inspect.cleandoc(cls.__doc__).split("\n\n")[0])
    return schema


#: reST roles (``:class:`~a.B```, ``:func:`f```), literals (````x````) and emphasis, for :func:`plain_text`.
@functools.cache
def _rest_patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """reST roles and inline markup (compiled when help text is first written)."""
    return (
        re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)(?:\s*<([^`>]*)>)?`"),
        re.compile(r"``(.+?)``|\*\*(.+?)\*\*|(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])"),
    )


def plain_text(text: str) -> str:
    """``text`` without reST markup, for editors that show descriptions as they are: ````x```` -> ``x``,
    ``:class:`~a.b.C``` -> ``C``, ``:func:`title <a.f>``` -> ``title``, ``**x**`` and ``*x*`` -> ``x``."""

    def role(match: re.Match[str]) -> str:
        tilde, title, target = match.groups()
        if target is not None and title.strip():
            return title.strip()
        return title.rsplit(".", 1)[-1] if tilde else title

    rest_role, rest_markup = _rest_patterns()
    text = rest_role.sub(role, text)
    return rest_markup.sub(lambda m: next(g for g in m.groups() if g is not None), text)


#: attrs' comparison validators (``gt``, ``ge``, ``lt``, ``le``) as JSON schema keywords.
_BOUNDS = {">": "exclusiveMinimum", ">=": "minimum", "<": "exclusiveMaximum", "<=": "maximum"}
#: Length keywords by the JSON type they constrain.
_MIN_LENGTH = {"string": "minLength", "array": "minItems", "object": "minProperties"}
_MAX_LENGTH = {"string": "maxLength", "array": "maxItems", "object": "maxProperties"}


def constrain_schema(schema: Schema, validator: Any) -> Schema:
    """``schema`` narrowed by what attrs' built-in validators in ``validator`` require.

    ``gt``/``ge``/``lt``/``le`` become numeric bounds, ``min_len``/``max_len`` lengths, ``in_`` an enum,
    ``deep_iterable`` constrains the items, and ``and_``/``optional`` are followed (``optional``: the null
    branch stays open). A hand-written validator says what it accepts with a ``json_schema`` attribute (a
    schema every value must also match, e.g. ``-1`` or ``>= 1``); one without says nothing, and is skipped.
    """
    if validator is None:
        return schema
    shape = shape_of(validator)
    if shape.kind in ("all", "optional"):
        for inner in shape.members:
            schema = constrain_schema(schema, inner)
    elif shape.kind == "items":
        _on_items(schema, shape.member)
        schema = constrain_schema(schema, shape.outer)
    elif shape.kind == "bound" and shape.op in _BOUNDS:
        _narrow(schema, ("integer", "number"), _BOUNDS[shape.op], shape.bound)
    elif shape.kind == "min_len":
        for json_type, keyword in _MIN_LENGTH.items():
            _narrow(schema, (json_type,), keyword, shape.bound)
    elif shape.kind == "max_len":
        for json_type, keyword in _MAX_LENGTH.items():
            _narrow(schema, (json_type,), keyword, shape.bound)
    elif shape.kind == "one_of" and isinstance(shape.options, (list, tuple, frozenset, set)):
        options = list(shape.options)
        if all(isinstance(o, (str, int, float, bool)) or o is None for o in options):
            _narrow(schema, None, "enum", options)
    elif isinstance(extra := getattr(validator, "json_schema", None), dict):
        schema = {**schema, "allOf": [*schema.get("allOf", []), extra]}
    return schema


def _branches(schema: Schema) -> list[Schema]:
    """The non-null branches of a union's schema, or the schema itself."""
    if "anyOf" in schema:
        return [b for sub in schema["anyOf"] if sub.get("type") != "null" for b in _branches(sub)]
    return [schema]


def _on_items(schema: Schema, member: Any) -> None:
    for branch in _branches(schema):
        if "prefixItems" in branch:
            branch["prefixItems"] = [constrain_schema(item, member) for item in branch["prefixItems"]]
        elif isinstance(branch.get("items"), dict):
            branch["items"] = constrain_schema(branch["items"], member)


def _narrow(schema: Schema, json_types: tuple[str, ...] | None, keyword: str, value: Any) -> None:
    """Add ``keyword: value`` to the branches of ``json_types`` (all with None), keeping the tighter bound."""
    for branch in _branches(schema):
        kinds = branch.get("type")
        if json_types is not None and not set(json_types) & set(
            kinds if isinstance(kinds, list) else [kinds]
        ):
            continue
        old = branch.get(keyword)
        if old is None:
            branch[keyword] = value
        elif keyword in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
            branch[keyword] = max(old, value)
        elif keyword in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
            branch[keyword] = min(old, value)
        elif keyword == "enum":
            branch[keyword] = [v for v in old if v in value]


def _unstructure_any(conv: cattrs.Converter) -> Callable[[Any], Any]:
    """Unstructure by each value's runtime class (a field typed with a base class holds a subclass)."""
    hook = conv.get_unstructure_hook
    return lambda value: hook(value.__class__)(value)


def attrs_unstructure(cls: type, conv: cattrs.Converter, target: str | None = None) -> Callable[[Any], Any]:
    """The unstructure hook of attrs class ``cls``: each ``init`` field by its value's runtime class (a
    failure names its field). With ``target``, the mapping starts with that ``_target_`` (a root group's)."""
    fields = [(f.name, f.type) for f in attrs.fields(cls) if f.init]
    item = _unstructure_any(conv)

    def unstructure(obj: Any) -> Any:
        out: dict[str, Any] = {} if target is None else {TARGET_KEY: target}
        errors = []
        for name, tp in fields:
            try:
                out[name] = item(getattr(obj, name))
            except Exception as exc:
                errors.append(at_attribute(exc, cls, name, tp))
        if errors:
            raise ClassValidationError(f"While unstructuring {cls.__qualname__}", errors, cls)
        return out

    return unstructure


#: The table, most specific first (an ``IntEnum`` is an ``Enum`` before it is an ``int``).
RULES: tuple[Rule, ...] = (
    _Any(),
    _Enum(),
    _Scalar(bool, "bool", "a boolean (true or false)", {"type": "boolean"}, _structure_bool),
    _Scalar(
        int,
        "int",
        "an integer",
        {"type": "integer", "minimum": -INT_LIMIT - 1, "maximum": INT_LIMIT},
        _structure_int,
    ),
    _Scalar(float, "float", "a number", {"type": "number"}, _structure_float),
    _Scalar(str, "str", "a string", {"type": "string"}, _structure_str),
    _Scalar(type(None), "null", "null", {"type": "null"}, _structure_none),
    _Path(),
    _Literal(),
    _Union(),
    _FixedTuple(),
    _Sequence(),
    _Mapping(),
    _Variants(),
    _Attrs(),
)
_UNSUPPORTED = Rule()
_VARIANTS = next(rule for rule in RULES if isinstance(rule, _Variants))


def rule_for(tp: Any) -> Rule:
    """The rule answering for annotation ``tp`` (a rule refusing every value if none does)."""
    for rule in RULES:
        if rule.matches(tp):
            return rule
    return _UNSUPPORTED


def describe_type(tp: Any) -> str:
    """Readable name of an annotation for messages and ``--help``: ``int | None``, ``'a' | 'b'`` ..."""
    return rule_for(tp).describe(tp)


def expected(tp: Any) -> str:
    """What an "expected ..." message asks for: ``an integer``, ``one of 'a', 'b'``, ``a mapping``."""
    rule = rule_for(tp)
    return rule.words or rule.describe(tp, wanted=True)


def type_schema(tp: Any, default_of: Callable[[Any], Any]) -> Schema:
    """The JSON schema of one annotation, as strict as its structure hook."""
    return rule_for(tp).schema(tp, default_of)


def takes_text(tp: Any) -> tuple[bool, bool]:
    """How command-line text for ``tp`` is read: ``(as_is, may_stay_text)``.

    ``as_is``: the text is the value (``str``, a path, a string ``Literal``). Otherwise the text is parsed as
    a YAML scalar; ``may_stay_text``: when the parsed value does not fit, the text itself is tried.
    """
    return rule_for(tp).reads_text(tp)


def child_type(tp: Any, segment: str | int) -> Any:
    """The annotation one override path segment below ``tp``, or :data:`NO_CHILD`."""
    return rule_for(tp).child(tp, segment)


def child_names(tp: Any) -> list[str]:
    """The names one level below ``tp`` (attrs fields), to suggest for a misspelled segment."""
    return rule_for(tp).names(tp)


def register_rules(conv: cattrs.Converter) -> None:
    """Make every rule of the table the converter's hook for the annotations it matches.

    Factories registered later win in cattrs, so the table is registered from its end; each rule's
    ``structure``/``unstructure`` is a cattrs hook factory that takes the converter as its second argument.
    cattrs keeps its coercing hooks for ``int``, ``float``, ``str``, ``bytes`` and ``Path`` in a class
    dispatch that is asked before any factory and also answers for subclasses (an ``IntEnum`` would be read
    by ``int(value)``), so those entries are overridden with cattrs' own "no hook here" marker: every
    annotation reaches the table.
    """
    for rule in (_UNSUPPORTED, *reversed(RULES)):
        conv.register_structure_hook_factory(rule.matches, rule.structure)
        conv.register_unstructure_hook_factory(rule.matches, rule.unstructure)
    for cls in (int, float, str, bytes, pathlib.Path):
        conv.register_structure_hook(cls, _DispatchNotFound)  # type: ignore[arg-type]
    for cls in (str, bytes, pathlib.Path):
        conv.register_unstructure_hook(cls, _DispatchNotFound)  # type: ignore[arg-type]
