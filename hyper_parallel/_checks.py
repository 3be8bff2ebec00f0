"""Small validators shared by the config classes, and the structured error every validator of ours raises.

attrs ships range validators (``gt``, ``ge`` ...) but nothing for the "-1 means auto/latest/all" idiom
that training configs use everywhere, so it lives here once. A validator of ours raises
:class:`RuleViolation`: the field, the rule, the bound and the value as data, so the config layer words
the failure at the field's path (``must be >= 1, or -1 for auto, got 0``) without reading the text back;
``str()`` of it keeps attrs' own shape (``'tp' must be >= 1, or -1 for auto: 0``) for code that builds a
Config directly. :class:`Quote` and :func:`said` do the same for the messages of cross-field rules: a
message quoting another field's value carries that field's path and value as data, so the config layer can
say which override set it. This module imports attrs only.
"""

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

__all__ = [
    "Quote",
    "RuleTypeViolation",
    "RuleViolation",
    "Said",
    "counted",
    "minus_one_or_at_least",
    "positive_or_auto",
    "quote",
    "rebased",
    "said",
    "unread_while_off",
]

_UNSHOWN: Any = object()


class RuleViolation(ValueError):
    """A value that breaks the rule of field ``field``, as data.

    ``rule`` says what is required (``"must be >= 1, or -1 for auto"``), ``bound`` is the number the rule
    compares with (None without one), ``value`` is what was given and ``shown`` how the message shows it
    (``repr(value)`` by default; None leaves it out, as in ``"must not be empty"``).
    """

    def __init__(
        self, field: str, rule: str, value: object, *, bound: object = None, shown: str | None = _UNSHOWN
    ) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        self.bound = bound
        self.shown: str | None = _echo(value) if shown is _UNSHOWN else shown
        super().__init__(f"'{field}' {rule}: {_echo(value)}")

    @property
    def message(self) -> str:
        """The failure in the project's words, for the field's path: ``must be > 0, got -1``."""
        return self.rule if self.shown is None else f"{self.rule}, got {self.shown}"

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self.field, self.rule, self.value, self.bound, self.shown))


class RuleTypeViolation(RuleViolation, TypeError):
    """A :class:`RuleViolation` of a value of the wrong kind (attrs raises ``TypeError`` for those)."""


def _rebuild(
    cls: type[RuleViolation], field: str, rule: str, value: object, bound: object, shown: str | None
) -> RuleViolation:
    return cls(field, rule, value, bound=bound, shown=shown)


