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
"""

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import attr.validators as _attrs_validators

from hyper_parallel._checks import RuleTypeViolation, RuleViolation

__all__ = ["Kind", "Shape", "shape_of", "violation"]

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


#: How each of attrs' validator classes reads as a :class:`Shape`, by the class's (private) name.
_READERS: dict[type | None, Callable[[Any], Shape]] = {
    _private("_NumberValidator"): lambda v: Shape("bound", op=v.compare_op, bound=v.bound),
    _private("_MinLengthValidator"): lambda v: Shape("min_len", op=">=", bound=v.min_length),
    _private("_MaxLengthValidator"): lambda v: Shape("max_len", op="<=", bound=v.max_length),
    _private("_InValidator"): lambda v: Shape("one_of", options=v.options),
    _private("_InstanceOfValidator"): lambda v: Shape("instance_of", types=v.type),
    _private("_IsCallableValidator"): lambda v: Shape("callable"),
    _private("_MatchesReValidator"): lambda v: Shape("regex", pattern=v.pattern.pattern),
    _private("_AndValidator"): lambda v: Shape("all", members=tuple(v._validators)),
    _private("_OptionalValidator"): lambda v: Shape("optional", members=(v.validator,)),
    _private("_DeepIterable"): lambda v: Shape(
        "items", member=v.member_validator, outer=v.iterable_validator
    ),
}
_OTHER = Shape("other")


def shape_of(validator: Any) -> Shape:
    """What ``validator`` requires; a list of validators (attrs accepts one for a field) is their ``and_``."""
    if isinstance(validator, (list, tuple)):
        return Shape("all", members=tuple(validator))
    read = _READERS.get(type(validator))  # a class this attrs release lacks is keyed None: never found
    return _OTHER if read is None else read(validator)


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
