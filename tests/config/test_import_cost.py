"""Start-up and warm-path costs that can be checked without timing anything.

The dry-run path must not import torch or numpy (checked in a fresh process, with shadow packages so an
import is seen even where they are not installed), and a second resolve must reuse what the first one
built: no target is imported again and no structuring function or converter hook is compiled again.
"""

import linecache
from pathlib import Path
from typing import Any

import attrs
import pytest

from hyper_parallel.config import converter, resolve_root
from hyper_parallel.config import types as type_rules
from hyper_parallel.config.recipes import recipe_of
from hyper_parallel.config.yaml_load import load_yaml_file
from hyper_parallel.config_base import ConfigBase
from hyper_parallel.trainer.config import TrainerConfig
from tests.support.stand_ins import DRY_RUN_PROBE, run_without_torch

REPO = Path(__file__).resolve().parents[2]
FULL = REPO / "configs" / "qwen3_5_full.yaml"


@pytest.mark.multiprocess
def test_dry_run_imports_neither_torch_nor_numpy(tmp_path: Path) -> None:
    # The shipped config names placeholder files; the files' checks are tested without torch elsewhere
    # (tests/trainer/test_dry_run_files.py).
    report = run_without_torch(tmp_path, DRY_RUN_PROBE, str(FULL), "--no-file-checks")
    assert report["status"] == 0, report["err"]
    assert "all checks passed" in report["out"]
    assert report["heavy"] == []


_SCHEMA_PROBE = """
import json, sys
from hyper_parallel.config import converter
from hyper_parallel.config.schema import json_schema
from hyper_parallel.trainer.config import TrainerConfig
from tests.support.stand_ins import DRY_RUN_PROBE, run_without_torch
schema = json_schema(converter, TrainerConfig)
heavy = sorted(name for name in ("torch", "numpy") if name in sys.modules)
print(json.dumps({"groups": len(schema["properties"]), "heavy": heavy}))
"""


@pytest.mark.multiprocess
def test_the_schema_imports_neither_torch_nor_numpy(tmp_path: Path) -> None:
    # Target discovery walks the packages: runtime modules (trainers, pipeline stages, export) stay unread.
    assert run_without_torch(tmp_path, _SCHEMA_PROBE) == {"groups": 17, "heavy": []}


@pytest.fixture
def raw() -> Any:
    document, _ = load_yaml_file(FULL)
    return document


def _group_classes(cfg: TrainerConfig) -> list[type]:
    """Runtime classes of the Config-class groups (factory-built groups have no structuring function)."""
    return [
        type(getattr(cfg, f.name))
        for f in attrs.fields(TrainerConfig)
        if recipe_of(getattr(cfg, f.name)) is None
    ]


def test_second_resolve_imports_no_module(raw: Any) -> None:
    import sys

    first = resolve_root(raw)
    before = set(sys.modules)
    second = resolve_root(raw)
    assert second == first
    assert set(sys.modules) == before


def test_second_resolve_reuses_compiled_hooks(raw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_root(raw)
    classes = _group_classes(first)
    assert len(classes) >= 10
    hooks = {cls: converter.get_structure_hook(cls) for cls in classes}
    root_hook = converter.get_structure_hook(TrainerConfig)

    def no_new_hooks(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a structure hook was generated again: {args[0]!r}")

    monkeypatch.setattr(type_rules, "make_dict_structure_fn", no_new_hooks)
    second = resolve_root(raw)
    assert second == first
    assert _group_classes(second) == classes
    for cls, fn in hooks.items():
        assert converter.get_structure_hook(cls) is fn, cls
    assert converter.get_structure_hook(TrainerConfig) is root_hook


@pytest.mark.parametrize("calls", [1, 4])
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"lr": -1.0}, "lr: must be > 0.0, got -1.0"),
        ({"lr": "fast"}, "lr: expected a number, got the string 'fast'"),
        ({"eps": 1e-8, "nesterov": True}, "nesterov: unknown field 'nesterov' for AdamW.Config"),
    ],
)
def test_a_refused_mapping_reads_the_same_however_often_its_class_was_structured(
    calls: int, given: dict[str, Any], message: str
) -> None:
    from hyper_parallel.components.optimizer import AdamW
    from hyper_parallel.config.conversion import ConfigConverter
    from hyper_parallel.errors import ConfigError

    conv = ConfigConverter()
    hook = conv.get_structure_hook(AdamW.Config)
    for _ in range(calls - 1):
        hook({"lr": 0.01}, AdamW.Config)
    with pytest.raises(ConfigError) as caught:
        conv.structure(given, AdamW.Config)
    assert str(caught.value) == message


