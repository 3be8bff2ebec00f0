"""The one adapter to attrs' private validator classes reads what this attrs release exposes, and the user
sees each failure in the project's words; our own validators raise structured errors."""

import pickle
from typing import Any

import attrs
import pytest

from hyper_parallel._checks import (
    RuleTypeViolation,
    RuleViolation,
    minus_one_or_at_least,
    positive_or_auto,
)
from hyper_parallel.config.attrs_validators import shape_of, violation
from hyper_parallel.config.validation import _check_value

V = attrs.validators


@attrs.define
class _Holder:
    x: object = None


FIELD = attrs.fields(_Holder).x


def messages(validator: Any, value: object) -> list[tuple[tuple[object, ...], str]]:
    return [(p.path, p.message) for p in _check_value(validator, None, FIELD, value)]


@pytest.mark.parametrize(
    ("validator", "expected"),
    [
        pytest.param(V.gt(0), {"kind": "bound", "op": ">", "bound": 0}, id="gt"),
        pytest.param(V.ge(0.0), {"kind": "bound", "op": ">=", "bound": 0.0}, id="ge"),
        pytest.param(V.lt(1.0), {"kind": "bound", "op": "<", "bound": 1.0}, id="lt"),
        pytest.param(V.le(3), {"kind": "bound", "op": "<=", "bound": 3}, id="le"),
        pytest.param(V.min_len(1), {"kind": "min_len", "op": ">=", "bound": 1}, id="min_len"),
        pytest.param(V.max_len(2), {"kind": "max_len", "op": "<=", "bound": 2}, id="max_len"),
        pytest.param(V.in_(["a", "b"]), {"kind": "one_of"}, id="in_"),
        pytest.param(V.instance_of(int), {"kind": "instance_of", "types": int}, id="instance_of"),
        pytest.param(V.is_callable(), {"kind": "callable"}, id="is_callable"),
        pytest.param(V.matches_re("a+"), {"kind": "regex", "pattern": "a+"}, id="matches_re"),
    ],
)
def test_the_adapter_reads_each_attrs_leaf_validator(validator: Any, expected: dict[str, Any]) -> None:
    shape = shape_of(validator)
    assert {key: getattr(shape, key) for key in expected} == expected


def test_the_adapter_reads_the_attributes_it_relies_on_by_their_attrs_names() -> None:
    # What ``shape_of`` reads; an attrs release renaming one fails here, not in a user's message.
    assert (V.ge(0).bound, V.ge(0).compare_op) == (0, ">=")
    assert V.min_len(1).min_length == 1
    assert V.max_len(2).max_length == 2
    assert list(V.in_(["a", "b"]).options) == ["a", "b"]
    assert V.instance_of(int).type is int
    assert V.matches_re("a+").pattern.pattern == "a+"
    gt, lt = V.gt(0), V.lt(9)
    assert tuple(V.and_(gt, lt)._validators) == (gt, lt)
    assert V.optional(gt).validator is gt
    deep = V.deep_iterable(member_validator=gt, iterable_validator=lt)
    assert (deep.member_validator, deep.iterable_validator) == (gt, lt)


def test_the_adapter_reads_the_combinators() -> None:
    gt, lt = V.gt(0), V.lt(9)
    assert shape_of(V.and_(gt, lt)).members == (gt, lt)
    assert shape_of([gt, lt]).members == (gt, lt)
    optional = shape_of(V.optional(gt))
    assert (optional.kind, optional.members) == ("optional", (gt,))
    deep = shape_of(V.deep_iterable(member_validator=gt))
    assert (deep.kind, deep.member, deep.outer) == ("items", gt, None)
    assert shape_of(positive_or_auto).kind == "other"


