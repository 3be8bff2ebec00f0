"""The one adapter between attrs' built-in validators and the config layer.

attrs' validators (``gt``, ``ge``, ``lt``, ``le``, ``min_len``, ``max_len``, ``in_``, ``instance_of``,
``is_callable``, ``matches_re``, and the combinators ``and_``, ``optional``, ``deep_iterable``) are
private classes whose failures are ``ValueError``/``TypeError`` with a message and positional arguments.
This module is the only place that knows those classes: :func:`shape_of` reads a validator into a
:class:`Shape` (what it requires, as data), and :func:`violation` turns a failure of a leaf validator into
a :class:`~hyper_parallel._checks.RuleViolation`, the structured error our own validators raise. The
JSON schema (:func:`hyper_parallel.config.types.constrain_schema`) and the messages
(:mod:`hyper_parallel.config.validation`) are both built from these, never from attrs' message text.
``tests/config/test_attrs_adapter.py`` pins what this reads, so an attrs release that changes it fails there.

:func:`fast_validators` is the ``field_transformer`` of every Config class: it replaces each field's
bound, length and callable check, and each ``optional``/``and_``/``deep_iterable`` of them, with one plain
function that tests the value inline and calls the attrs validator only for a value that fails (so the
error is attrs' own, word for word). attrs calls a validator object through its ``__call__``, and a
combinator through one more per member: a third of constructing a Config was spent there.
"""

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import attr.validators as _attrs_validators
import attrs

from hyper_parallel._checks import RuleTypeViolation, RuleViolation

__all__ = ["Kind", "Shape", "fast_validators", "inline_check", "shape_of", "violation"]

Kind = Literal[
    "bound",
    "min_len",
    "max_len",
    "one_of",
    "instance_of",
    "callable",
    "regex",  # leaves
    "all",
    "optional",
    "items",  # combinators
    "other",  # a validator this module does not know: ours (raising RuleViolation) or a third party's
]


class Shape(NamedTuple):
    """What one validator requires, read from attrs' private attributes.

    ``op`` and ``bound`` for a comparison or a length (``">="``, ``0``), ``options`` for ``in_`` (what
    was given to it: a collection, or any container such as an ``Enum`` class), ``types``
    for ``instance_of``, ``pattern`` for ``matches_re``; ``members`` the validators an ``and_`` combines
    (or the one ``optional`` wraps), ``member``/``outer`` a ``deep_iterable``'s item and whole-value
    validators (``outer`` may be None).
    """

    kind: Kind
    op: str = ""
    bound: Any = None
    options: Any = None
    types: Any = None
    pattern: str = ""
    members: tuple[Any, ...] = ()
    member: Any = None
    outer: Any = None


def _private(name: str) -> type | None:
    """attrs' private validator class ``name``, or None when this attrs release has none by that name."""
    found = getattr(_attrs_validators, name, None)
    return found if isinstance(found, type) else None


_NUMBER = _private("_NumberValidator")
_MIN_LEN = _private("_MinLengthValidator")
_MAX_LEN = _private("_MaxLengthValidator")
_IN = _private("_InValidator")
_INSTANCE_OF = _private("_InstanceOfValidator")
_CALLABLE = _private("_IsCallableValidator")
_REGEX = _private("_MatchesReValidator")
_AND = _private("_AndValidator")
_OPTIONAL = _private("_OptionalValidator")
_DEEP_ITERABLE = _private("_DeepIterable")

_OTHER = Shape("other")


