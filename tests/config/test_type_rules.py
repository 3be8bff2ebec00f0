"""The table of type rules as cattrs sees it, and every field kind through load, override, dump and reload.

``converter.structure`` is strict for bare scalars too, ``converter.get_structure_hook(T)`` returns the very
hooks a resolve uses (cattrs' generated functions for attrs classes, raising cattrs' structured errors), and
Enum, IntEnum, Path, frozenset and bare dict/list/tuple fields round-trip like any other.
"""

import json
import pathlib
import string
from typing import Any

import cattrs
import pytest
from cattrs.errors import ClassValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.components.optimizer import AdamW
from hyper_parallel.config import ConfigError, converter, load_config
from hyper_parallel.config.options import resolve_options
from hyper_parallel.config.overrides import Override, OverridePatch, parse_path
from hyper_parallel.config.targets import allowed_prefixes
from hyper_parallel.config.validation import Invalid
from hyper_parallel.config.yaml_dump import dump_yaml
from hyper_parallel.config.yaml_load import parse_yaml
from hyper_parallel.trainer.config import TrainerConfig, TrainingConfig
from tests.support.rule_converter import CONV
from tests.support.rule_targets import Color, Inner, Kinds, KindsRoot, Level

ALLOWED = ("tests.support.rule_targets",)

# --- strict scalars through the public converter -------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "tp", "message"),
    [
        ("200", int, "expected an integer, got the string '200'"),
        (2.7, int, "expected an integer, got the number 2.7"),
        (True, int, "expected an integer, got the boolean true"),
        (None, int, "expected an integer, got null"),
        (2**63, int, "integer out of range (must fit in 64 bits), got 9223372036854775808"),
        (
            "1.5",
            float,
            "expected a number, got the string '1.5' (a number in quotes is text: remove the quotes)",
        ),
        (float("nan"), float, "expected a finite number, got nan"),
        (None, float, "expected a number, got null"),
        ("false", bool, "expected a boolean (true or false), got the string 'false'"),
        (0, bool, "expected a boolean (true or false), got the integer 0"),
        (None, bool, "expected a boolean (true or false), got null"),
        (3, str, "expected a string, got the integer 3"),
        (None, str, "expected a string, got null"),
        (0, type(None), "expected null, got the integer 0"),
        ("", type(None), "expected null, got the string ''"),
    ],
)
def test_bare_scalars_are_strict_through_converter_structure(raw: object, tp: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, tp)
    assert [(i.path, i.message, i.location) for i in info.value.issues] == [("top level", message, None)]


@pytest.mark.parametrize(
    ("raw", "tp"), [(200, int), (1, float), (1.5, float), (False, bool), ("x", str), (None, type(None))]
)
def test_bare_scalars_of_the_right_type_are_taken_as_they_are(raw: object, tp: Any) -> None:
    assert converter.structure(raw, tp) == raw
    assert type(converter.structure(raw, tp)) is tp


# --- hooks as cattrs users know them ----------------------------------------------------------------


@pytest.mark.parametrize(
    "tp", [int, float, bool, str, int | None, list[int], dict[str, float], TrainingConfig]
)
def test_get_structure_hook_returns_one_cached_hook_per_type(tp: Any) -> None:
    assert converter.get_structure_hook(tp) is converter.get_structure_hook(tp)


def test_scalar_hooks_are_the_strict_ones_not_cattrs_coercing_ones() -> None:
    hook = converter.get_structure_hook(int)
    assert hook is not cattrs.Converter().get_structure_hook(int)
    assert hook(7, int) == 7
    with pytest.raises(Invalid, match="expected an integer, got the string '7'"):
        hook("7", int)


def test_attrs_hook_raises_cattrs_structured_errors_that_transform_error_reads() -> None:
    hook = converter.get_structure_hook(TrainingConfig)
    assert hook({"max_steps": 5}, TrainingConfig) == TrainingConfig(max_steps=5)
    with pytest.raises(ClassValidationError) as info:
        hook({"global_batch_size": "5", "seeed": 1}, TrainingConfig)
    assert sorted(cattrs.transform_error(info.value)) == [
        "extra fields found (seeed) @ $",
        "invalid value for type, expected int @ $.global_batch_size",
    ]


