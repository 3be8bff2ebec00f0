"""The one adapter to attrs' private validator classes reads what this attrs release exposes, and the user
sees each failure in the project's words; our own validators raise structured errors."""

import pickle
from typing import Any

import attrs
import pytest
from cattrs.errors import ClassValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel._checks import (
    RuleTypeViolation,
    RuleViolation,
    minus_one_or_at_least,
    positive_or_auto,
)
from hyper_parallel.config.attrs_init import plain_init
from hyper_parallel.config.attrs_validators import fast, fast_validators, inline_check, shape_of, violation
from hyper_parallel.config.base import ConfigBase
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

_FAST_SHAPES = {
    "gt": V.gt(0.0),
    "ge_int": V.ge(0),
    "optional_gt": V.optional(V.gt(0.0)),
    "and_ge_lt": V.and_(V.ge(0.0), V.lt(1.0)),
    "optional_and": V.optional(V.and_(V.ge(0.0), V.le(1.0))),
    "min_len": V.min_len(1),
    "optional_min_len": V.optional(V.min_len(1)),
    "deep_min_len": V.deep_iterable(member_validator=V.min_len(1)),
    "deep_and": V.deep_iterable(member_validator=V.and_(V.ge(0.0), V.lt(1.0))),
    "callable": V.is_callable(),
    "optional_callable": V.optional(V.is_callable()),
}
_VALUES: list[object] = [
    None,
    0,
    1,
    -1,
    0.0,
    0.5,
    1.0,
    -0.5,
    2.0,
    float("nan"),
    float("inf"),
    "",
    "a",
    "abc",
    (),
    ("a",),
    ("a", ""),
    (0.9, 0.95),
    (0.9, 1.0),
    (-0.1, 0.5),
    [0.2],
    [""],
    object(),
    True,
]


def _outcome(validator: Any, value: object) -> tuple[str, str] | None:
    try:
        validator(None, FIELD, value)
    except Exception as exc:  # the exact error a user of each would see
        return type(exc).__name__, str(exc)
    return None


@pytest.mark.parametrize("name", list(_FAST_SHAPES))
def test_a_fast_validator_accepts_and_refuses_exactly_what_attrs_does_with_attrs_words(name: str) -> None:
    original = _FAST_SHAPES[name]
    quick = fast(original)
    assert quick is not original
    assert quick.__wrapped__ is original  # type: ignore[attr-defined]
    assert shape_of(quick) == shape_of(original)  # schema and messages read it as what it checks
    for value in _VALUES:
        assert _outcome(quick, value) == _outcome(original, value), value


#: Values of every kind the shapes meet: None, floats (NaN and infinities too), integers, text, tuples.
_ANY_VALUE = st.one_of(
    st.none(),
    st.floats(),
    st.integers(),
    st.text(max_size=3),
    st.lists(st.one_of(st.floats(), st.text(max_size=2)), max_size=3).map(tuple),
)


@given(value=_ANY_VALUE)
@settings(max_examples=300, deadline=None)
def test_fast_validators_agree_with_attrs_on_any_value(value: object) -> None:
    for original in _FAST_SHAPES.values():
        assert _outcome(fast(original), value) == _outcome(original, value)


def _inline_accepts(validator: Any, value: object) -> bool:
    found = inline_check(validator, "c")
    assert found is not None
    condition, names = found
    try:
        return bool(eval(condition, {**names, "v": value}))  # the condition under test
    except Exception:  # a condition that raises counts as false: the mapping goes the detailed way
        return False


_INLINE_SHAPES = {k: v for k, v in _FAST_SHAPES.items() if not k.startswith("deep_")}


@pytest.mark.parametrize("name", list(_INLINE_SHAPES))
@pytest.mark.parametrize("wrapped", [False, True], ids=["attrs", "fast"])
def test_an_inline_check_is_true_exactly_for_what_the_validator_accepts(name: str, wrapped: bool) -> None:
    original = _INLINE_SHAPES[name]
    validator = fast(original) if wrapped else original
    for value in _VALUES:
        assert _inline_accepts(validator, value) == (_outcome(original, value) is None), value


@given(value=_ANY_VALUE)
@settings(max_examples=300, deadline=None)
def test_inline_checks_agree_with_attrs_on_any_value(value: object) -> None:
    for original in _INLINE_SHAPES.values():
        assert _inline_accepts(original, value) == (_outcome(original, value) is None)