def shape_of(validator: Any) -> Shape:
    """What ``validator`` requires; a list of validators (attrs accepts one for a field) is their ``and_``."""
    if isinstance(validator, (list, tuple)):
        return Shape("all", members=tuple(validator))
    validator = getattr(validator, "__wrapped__", validator)  # a fast check reads as what it checks
    cls = type(validator)
    if cls is _NUMBER:
        return Shape("bound", op=validator.compare_op, bound=validator.bound)
    if cls is _MIN_LEN:
        return Shape("min_len", op=">=", bound=validator.min_length)
    if cls is _MAX_LEN:
        return Shape("max_len", op="<=", bound=validator.max_length)
    if cls is _IN:
        return Shape("one_of", options=validator.options)
    if cls is _INSTANCE_OF:
        return Shape("instance_of", types=validator.type)
    if cls is _CALLABLE:
        return Shape("callable")
    if cls is _REGEX:
        return Shape("regex", pattern=validator.pattern.pattern)
    if cls is _AND:
        return Shape("all", members=tuple(validator._validators))
    if cls is _OPTIONAL:
        return Shape("optional", members=(validator.validator,))
    if cls is _DEEP_ITERABLE:
        return Shape("items", member=validator.member_validator, outer=validator.iterable_validator)
    return _OTHER


def _type_names(types: Any) -> str:
    if isinstance(types, tuple):
        return " or ".join(_type_names(t) for t in types)
    return getattr(types, "__qualname__", repr(types))


def violation(validator: Any, field: str, value: object, exc: BaseException) -> RuleViolation:
    """The failure ``exc`` of leaf ``validator`` on ``value`` as a :class:`RuleViolation` of ``field``,
    worded from the validator's data; ``exc`` itself when it is one (our validators), its text for a
    validator this module does not know."""
    if isinstance(exc, RuleViolation):
        return exc
    shape = shape_of(validator)
    if shape.kind == "bound":
        return RuleViolation(
            field, f"must be {shape.op} {shape.bound}", value, bound=shape.bound, shown=f"{value}"
        )
    if shape.kind in ("min_len", "max_len"):
        if shape.kind == "min_len" and shape.bound == 1:
            return RuleViolation(field, "must not be empty", value, bound=1, shown=None)
        length = len(value) if hasattr(value, "__len__") else value
        rule = f"length must be {shape.op} {shape.bound}"
        return RuleViolation(field, rule, value, bound=shape.bound, shown=f"{length}")
    if shape.kind == "one_of":
        options = shape.options
        shown = list(options) if isinstance(options, (list, tuple, set, frozenset)) else options
        return RuleViolation(field, f"must be one of {shown!r}", value)
    if shape.kind == "instance_of":
        got = f"{RuleViolation(field, '', value).shown} ({type(value).__qualname__})"
        return RuleTypeViolation(field, f"must be {_type_names(shape.types)}", value, shown=got)
    if shape.kind == "callable":
        return RuleTypeViolation(field, "must be callable", value)
    if shape.kind == "regex":
        return RuleViolation(field, f"must match {shape.pattern!r}", value)
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    return RuleViolation(field, text, value, shown=None)


Validator = Callable[[Any, Any, Any], None]


def _bounds(validator: Any) -> tuple[tuple[str, Callable[[Any, Any], bool], Any], ...] | None:
    """The ``(operator, compare, bound)`` of a bound, or of each bound of an ``and_`` of at most two;
    None otherwise."""
    cls = type(validator)
    if cls is _NUMBER:
        return ((validator.compare_op, validator.compare_func, validator.bound),)
    if cls is _AND and 1 <= len(validator._validators) <= 2:
        pairs = tuple(_bounds(v) for v in validator._validators)
        if all(p is not None and len(p) == 1 for p in pairs):
            return tuple(p[0] for p in pairs if p is not None)
    return None


def _min_length(validator: Any) -> int | None:
    found: int | None = getattr(validator, "min_length", None) if type(validator) is _MIN_LEN else None
    return found


def _test(validator: Any) -> Callable[[Any], bool] | None:
    """A one-argument test equal to ``validator`` passing (a bound pair, two, or a minimum length), for the
    items of a ``deep_iterable``; None for anything else."""
    pairs = _bounds(validator)
    if pairs is not None and len(pairs) == 1:
        ((_, compare, bound),) = pairs
        return lambda value: compare(value, bound)
    if pairs is not None:
        (_, compare, bound), (_, compare2, bound2) = pairs
        return lambda value: compare(value, bound) and compare2(value, bound2)
    n = _min_length(validator)
    if n is not None:
        return lambda value: len(value) >= n
    return None