def test_a_target_re_bound_after_a_resolve_is_checked_and_built_again(
    raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A warm resolve goes straight to each group's hook only while its '_target_' still names that class.
    from hyper_parallel.components import optimizer

    assert type(resolve_root(raw).optimizer) is optimizer.AdamW.Config
    resolve_root(raw)

    @attrs.frozen(kw_only=True)
    class Replaced(optimizer.AdamW.Config):
        """A stand-in bound where the document's target points."""

    Replaced.__module__ = optimizer.__name__
    Replaced.__qualname__ = "AdamW.Config"
    monkeypatch.setattr(optimizer.AdamW, "Config", Replaced)
    assert type(resolve_root(raw).optimizer) is Replaced
    monkeypatch.undo()
    assert type(resolve_root(raw).optimizer) is optimizer.AdamW.Config


def test_a_class_is_written_field_by_field_by_its_runtime_class() -> None:
    from hyper_parallel.components.dataloader import JsonlSource
    from hyper_parallel.config.conversion import ConfigConverter

    conv = ConfigConverter()
    value = JsonlSource(paths=("a.jsonl", "ünï.jsonl"), seed=3)
    written = [conv.unstructure(value) for _ in range(3)]
    want = {f.name: getattr(value, f.name) for f in attrs.fields(JsonlSource)}
    want["paths"] = ["a.jsonl", "ünï.jsonl"]
    assert written == [want] * len(written)


# --- what attrs does not compile for a Config class ----------------------------------------------------


def _twins(name: str) -> tuple[type, type]:
    """The same fields as a Config class and as a plain attrs class (attrs' own repr and hash)."""

    def body() -> dict[str, object]:
        return {
            "lr": attrs.field(default=0.1),
            "names": attrs.field(default=("a",)),
            "hidden": attrs.field(default=1, repr=False),
            "shown": attrs.field(default=2, repr=lambda v: f"<{v}>"),
            "noted": attrs.field(default=3, eq=False),
            "unhashed": attrs.field(default=4, hash=False),
            "folded": attrs.field(default="A", eq=str.lower),
        }

    ours = attrs.make_class(name, body(), bases=(ConfigBase,), frozen=True, kw_only=True, slots=False)
    theirs = attrs.make_class(name, body(), frozen=True, kw_only=True)
    return ours, theirs


_NAN = float("nan")


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"lr": 2.5},
        {"lr": _NAN},  # the same NaN object: equal, as in attrs' tuples; another NaN object is not
        {"names": ()},
        {"hidden": 9},
        {"shown": "x"},
        {"noted": 7},
        {"unhashed": 8},
        {"folded": "a"},  # equal through its eq_key
        {"folded": "b"},
    ],
)
def test_a_config_class_reprs_compares_and_hashes_as_attrs_would(changes: dict[str, object]) -> None:
    ours, theirs = _twins("Twin")
    assert repr(ours(**changes)) == repr(theirs(**changes))
    # equal Configs hash alike; a field attrs leaves out of the hash (hash=False, eq=False) changes nothing
    same = hash(ours(**changes)) == hash(ours())
    assert same == (hash(theirs(**changes)) == hash(theirs()))
    assert (ours(**changes) == ours()) == (theirs(**changes) == theirs())
    assert (ours(**changes) != ours()) == (theirs(**changes) != theirs())
    assert (ours(**changes) == ours(**changes)) == (theirs(**changes) == theirs(**changes))
    nan = {k: (float("nan") if v is _NAN else v) for k, v in changes.items()}  # a NaN of its own
    assert (ours(**changes) == ours(**nan)) == (theirs(**changes) == theirs(**nan))
    assert ours().__eq__(theirs()) is NotImplemented  # another class: Python then asks the other side


def test_attrs_compiles_no_repr_eq_or_hash_for_a_config_class() -> None:
    from hyper_parallel.components.optimizer import AdamW
    from hyper_parallel.config_base import config_eq, config_hash, config_repr

    assert AdamW.Config.__repr__ is config_repr
    assert AdamW.Config.__eq__ is config_eq
    assert AdamW.Config.__hash__ is config_hash
    generated = [
        "".join(entry[2])
        for name, entry in linecache.cache.items()
        if "attrs generated" in name and "AdamW.Config" in name
    ]
    assert generated  # attrs wrote its __init__ ...
    assert any("def __init__" in text for text in generated)
    assert all(f"def {m}" not in text for text in generated for m in ("__repr__", "__eq__", "__hash__"))