def test_a_shape_without_an_inline_check_has_none() -> None:
    for validator in (V.in_(["a"]), V.instance_of(int), positive_or_auto, _FAST_SHAPES["deep_min_len"]):
        assert inline_check(validator, "c") is None
    assert inline_check(V.and_(V.ge(0), V.lt(3)), "c7") == ("v >= c7 and v < c7_2", {"c7": 0, "c7_2": 3})


def test_a_shape_fast_does_not_know_is_kept_as_it_is() -> None:
    for original in (V.in_(["a"]), V.instance_of(int), positive_or_auto, V.optional(V.instance_of(int))):
        assert fast(original) is original
    assert fast(fast(V.gt(0))).__wrapped__ is not None  # type: ignore[attr-defined]


def _config_classes() -> list[type]:
    import hyper_parallel.launch  # every Config class of the shipped targets
    import hyper_parallel.models.llama3
    import hyper_parallel.models.qwen3_5_moe
    from hyper_parallel.components.dataloader import DatasetConfig
    from hyper_parallel.config.base import ConfigBase
    from hyper_parallel.models.spec import ModelSpec

    # the Config classes, and the other classes a config holds (a dataset entry, a spec and its parts)
    held = [DatasetConfig, ModelSpec, hyper_parallel.models.llama3.args.RopeScaling]
    held.append(hyper_parallel.models.qwen3_5.Qwen3_5VisionArgs)
    found, todo = list(held), [ConfigBase]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if cls.__module__.startswith("hyper_parallel.")]  # not other tests' own


def test_every_config_class_checks_its_fields_with_fast_validators() -> None:
    slow = {
        f"{cls.__qualname__}.{f.name}"
        for cls in _config_classes()
        for f in attrs.fields(cls)
        if f.validator is not None and fast(f.validator) is not f.validator
    }
    slotted = {cls.__qualname__ for cls in _config_classes() if "__slots__" in cls.__dict__}
    assert len(_config_classes()) > 30
    assert slow == set()  # a class declared without field_transformer=fast_validators shows here
    assert slotted == set()  # ... and one declared without slots=False here (see config.base)


# --- plain construction: what attrs' __init__ stores, stored by a written structure function ----------


@pytest.mark.skipif(not hasattr(attrs, "inspect"), reason="attrs < 25.4 describes no class: each is called")
def test_every_config_class_is_constructed_by_storing_its_fields() -> None:
    # The written structure function of each stores the fields itself (see config.attrs_init).
    classes = _config_classes()
    # (a spec is made by its factory, never from a mapping; its recipe field is not an argument)
    assert [cls.__qualname__ for cls in classes if plain_init(cls) is None] == ["ModelSpec"]
    dataloader = next(cls for cls in classes if cls.__qualname__ == "TextDataLoader.Config")
    init = plain_init(dataloader)
    assert init is not None
    assert [f.name for f in init] == [f.name for f in attrs.fields(dataloader)]
    assert {f.name: f.missing for f in init}["dataset"] == "factory"


def _above_low(instance: Any, attribute: "attrs.Attribute[Any]", value: int) -> None:
    if value <= instance.low:
        raise ValueError(f"'{attribute.name}' must be above low ({instance.low}), got {value}")


@attrs.frozen(kw_only=True, slots=False, field_transformer=fast_validators)
class _Plain(ConfigBase):
    """A test's own Config class: a bound, a validator of its own reading another field, a required
    field, a factory default and a default its own validator refuses."""

    low: int = attrs.field(default=0, validator=V.ge(0))
    high: int = attrs.field(default=1, validator=_above_low)
    name: str
    counts: dict[str, int] = attrs.field(factory=dict)
    ratio: float = attrs.field(default=0.0, validator=V.gt(0.0))


def _not_plain() -> dict[str, type]:
    @attrs.frozen(kw_only=True, slots=False)
    class WithPostInit:
        x: int = 0

        def __attrs_post_init__(self) -> None:
            pass

    @attrs.frozen(kw_only=True, slots=False)
    class WithPreInit:
        x: int = 0

        def __attrs_pre_init__(self) -> None:
            pass

    @attrs.frozen(kw_only=True, slots=False)
    class WithConverter:
        x: int = attrs.field(default=0, converter=int)

    @attrs.frozen(kw_only=True)
    class Slotted:
        x: int = 0

    @attrs.define(kw_only=True, slots=False)
    class Mutable:
        x: int = 0

    @attrs.frozen(kw_only=True, slots=False)
    class TakesSelf:
        x: int = 0
        y: int = attrs.field(default=attrs.Factory(lambda self: self.x, takes_self=True))

    @attrs.frozen(kw_only=True, slots=False)
    class NotInit:
        x: int = attrs.field(default=0, init=False)

    @attrs.frozen(kw_only=True, slots=False, cache_hash=True)
    class CachedHash:
        x: int = 0

    @attrs.frozen(kw_only=True, slots=False, init=False)
    class OwnInit:
        x: int = 0

        def __init__(self) -> None:
            object.__setattr__(self, "x", 1)

    class SubclassInit(_Plain):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    class NotAttrs:
        x: int = 0

    return {cls.__name__: cls for cls in locals().values() if isinstance(cls, type)}