def test_root_hook_is_the_registered_one_and_converter_structure_uses_it() -> None:
    assert converter.get_structure_hook(TrainerConfig) is converter.get_structure_hook(TrainerConfig)
    root_hook = CONV.get_structure_hook(KindsRoot)
    assert CONV.get_structure_hook(KindsRoot) is root_hook
    assert root_hook({}, KindsRoot) == CONV.structure({}, KindsRoot) == KindsRoot()


def test_get_unstructure_hook_writes_a_config_class_as_its_fields() -> None:
    cfg = AdamW.Config(lr=0.5)
    raw = converter.get_unstructure_hook(AdamW.Config)(cfg)
    assert raw["lr"] == 0.5
    assert isinstance(raw["betas"], list)
    assert converter.structure(raw, AdamW.Config) == cfg


@pytest.mark.parametrize(
    ("value", "raw"),
    [
        (Color.GREEN, "green"),
        (Level.HIGH, 2),
        (pathlib.Path("a/b"), "a/b"),
        (frozenset({"b", "a"}), ["a", "b"]),
        ((1, "x"), [1, "x"]),
    ],
)
def test_values_unstructure_by_their_rule(value: object, raw: object) -> None:
    assert converter.unstructure(value) == raw


@pytest.mark.parametrize(
    ("raw", "tp", "message"),
    [
        ("blue", Color, "expected one of 'red', 'green', got the string 'blue'"),
        ("gren", Color, "expected one of 'red', 'green', got the string 'gren'; did you mean 'green'?"),
        (True, Level, "expected one of 1, 2, got the boolean true"),
        ("2", Level, "expected one of 1, 2, got the string '2'"),
        (3, pathlib.Path, "expected a path (a string), got the integer 3"),
        ("ab", frozenset[str], "expected a list (of distinct items), got the string 'ab'"),
        ([1], frozenset[str], "expected a string, got the integer 1"),
        ("x", dict, "expected a mapping, got the string 'x'"),
        ({"a": 1}, list, "expected a list, got a mapping"),
    ],
)
def test_new_kinds_refuse_what_they_cannot_take(raw: object, tp: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, tp)
    assert [i.message for i in info.value.issues] == [message]


# --- every field kind through load, override, dump and reload ---------------------------------------


def _reload(text: str) -> KindsRoot:
    raw, _ = parse_yaml(text)
    with resolve_options(allowed_targets=ALLOWED):
        return CONV.structure(raw, KindsRoot)


def _override(root: KindsRoot, overrides: dict[str, str]) -> KindsRoot:
    parsed = []
    for key, value in overrides.items():
        path = parse_path(key)
        assert path is not None
        parsed.append(Override(key, path, value, f"--{key}"))
    patch = OverridePatch(CONV, CONV.root_facts(KindsRoot), parsed, allowed_prefixes(ALLOWED))
    tree = CONV.unstructure(root)
    patch.patch(tree)
    assert patch.problems == []
    with resolve_options(allowed_targets=ALLOWED):
        return CONV.structure(tree, KindsRoot)


# '_target_' is refused at any depth below a root group, so no generated key may be it.
_WORDS = st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=1, max_size=8).filter(
    lambda word: word != "_target_"
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _WORDS
)
_PATHS = st.lists(_WORDS.filter(lambda w: w not in (".", "..")), min_size=1, max_size=3).map(
    lambda parts: pathlib.Path(*parts)
)
_KINDS = st.builds(
    Kinds.Config,
    color=st.sampled_from(Color),
    level=st.sampled_from(Level),
    path=_PATHS,
    maybe_path=st.none() | _PATHS,
    tags=st.frozensets(_WORDS, max_size=4),
    table=st.dictionaries(_WORDS, st.integers(-(2**63), 2**63 - 1), max_size=3),
    anything=st.dictionaries(_WORDS, _SCALARS, max_size=3),
    items=st.lists(_SCALARS, max_size=3),
    pair=st.lists(_SCALARS, max_size=3).map(tuple),
    mode=st.sampled_from(["a", "b"]),
    inner=st.builds(Inner, weight=st.floats(allow_nan=False, allow_infinity=False)),
    extra=_SCALARS,
)