def _echo(value: object) -> str:
    """``repr(value)``, cut to 80 characters so hostile input cannot flood a message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:68] + f"... ({len(text)} chars)"


def positive_or_auto(instance: object, attribute: "attrs.Attribute[Any]", value: int) -> None:
    """attrs validator: a parallel degree is ``>= 1``, or ``-1`` to infer it from the world size."""
    if value != -1 and value < 1:
        raise RuleViolation(attribute.name, "must be >= 1, or -1 for auto", value, bound=1)


#: What the JSON schema says of the values a validator accepts (read by ``hyper_parallel.config.schema``).
positive_or_auto.json_schema = {"if": {"not": {"const": -1}}, "then": {"minimum": 1}}  # type: ignore[attr-defined]


def minus_one_or_at_least(
    minimum: int, meaning: str
) -> Callable[[object, "attrs.Attribute[Any]", int], None]:
    """An attrs validator accepting ``value >= minimum`` or the sentinel ``-1`` (which means ``meaning``)."""
    rule = f"must be >= {minimum}, or -1 for {meaning}"

    def minus_one_or_at_least_validator(
        instance: object, attribute: "attrs.Attribute[Any]", value: int
    ) -> None:
        if value != -1 and value < minimum:
            raise RuleViolation(attribute.name, rule, value, bound=minimum)

    minus_one_or_at_least_validator.__qualname__ = f"minus_one_or_at_least({minimum}, {meaning!r})"
    schema = {"if": {"not": {"const": -1}}, "then": {"minimum": minimum}}
    minus_one_or_at_least_validator.json_schema = schema  # type: ignore[attr-defined]
    return minus_one_or_at_least_validator


@attrs.frozen
class Quote:
    """Another field's value quoted in a message: shown as ``NAME (VALUE)``.

    ``path`` is the field's dotted path, relative to the object whose rule says the message (the root
    config for its own rules, a section for its ``cross_check``; the config layer rebases it to the root);
    ``name`` is how the message names it (the path itself unless given); ``origin`` is the override that set
    the value, filled in by the config layer: ``NAME (VALUE, set by ORIGIN)``.
    """

    path: str
    value: object
    name: str | None = None
    origin: str | None = None

    def text(self) -> str:
        """``NAME (VALUE)``, or ``NAME (VALUE, set by ORIGIN)`` when an override set the value."""
        shown = f"{self.value}" if self.origin is None else f"{self.value}, set by {self.origin}"
        return f"{self.name or self.path} ({shown})"


def quote(path: str, value: object, name: str | None = None) -> Quote:
    """A :class:`Quote` of the field at ``path`` holding ``value``, for :func:`said`."""
    return Quote(path, value, name)


class Said(str):
    """A message built of text and :class:`Quote` parts: a ``str`` (the text a user reads) that keeps its
    parts as data, so the quotes can be rebased to the root and cite the overrides that set them."""

    parts: tuple["str | Quote", ...]

    def __new__(cls, parts: tuple["str | Quote", ...]) -> "Said":
        self = super().__new__(cls, "".join(p if isinstance(p, str) else p.text() for p in parts))
        self.parts = parts
        return self

    @property
    def quotes(self) -> tuple[Quote, ...]:
        """The quoted fields, in the order the message shows them."""
        return tuple(p for p in self.parts if isinstance(p, Quote))

    def __reduce__(self) -> Any:
        return (Said, (self.parts,))


def rebased(message: str, prefix: str) -> str:
    """``message`` as seen from the parent of the object at the dotted path ``prefix``: the fields a
    :class:`Said` message quotes get ``prefix.`` in front (a plain message, or an empty prefix, changes
    nothing). A rule that passes on a section's messages under its own path passes them through this."""
    if not prefix or not isinstance(message, Said):
        return message
    return Said(
        tuple(
            p if isinstance(p, str) else attrs.evolve(p, path=f"{prefix}.{p.path}", name=p.name or p.path)
            for p in message.parts
        )
    )


def said(*parts: "str | Quote") -> Said:
    """A message of ``parts``: ``said("must be <= ", quote("training.max_steps", 10), ", got 200")`` reads
    ``must be <= training.max_steps (10), got 200`` and knows which field it quoted."""
    return Said(tuple(parts))


def counted(n: int, noun: str) -> str:
    """``n`` with ``noun`` in the number it takes: ``1 step``, ``3 steps``, ``0 steps``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def unread_while_off(
    instance: Any, fields: Iterable[str], *, switch: str, on: bool, when: str | None = None
) -> Iterator[tuple[str, str]]:
    """``(field, message)`` for each of ``fields`` that holds a value of its own while its sink is off.

    One rule for every sink (metrics' files, the profiler, checkpoints, the flight recorder): an option of
    a sink that is off is refused, never quietly ignored, so a ``jsonl_path`` without ``enable_jsonl`` is
    an error rather than a run whose metrics went nowhere. ``on`` says whether the sink is on; ``switch``
    names what turns it on (``when``: how to say it, default ``SWITCH is true``). A field counts as set
    when it differs from its class default (a config cannot tell a default written out from one left out).
    """
    if on:
        return
    condition = when or f"{switch} is true"
    for field in attrs.fields(type(instance)):
        if field.name not in fields:
            continue
        default = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default  # type: ignore[arg-type]
        if getattr(instance, field.name) != default:
            yield (
                field.name,
                f"is only read when {condition} (it is not): set {switch} too, or leave {field.name} out",
            )