@pytest.mark.parametrize(
    ("validator", "value", "expected"),
    [
        pytest.param(V.gt(0), 0, [((), "must be > 0, got 0")], id="gt"),
        pytest.param(V.gt(0.0), -1.0, [((), "must be > 0.0, got -1.0")], id="gt-float"),
        pytest.param(V.ge(0.0), -0.1, [((), "must be >= 0.0, got -0.1")], id="ge"),
        pytest.param(V.lt(1.0), 1.5, [((), "must be < 1.0, got 1.5")], id="lt"),
        pytest.param(V.le(3), 4, [((), "must be <= 3, got 4")], id="le"),
        pytest.param(V.min_len(1), "", [((), "must not be empty")], id="min_len-1"),
        pytest.param(V.min_len(2), "a", [((), "length must be >= 2, got 1")], id="min_len-2"),
        pytest.param(V.max_len(2), "abc", [((), "length must be <= 2, got 3")], id="max_len"),
        pytest.param(V.in_(["a", "b"]), "c", [((), "must be one of ['a', 'b'], got 'c'")], id="in_"),
        pytest.param(V.instance_of(int), "a", [((), "must be int, got 'a' (str)")], id="instance_of"),
        pytest.param(V.is_callable(), 1, [((), "must be callable, got 1")], id="is_callable"),
        pytest.param(V.matches_re("a+"), "b", [((), "must match 'a+', got 'b'")], id="matches_re"),
        pytest.param(V.optional(V.gt(0)), None, [], id="optional-none"),
        pytest.param(V.optional(V.gt(0)), 0, [((), "must be > 0, got 0")], id="optional"),
        pytest.param(V.and_(V.ge(0.0), V.lt(1.0)), 1.0, [((), "must be < 1.0, got 1.0")], id="and_"),
        pytest.param(
            V.deep_iterable(member_validator=V.min_len(1)),
            ["a", "", "b", ""],
            [((1,), "must not be empty"), ((3,), "must not be empty")],
            id="deep_iterable-every-item",
        ),
        pytest.param(
            V.deep_iterable(member_validator=V.gt(0), iterable_validator=V.min_len(1)),
            [],
            [((), "must not be empty")],
            id="deep_iterable-outer",
        ),
        pytest.param(positive_or_auto, 0, [((), "must be >= 1, or -1 for auto, got 0")], id="ours-auto"),
        pytest.param(
            minus_one_or_at_least(0, "latest"),
            -2,
            [((), "must be >= 0, or -1 for latest, got -2")],
            id="ours",
        ),
    ],
)
def test_each_failure_reads_in_the_projects_words(
    validator: Any, value: object, expected: list[tuple[tuple[object, ...], str]]
) -> None:
    assert messages(validator, value) == expected


def test_a_validator_the_adapter_does_not_know_says_its_own_words() -> None:
    def odd(instance: object, attribute: "attrs.Attribute[Any]", value: int) -> None:
        if value % 2 == 0:
            raise ValueError(f"{attribute.name} needs an odd number")

    assert messages(odd, 2) == [((), "x needs an odd number")]


def test_our_validators_raise_structured_errors_that_read_like_attrs() -> None:
    with pytest.raises(RuleViolation) as info:
        positive_or_auto(None, FIELD, 0)
    error = info.value
    assert (error.field, error.rule, error.bound, error.value) == ("x", "must be >= 1, or -1 for auto", 1, 0)
    assert isinstance(error, ValueError)
    assert str(error) == "'x' must be >= 1, or -1 for auto: 0"
    assert error.message == "must be >= 1, or -1 for auto, got 0"
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.field, copy.message) == (RuleViolation, "x", error.message)


def test_an_attrs_failure_becomes_a_structured_error() -> None:
    validator = V.ge(0.0)
    with pytest.raises(ValueError, match=r"must be >= 0\.0") as info:
        validator(None, FIELD, -1.0)
    error = violation(validator, "x", -1.0, info.value)
    assert (error.field, error.rule, error.bound, error.value) == ("x", "must be >= 0.0", 0.0, -1.0)
    kind = violation(V.instance_of(int), "x", "a", TypeError())
    assert isinstance(kind, RuleTypeViolation)
    assert isinstance(kind, TypeError)


# --- fast validators: what attrs accepts, each in one plain function ----------------------------------
