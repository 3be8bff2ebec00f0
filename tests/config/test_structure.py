"""Strict structuring: no coercion, every problem with its path, through the public converter."""

from typing import Literal

import attrs
import pytest

from hyper_parallel.config import ConfigError, converter


@attrs.frozen(kw_only=True)
class Inner:
    size: int = attrs.field(default=1, validator=attrs.validators.gt(0))
    betas: tuple[float, float] = (0.9, 0.95)


@attrs.frozen(kw_only=True)
class Sample:
    steps: int = attrs.field(default=1, validator=attrs.validators.gt(0))
    lr: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    flag: bool = False
    name: str = "x"
    mode: Literal["none", "full"] = "none"
    maybe: int | None = None
    either: int | Literal["auto"] = "auto"
    names: tuple[str, ...] = ()
    table: dict[str, int] = attrs.field(factory=dict)
    inner: Inner = attrs.Factory(Inner)


def issues(raw: object) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, Sample)
    return [(i.path, i.message) for i in info.value.issues]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("steps", "1", "expected an integer, got the string '1'"),
        ("steps", True, "expected an integer, got the boolean true"),
        ("steps", 1.5, "expected an integer, got the number 1.5"),
        ("steps", None, "expected an integer, got null"),
        ("steps", 2**70, "integer out of range (must fit in 64 bits), got 1180591620717411303424"),
        (
            "lr",
            "1e-4",
            "expected a number, got the string '1e-4'"
            " (a number in quotes is text: remove the quotes; a YAML 1.1 reader such as yaml.safe_load also "
            "reads 1e-4 as text: write 1.0e-4, or load the file with load_config, which reads YAML 1.2)",
        ),
        ("lr", False, "expected a number, got the boolean false"),
        ("lr", float("nan"), "expected a finite number, got nan"),
        ("lr", float("inf"), "expected a finite number, got inf"),
        ("flag", "false", "expected a boolean (true or false), got the string 'false'"),
        ("flag", 0, "expected a boolean (true or false), got the integer 0"),
        ("name", 12, "expected a string, got the integer 12"),
        ("name", None, "expected a string, got null"),
        ("mode", "ful", "expected one of 'none', 'full', got the string 'ful'; did you mean 'full'?"),
        ("maybe", "3", "expected an integer, got the string '3'"),
        ("either", "car", "expected an integer or one of 'auto', got the string 'car'"),
        ("names", "ab", "expected a list, got the string 'ab'"),
        ("table", [1], "expected a mapping, got a list of 1 item"),
        ("inner", 3, "expected a mapping for Inner, got the integer 3"),
    ],
)
def test_strict_scalars_refuse_coercion(field: str, value: object, message: str) -> None:
    assert issues({field: value}) == [(field, message)]


def test_nested_paths_and_indices_are_reported() -> None:
    found = issues({"names": ["a", 2], "table": {"k": "v"}, "inner": {"betas": [0.9, "x"]}})
    assert found == [
        ("inner.betas[1]", "expected a number, got the string 'x'"),
        ("names[1]", "expected a string, got the integer 2"),
        ("table.k", "expected an integer, got the string 'v'"),
    ]


def test_every_validator_failure_is_reported_not_just_the_first() -> None:
    found = issues({"steps": 0, "lr": -1.0, "inner": {"size": -3}})
    assert found == [
        ("inner.size", "must be > 0, got -3"),
        ("lr", "must be > 0.0, got -1.0"),
        ("steps", "must be > 0, got 0"),
    ]


def test_unknown_key_suggests_the_close_name() -> None:
    assert issues({"stepz": 3}) == [("stepz", "unknown field 'stepz' for Sample; did you mean 'steps'?")]


def test_nested_target_is_refused() -> None:
    found = issues({"inner": {"_target_": "x.y", "size": 2}})
    assert found[0][0] == "inner._target_"
    assert "'_target_' is only allowed at the top of a root group" in found[0][1]


def test_sound_values_structure_exactly() -> None:
    got = converter.structure(
        {"steps": 3, "lr": 2, "names": ["a"], "either": 4, "table": {"k": 1}, "inner": {"betas": [0.5, 0.6]}},
        Sample,
    )
    assert got == Sample(
        steps=3, lr=2.0, names=("a",), either=4, table={"k": 1}, inner=Inner(betas=(0.5, 0.6))
    )
    assert type(got.lr) is float


def test_int_fits_a_float_field_but_a_string_is_never_a_sequence() -> None:
    assert converter.structure([1, 2], tuple[float, ...]) == (1.0, 2.0)
    with pytest.raises(ConfigError, match="expected a list, got the string '12'"):
        converter.structure("12", tuple[int, ...])


@attrs.frozen(kw_only=True)
class Buggy:
    size: int = attrs.field(default=1)

    def __attrs_post_init__(self) -> None:
        if self.size == 2:
            raise KeyError("size")

    def cross_check(self):  # type: ignore[no-untyped-def]
        if self.size == 3:
            raise RuntimeError("boom")
        yield from ()


@pytest.mark.parametrize(
    ("size", "message"),
    [(2, "Buggy: KeyError('size')"), (3, "Buggy.cross_check failed: RuntimeError('boom')")],
)
def test_a_config_class_whose_own_code_fails_is_reported_not_raised(size: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        converter.structure({"size": size}, Buggy)
    assert [(i.path, i.message) for i in info.value.issues] == [("top level", message)]