def fast(validator: Any) -> Any:
    """A plain function accepting what ``validator`` accepts and calling it on anything else (so it raises
    attrs' own error), for the shapes Config fields use; ``validator`` itself for any other. A shape and
    its ``optional`` are written apart: testing a flag inside one function would cost every field a step."""
    if validator is None or hasattr(validator, "__wrapped__"):
        return validator
    optional = type(validator) is _OPTIONAL
    inner = validator.validator if optional else validator
    pairs = _bounds(inner)
    n = _min_length(inner)
    check: Validator
    if pairs is not None and len(pairs) == 1:
        ((_, compare, bound),) = pairs
        if optional:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if value is not None and not compare(value, bound):
                    validator(inst, attr, value)

        else:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if not compare(value, bound):
                    validator(inst, attr, value)

    elif pairs is not None:
        (_, compare, bound), (_, compare2, bound2) = pairs

        def check(inst: Any, attr: Any, value: Any) -> None:
            if not (value is None and optional) and not (compare(value, bound) and compare2(value, bound2)):
                validator(inst, attr, value)

    elif n is not None:
        if optional:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if value is not None and len(value) < n:
                    validator(inst, attr, value)

        else:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if len(value) < n:
                    validator(inst, attr, value)

    elif type(inner) is _CALLABLE:
        if optional:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if value is not None and not callable(value):
                    validator(inst, attr, value)

        else:

            def check(inst: Any, attr: Any, value: Any) -> None:
                if not callable(value):
                    validator(inst, attr, value)

    elif type(validator) is _DEEP_ITERABLE and validator.iterable_validator is None:  # type: ignore[attr-defined]
        member = validator.member_validator  # type: ignore[attr-defined]
        test = _test(member)
        if test is None:
            return validator

        def check(inst: Any, attr: Any, value: Any) -> None:
            for item in value:
                if not test(item):
                    member(inst, attr, item)  # the item attrs would stop at, with attrs' message

    else:
        return validator
    check.__wrapped__ = validator  # type: ignore[attr-defined]
    return check


#: The comparisons attrs' bounds make, as Python operators.
_OPERATORS = frozenset({"<", "<=", ">", ">="})


def inline_check(validator: Any, name: str) -> tuple[str, dict[str, Any]] | None:
    """A Python condition on ``v`` that is true exactly when ``validator`` accepts ``v``, and the names it
    reads (``name``, ``name`` + ``"_2"``), for a structure function that tests a field in place; None for a
    shape that has none (the validator is then called). A condition that raises counts as false."""
    validator = getattr(validator, "__wrapped__", validator)
    optional = type(validator) is _OPTIONAL
    inner = validator.validator if optional else validator
    pairs = _bounds(inner)
    n = _min_length(inner)
    scope: dict[str, Any] = {}
    if pairs is not None:
        if not all(op in _OPERATORS for op, _, _ in pairs):
            return None
        terms = []
        for i, (op, _, bound) in enumerate(pairs):
            key = name if i == 0 else f"{name}_2"
            scope[key] = bound
            terms.append(f"v {op} {key}")
        test = " and ".join(terms)
    elif n is not None:
        scope[name] = n
        test = f"len(v) >= {name}"
    elif type(inner) is _CALLABLE:
        test = "callable(v)"
    else:
        return None
    return (f"v is None or ({test})" if optional else test), scope


def fast_validators(cls: type, fields: list[attrs.Attribute]) -> list[attrs.Attribute]:  # type: ignore[type-arg]
    """attrs ``field_transformer``: each field's validator as :func:`fast` makes it (see the module doc)."""
    out = []
    for f in fields:
        quick = fast(f.validator)  # an inherited field's is fast already: kept as it is
        out.append(f if quick is f.validator else f.evolve(validator=quick))
    return out
