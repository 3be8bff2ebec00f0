"""Small validators and helpers shared by the config classes.

attrs ships range validators (``gt``, ``ge`` ...) but nothing for the "-1 means auto/latest/all" idiom
that training configs use everywhere, so it lives here once. Messages follow attrs' own shape,
``'name' must ...: value``, so the resolver can strip the field name and show the rule at the field path.
This module imports attrs only.
"""

from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["minus_one_or_at_least", "positive_or_auto"]


def positive_or_auto(instance: object, attribute: "attrs.Attribute[Any]", value: int) -> None:
    """attrs validator: a parallel degree is ``>= 1``, or ``-1`` to infer it from the world size."""
    if value != -1 and value < 1:
        raise ValueError(f"'{attribute.name}' must be >= 1, or -1 for auto: {value!r}")


#: What the JSON schema says of the values a validator accepts (read by ``hyper_parallel.config.schema``).
positive_or_auto.json_schema = {"if": {"not": {"const": -1}}, "then": {"minimum": 1}}  # type: ignore[attr-defined]


def minus_one_or_at_least(
    minimum: int, meaning: str
) -> Callable[[object, "attrs.Attribute[Any]", int], None]:
    """An attrs validator accepting ``value >= minimum`` or the sentinel ``-1`` (which means ``meaning``)."""

    def minus_one_or_at_least_validator(
        instance: object, attribute: "attrs.Attribute[Any]", value: int
    ) -> None:
        if value != -1 and value < minimum:
            raise ValueError(f"'{attribute.name}' must be >= {minimum}, or -1 for {meaning}: {value!r}")

    minus_one_or_at_least_validator.__qualname__ = f"minus_one_or_at_least({minimum}, {meaning!r})"
    schema = {"if": {"not": {"const": -1}}, "then": {"minimum": minimum}}
    minus_one_or_at_least_validator.json_schema = schema  # type: ignore[attr-defined]
    return minus_one_or_at_least_validator
