"""Tests for hyper_parallel.config.yaml_dump: output both YAML 1.1 and our YAML 1.2 loader read back equal."""

import enum
import math
from collections import OrderedDict
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.config.yaml_dump import dump_yaml
from hyper_parallel.config.yaml_load import MAX_DEPTH, parse_yaml


def round_trips(data: object) -> str:
    text = dump_yaml(data)
    assert parse_yaml(text)[0] == data, text
    assert yaml.safe_load(text) == data, text
    return text


# Strings that YAML 1.1, YAML 1.2 or both would read as something other than that string when plain.
AMBIGUOUS = [
    "yes", "no", "Yes", "NO", "on", "off", "On", "OFF", "y", "n", "Y", "N",
    "true", "True", "FALSE", "null", "Null", "NULL", "~", "",
    "1e-4", "1E5", "3.0e-4", "1.", ".5", "+.5", "-1.5", "1.0", "1e5",
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN",
    "0", "007", "-12", "+3", "0o17", "0x1F", "0b101", "1_000", "1_0.5", "0x_1",
    "1:30", "-1:30:00", "190:20:30.15",
    "2024-01-01", "2001-12-14t21:59:43.10-05:00", "2002-12-14",
    "<<", "=", "!foo", "&a", "*a", "- a", "-", "?", ":", "a: b", "# c", "x #y", "[1]", "{a: 1}",
    "'quoted'", '"dq"', "|", ">", "%TAG", "@at", "`tick", "---", "...",
    " leading", "trailing ", "multi\nline", "tab\there", "crlf\r\n", "nel\x85x", "ls\u2028x",
    "bom\ufeffx", "\ufeffbom", "bell\x07", "del\x7f", "astral \U0001f600", "\ufffe",
]  # fmt: skip


@pytest.mark.parametrize("text", AMBIGUOUS)
def test_ambiguous_strings_round_trip(text: str) -> None:
    round_trips(text)
    round_trips({"key": text, text: [text]})


@pytest.mark.parametrize(
    "text", ["yes", "1e-4", "2024-01-01", "null", "1_000", "0o17", "~", "", "1:30", "<<", "true", "007"]
)
def test_ambiguous_strings_are_quoted(text: str) -> None:
    dumped = dump_yaml({"k": text})
    assert dumped in (f"k: '{text}'\n", f'k: "{text}"\n')


@pytest.mark.parametrize("text", ["hello", "bf16", "llama3-8b", "path/to/weights", "héllo wörld ✓"])
def test_plain_strings_stay_plain(text: str) -> None:
    assert round_trips({"k": text}) == f"k: {text}\n"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e-4, "0.0001"),
        (1e-5, "1.0e-05"),
        (3e-4, "0.0003"),
        (1e16, "1.0e+16"),
        (1.5e16, "1.5e+16"),
        (2.0, "2.0"),
        (-0.5, "-0.5"),
        (0.0, "0.0"),
        (5e-324, "5.0e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (math.inf, ".inf"),
        (-math.inf, "-.inf"),
    ],
)
def test_float_text(value: float, text: str) -> None:
    assert round_trips({"x": value}) == f"x: {text}\n"
    assert type(parse_yaml(text)[0]) is float
    assert type(yaml.safe_load(text)) is float


def test_nan() -> None:
    text = dump_yaml({"x": math.nan})
    assert text == "x: .nan\n"
    assert math.isnan(parse_yaml(text)[0]["x"])  # type: ignore[index]
    assert math.isnan(yaml.safe_load(text)["x"])


def test_layout() -> None:
    shared = [1, 2]
    data = {
        "zeta": 1,
        "alpha": {"lr": 1e-4, "betas": [0.9, 0.95], "shared": shared, "again": shared},
        "empty_map": {},
        "empty_list": [],
        "items": [{"a": None, "b": True}, "x"],
        "big": 10**30,
        "neg": -3,
    }
    text = round_trips(data)
    assert text == (
        "zeta: 1\n"
        "alpha:\n"
        "  lr: 0.0001\n"
        "  betas:\n"
        "    - 0.9\n"
        "    - 0.95\n"
        "  shared:\n"
        "    - 1\n"
        "    - 2\n"
        "  again:\n"
        "    - 1\n"
        "    - 2\n"
        "empty_map: {}\n"
        "empty_list: []\n"
        "items:\n"
        "  - a: null\n"
        "    b: true\n"
        "  - x\n"
        "big: 1000000000000000000000000000000\n"
        "neg: -3\n"
    )
    assert "&" not in text
    assert "*" not in text


def test_long_strings_are_not_folded() -> None:
    long = "word " * 200 + "end"
    text = round_trips({"k": long, "short": long})
    assert text == f"k: {long}\nshort: {long}\n"
    # A key over 128 characters cannot be a simple key; it is written as an explicit "? " key, unfolded.
    assert round_trips({long: 1}) == f"? {long}\n: 1\n"


@pytest.mark.parametrize("data", [None, "abc", 1, 1.5, True, [], {}, [1, "yes"], ""])
def test_any_root(data: object) -> None:
    round_trips(data)


class Color(enum.Enum):
    RED = 1


class Mode(str, enum.Enum):
    FAST = "fast"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ((1, 2), "cannot dump a value of type tuple at top level"),
        ({"a": {"b": [1, {1, 2}]}}, "cannot dump a value of type set at a.b[1]"),
        ({"a": b"x"}, "cannot dump a value of type bytes at a"),
        ({"a": object()}, "cannot dump a value of type object at a"),
        ({"a": Color.RED}, f"type {__name__}.Color at a"),
        ({"a": Mode.FAST}, f"type {__name__}.Mode at a"),
        ({"a": OrderedDict()}, "type collections.OrderedDict at a"),
        ({"a": {1: "x"}}, "cannot dump a key of type int at a: keys must be str"),
        ({"a": [{None: 1}]}, "key of type NoneType at a[0]"),
        ({"a": complex(1, 2)}, "type complex at a"),
    ],
)
def test_unsupported_types(data: object, fragment: str) -> None:
    with pytest.raises(TypeError) as info:
        dump_yaml(data)
    assert fragment in str(info.value)


def test_self_reference_refused() -> None:
    loop: list[object] = [1]
    loop.append(loop)
    with pytest.raises(ValueError, match=r"contains itself \(at \[1\]\)"):
        dump_yaml(loop)
    looping: dict[str, object] = {}
    looping["me"] = {"again": looping}
    with pytest.raises(ValueError, match="contains itself"):
        dump_yaml(looping)


def test_depth_limit() -> None:
    deep: list[Any] = []
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    round_trips(deep)
    with pytest.raises(ValueError, match=f"deeper than {MAX_DEPTH} levels"):
        dump_yaml([deep])


# --- property test ---------------------------------------------------------------------------------------

number_like = st.from_regex(
    r"[-+]?(0[box]?)?[0-9_a-fA-F]{0,4}(\.[0-9_]{0,3})?([eE][-+]?[0-9]{1,3})?(:[0-5][0-9])?", fullmatch=True
)
texts = st.one_of(
    st.text(),
    st.sampled_from(AMBIGUOUS),
    number_like,
    st.text(alphabet="-:#&*!|>'\"%@`?,[]{} \n\t.~01eyYnNtTo", max_size=8),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
trees = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(texts, children, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None)
@given(trees)
def test_round_trip_property(data: object) -> None:
    round_trips(data)