@pytest.mark.parametrize("name", list(_not_plain()))
def test_a_class_whose_construction_is_more_than_storing_is_constructed_by_calling_it(name: str) -> None:
    assert plain_init(_not_plain()[name]) is None


def _written_hook(cls: type) -> Any:
    from hyper_parallel.config import codegen
    from hyper_parallel.config.conversion import ConfigConverter

    hook = ConfigConverter().get_structure_hook(cls)
    for _ in range(codegen.COMPILE_AFTER + 1):  # past the loop: the written function answers
        with pytest.raises(ClassValidationError):  # a refusal counts as a use, as the compile is
            hook({"unknown": 1}, cls)
        hook({"name": "a", "ratio": 1.0} if cls is _Plain else {}, cls)
    return hook


def _fields_of(value: object) -> list[tuple[str, type, object]]:
    return [(k, type(v), v) for k, v in vars(value).items()]


def test_every_default_config_written_out_and_structured_again_is_the_object_calling_it_makes() -> None:
    from hyper_parallel.config import converter

    checked = 0
    for cls in _config_classes():
        if not cls.__module__.startswith("hyper_parallel.") or not attrs.has(cls):
            continue
        try:
            expected = cls()
        except TypeError:  # a required field: a model's arguments, made by its factory
            continue
        try:
            written = converter.unstructure(expected)
        except Exception:  # what a file cannot hold (a spec's functions)
            continue
        written.pop("_target_", None)
        hook = _written_hook(cls)
        got = hook(written, cls)
        assert type(got) is cls
        assert got == expected
        assert _fields_of(got) == _fields_of(expected), cls.__qualname__  # same values, types and order
        assert _fields_of(hook({}, cls)) == _fields_of(expected)  # every default as __init__ stores it
        checked += 1
    assert checked > 25


def test_the_written_construction_runs_every_validator_and_makes_each_factory_default_anew() -> None:
    hook = _written_hook(_Plain)
    got = hook({"name": "a", "low": 2, "high": 3, "ratio": 0.5}, _Plain)
    assert _fields_of(got) == _fields_of(_Plain(name="a", low=2, high=3, ratio=0.5))
    first, second = hook({"name": "a", "ratio": 1.0}, _Plain), hook({"name": "b", "ratio": 1.0}, _Plain)
    assert first.counts == {}
    assert first.counts is not second.counts  # made anew, as __init__ makes it


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"name": "a", "ratio": 1.0, "low": 5, "high": 3}, "high: 'high' must be above low (5), got 3"),
        ({"name": "a", "ratio": 1.0, "low": -1}, "low: must be >= 0, got -1"),
        ({"name": "a"}, "ratio: must be > 0.0, got 0.0"),  # the default itself is refused
        ({"ratio": 1.0}, "name: missing required field 'name'"),
        ({"name": "a", "ratio": 1.0, "low": "2"}, "low: expected an integer, got the string '2'"),
    ],
)
def test_a_mapping_the_written_construction_refuses_reads_as_calling_the_class_would(
    given: dict[str, Any], message: str
) -> None:
    from hyper_parallel.config.conversion import ConfigConverter
    from hyper_parallel.config.errors import ConfigError

    conv = ConfigConverter()
    texts = []
    for compiled in (False, True):
        hook = _written_hook(_Plain) if compiled else conv.get_structure_hook(_Plain)
        with pytest.raises(ConfigError) as caught:
            conv.structure(given, _Plain) if not compiled else _raise_config_error(hook, given)
        texts.append(str(caught.value))
    assert texts == [message, message]


def _raise_config_error(hook: Any, given: dict[str, Any]) -> None:
    from hyper_parallel.config.validation import problems_of, to_config_error

    try:
        hook(given, _Plain)
    except Exception as exc:
        raise to_config_error(problems_of(exc), None) from None