def _as_text(cfg: Kinds.Config) -> dict[str, str]:
    """Each field of ``cfg`` as a user types it on a command line."""
    return {
        "kinds.color": cfg.color.value,
        "kinds.level": str(cfg.level.value),
        "kinds.path": str(cfg.path),
        "kinds.maybe_path": "null" if cfg.maybe_path is None else str(cfg.maybe_path),
        "kinds.tags": json.dumps(sorted(cfg.tags)),
        "kinds.table": json.dumps(cfg.table),
        "kinds.anything": json.dumps(cfg.anything),
        "kinds.items": json.dumps(cfg.items),
        "kinds.pair": json.dumps(list(cfg.pair)),
        "kinds.mode": cfg.mode,
        "kinds.inner.weight": repr(cfg.inner.weight),
    }


@settings(max_examples=60, deadline=None)
@given(_KINDS)
def test_every_field_kind_round_trips_through_dump_and_reload(cfg: Kinds.Config) -> None:
    root = KindsRoot(cfg)
    assert _reload(dump_yaml(CONV.unstructure(root))) == root


@settings(max_examples=60, deadline=None)
@given(_KINDS, _KINDS)
def test_every_field_kind_is_set_from_command_line_text_and_survives_a_dump(
    before: Kinds.Config, after: Kinds.Config
) -> None:
    loaded = _reload(dump_yaml(CONV.unstructure(KindsRoot(before))))
    patched = _override(loaded, _as_text(after))
    assert patched == KindsRoot(attrs_evolve(after, extra=before.extra))
    assert _reload(dump_yaml(CONV.unstructure(patched))) == patched


def attrs_evolve(cfg: Kinds.Config, **changes: Any) -> Kinds.Config:
    import attrs

    return attrs.evolve(cfg, **changes)


# --- model arguments are located at their own key -----------------------------------------------------

_MODEL = """\
model:
  _target_: hyper_parallel.models.qwen3_5.create_model_spec
  flavor: debugmodel
  weights_path: /weights
  overrides:
    n_layer: 2
    dim: 2.5
"""


def test_model_arguments_in_a_file_are_reported_at_their_own_lines(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(_MODEL)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert [str(i) for i in info.value.issues] == [
        f"{path}:6:5: model.overrides.n_layer: unknown argument 'n_layer' of Qwen3_5Args; "
        "did you mean 'n_layers'?",
        f"{path}:7:10: model.overrides.dim: expected an integer, got the number 2.5",
    ]


def test_model_arguments_on_the_command_line_are_reported_at_their_flags(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text(_MODEL.replace("    n_layer: 2\n    dim: 2.5\n", "    n_layers: 5\n"))
    assert load_config(path).model.args.n_layers == 5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as info:
        load_config(path, {"model.overrides.n_layer": "2", "model.overrides.dim": "2.5"})
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "overrides['model.overrides.dim']",
            "model.overrides.dim",
            "expected an integer, got the number 2.5",
        ),
        (
            "overrides['model.overrides.n_layer']",
            "model.overrides.n_layer",
            "unknown argument 'n_layer' of Qwen3_5Args; did you mean 'n_layers'?",
        ),
    ]


def test_help_and_schema_describe_the_new_kinds_from_the_same_table() -> None:
    from hyper_parallel.config.help import config_help
    from hyper_parallel.config.schema import type_schema

    lines = config_help(KindsRoot()).splitlines()
    assert "  --kinds.color  ('red' | 'green'; current: red)" in lines
    assert "  --kinds.level  (1 | 2; current: 1)" in lines
    assert "  --kinds.maybe_path  (path | null; current: null)" in lines
    assert "  --kinds.tags  (set[str]; current: [])" in lines
    props = type_schema(Kinds.Config)["properties"]
    assert props["color"]["enum"] == ["red", "green"]
    assert props["level"]["enum"] == [1, 2]
    assert props["maybe_path"]["type"] == ["string", "null"]
    assert props["tags"]["uniqueItems"] is True
