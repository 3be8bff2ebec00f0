"""Acceptance tests of the ``_target_`` resolver: RFC sections 5 and 6, every row of table 9.2.

Everything goes through the public API (``resolve_root``, ``converter``, ``ConfigError``) and asserts what a
user sees: the exact dotted path of each issue and its message.
"""

import inspect
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

import tests.support.fake_targets as fake
from hyper_parallel.components.checkpoint import DCPCheckpoint
from hyper_parallel.components.dataloader import JsonlSource, TextDataLoader
from hyper_parallel.components.loss import CausalLMLoss
from hyper_parallel.components.lr_scheduler import WarmupDecay
from hyper_parallel.components.metrics import MetricsLogger
from hyper_parallel.components.optimizer import SGD, AdamW
from hyper_parallel.components.profiler import TorchProfiler
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.components.validator import LossValidator
from hyper_parallel.config import ConfigError, converter, resolve_root
from hyper_parallel.config.yaml_load import parse_yaml
from hyper_parallel.errors import Issue
from hyper_parallel.models import ModelSpec
from hyper_parallel.trainer.config import (
    ActivationCheckpointConfig,
    CommConfig,
    CompileConfig,
    DebugConfig,
    ParallelismConfig,
    TrainerConfig,
    TrainingConfig,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
TESTS = ("tests.support.fake_targets",)
#: The packages a document may name targets in, as refusals list them.
PACKAGES = "hyper_parallel.components, hyper_parallel.models, hyper_parallel.trainer"
#: What a refusal says can be named.
RULE = f"targets are Config classes and factories in public modules of {PACKAGES} (no '_private' segment)"

QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
ADAMW = "hyper_parallel.components.optimizer.AdamW.Config"
SGD_T = "hyper_parallel.components.optimizer.SGD.Config"
LOSS = "hyper_parallel.components.loss.CausalLMLoss.Config"
SCHED = "hyper_parallel.components.lr_scheduler.WarmupDecay.Config"
TOKENIZER = "hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config"
BYTES = {"_target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config"}  # a tokenizer with no files
DATALOADER = "hyper_parallel.components.dataloader.TextDataLoader.Config"
CHECKPOINT = "hyper_parallel.components.checkpoint.DCPCheckpoint.Config"
TRAINING = "hyper_parallel.trainer.config.TrainingConfig"
PARALLELISM = "hyper_parallel.trainer.config.ParallelismConfig"
AC = "hyper_parallel.trainer.config.ActivationCheckpointConfig"
COMPILE = "hyper_parallel.trainer.config.CompileConfig"

EXPECTED_TAIL = (
    "expected a Config class deriving from Optimizer.Config, or a factory function declared to return one"
)
#: A wrong optimizer target's list of the ones that exist (issue 44 point 6).
OPTIMIZERS = f"; name one of: {ADAMW}, {SGD_T}"
EXPECTED_MODEL_TAIL = (
    "expected a Config class deriving from ModelSpec, or a factory function declared to return one"
)
MISSING_TARGET = (
    "missing '_target_': a root group given in the file names the Config class or factory that builds it"
)
NESTED_TARGET = (
    "'_target_' is only allowed at the top of a root group; nested sections are configured by their "
    "fields, and the owning Config decides what they build"
)

# Every root field of RFC table 5.1 and the concrete class the shipped full config selects for it.
FULL_TYPES: dict[str, type] = {
    "model": ModelSpec,
    "tokenizer": HuggingFaceTokenizer.Config,
    "dataloader": TextDataLoader.Config,
    "optimizer": AdamW.Config,
    "lr_scheduler": WarmupDecay.Config,
    "loss": CausalLMLoss.Config,
    "training": TrainingConfig,
    "parallelism": ParallelismConfig,
    "checkpoint": DCPCheckpoint.Config,
    "activation_checkpoint": ActivationCheckpointConfig,
    "metrics": MetricsLogger.Config,
    "profiler": TorchProfiler.Config,
    "validator": LossValidator.Config,
    "debug": DebugConfig,
    "compile": CompileConfig,
    "comm": CommConfig,
}


def load(name: str) -> Any:
    """The raw mapping of a shipped config, parsed under YAML 1.2 (``1e-4`` is a float)."""
    return parse_yaml((CONFIGS / name).read_text(encoding="utf-8"))[0]


def model(**args: Any) -> dict[str, Any]:
    # weights_path gives the default tokenizer its files (without it, tokenizer.path would be required)
    return {"_target_": QWEN, "flavor": "debugmodel", "weights_path": "/weights", **args}


def doc(**groups: Any) -> dict[str, Any]:
    """A document with a sound ``model`` group plus ``groups``."""
    return {"model": model(), **groups}


def group(target: str, **fields: Any) -> dict[str, Any]:
    return {"_target_": target, **fields}


def issues(raw: object, allowed: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        resolve_root(raw, allowed_targets=allowed)  # type: ignore[arg-type]
    return [(i.path, i.message) for i in info.value.issues]


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    fake.CALLS.clear()


# -- full YAML, defaults, shipped configs --------------------------------------------------------------


def test_full_yaml_gives_every_field_an_object_of_the_right_type() -> None:
    raw = load("qwen3_5_full.yaml")
    assert list(raw) == [f.name for f in attrs.fields(TrainerConfig)]  # all 17, each with a target
    assert all("_target_" in node for node in raw.values())
    cfg = resolve_root(raw)
    assert type(cfg) is TrainerConfig
    assert {name: type(getattr(cfg, name)) for name in FULL_TYPES} == FULL_TYPES
    assert len(FULL_TYPES) == 16


def test_full_yaml_values_arrive_typed() -> None:
    cfg = resolve_root(load("qwen3_5_full.yaml"))
    assert cfg.model.name == "qwen3_5"
    assert cfg.model.flavor == "0.8B"
    assert cfg.model.weights_path == "/path/to/Qwen3.5-0.8B-Base"
    assert cfg.optimizer == AdamW.Config(
        lr=2e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, implementation="fused"
    )
    assert type(cfg.optimizer.lr) is float
    assert isinstance(cfg.dataloader, TextDataLoader.Config)
    assert type(cfg.dataloader.dataset) is JsonlSource
    assert cfg.dataloader.dataset.paths == (
        "/data/pretrain/shard-000.jsonl",
        "/data/pretrain/shard-001.jsonl",
    )
    assert cfg.training.global_batch_size == 64
    assert cfg.compile.components == ("model", "loss")
    assert cfg.comm.backend is None


def test_resolve_root_equals_converter_structure() -> None:
    raw = load("qwen3_5_full.yaml")
    assert resolve_root(raw) == converter.structure(raw, TrainerConfig)


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_resolves(name: str) -> None:
    raw = load(name)
    cfg = resolve_root(raw)
    assert isinstance(cfg, TrainerConfig)
    assert cfg == converter.structure(raw, TrainerConfig)


def test_shipped_configs_are_the_ones_the_issue_names() -> None:
    names = {p.name for p in CONFIGS.glob("*.yaml")}
    assert {"qwen3_5.yaml", "qwen3_5_full.yaml", "llama3_8b.yaml"} <= names


def test_a_config_class_target_dispatches_to_its_own_class() -> None:
    cfg = resolve_root(doc(optimizer=group(SGD_T, lr=0.1, momentum=0.9, nesterov=True)))
    assert cfg.optimizer == SGD.Config(lr=0.1, momentum=0.9, nesterov=True)


OMITTED = [
    "tokenizer",
    "lr_scheduler",
    "activation_checkpoint",
    "metrics",
    "profiler",
    "validator",
    "debug",
    "compile",
    "comm",
]


@pytest.mark.parametrize("field", OMITTED)
def test_minimal_example_takes_the_trainer_config_default_for_omitted_groups(field: str) -> None:
    raw = load("qwen3_5.yaml")
    assert field not in raw
    default = getattr(attrs.fields(TrainerConfig), field).default
    assert getattr(resolve_root(raw), field) == default.factory()


def test_minimal_example_is_the_rfc_example() -> None:
    raw = load("qwen3_5.yaml")
    # The RFC's groups and the checkpoint group: a run from model.weights_path saves what it trains.
    assert sorted(raw) == [
        "checkpoint",
        "dataloader",
        "loss",
        "model",
        "optimizer",
        "parallelism",
        "training",
    ]
    cfg = resolve_root(raw)
    assert (cfg.checkpoint.enable, cfg.checkpoint.folder) == (True, "checkpoints/qwen3_5")
    assert type(cfg.lr_scheduler) is WarmupDecay.Config
    assert type(cfg.tokenizer) is HuggingFaceTokenizer.Config
    assert cfg.training == TrainingConfig(max_steps=100, global_batch_size=8)
    assert cfg.parallelism == ParallelismConfig(tp=2)
    assert cfg.optimizer == AdamW.Config(lr=0.0002, weight_decay=0.1)
    assert cfg.loss == CausalLMLoss.Config(ignore_index=-100)
    assert cfg.model.name == "qwen3_5"
    assert cfg.model.weights_path == "/path/to/Qwen3.5-0.8B-Base"


def test_only_model_is_required() -> None:
    assert resolve_root({"model": model()}) == TrainerConfig(model=resolve_root(doc()).model)
    assert issues({}) == [("model", "missing required root group 'model'")]


# -- the root document ---------------------------------------------------------------------------------


def test_unknown_root_field_calls_no_target_but_checks_every_group_by_names_and_types() -> None:
    raw = {
        "model": {"_target_": "tests.support.fake_targets.recording_model_spec", "flavor": 3},
        "tokenizer": BYTES,
        "optimizer": {"_target_": "tests.support.fake_targets.RecordingOptimizerConfig", "lr": "x"},
        "training": {"_target_": TRAINING, "max_stepz": 3, "seq_len": -4},
        "dataloader": {"_target_": DATALOADER, "dataset": {"sourc": "jsonl"}},
        "optimzer": {"_target_": ADAMW},
    }
    assert issues(raw, TESTS) == [
        ("dataloader.dataset.sourc", "unknown field 'sourc' for DatasetConfig; did you mean 'source'?"),
        ("model.flavor", "expected a string, got the integer 3"),
        ("optimizer.lr", "expected a number, got the string 'x'"),
        ("optimzer", "unknown root field 'optimzer'; did you mean 'optimizer'?"),
        ("training.max_stepz", "unknown field 'max_stepz' for TrainingConfig; did you mean 'max_steps'?"),
    ]
    # No target was called (no factory, no Config class constructed), and the validators of the groups
    # (training.seq_len > 0) wait until the root is clean.
    assert fake.CALLS == []
    # The same targets are called when the document is sound: the recording is real.
    del raw["optimzer"]
    raw["model"] = {"_target_": "tests.support.fake_targets.recording_model_spec"}
    raw["optimizer"] = {"_target_": "tests.support.fake_targets.RecordingOptimizerConfig"}
    raw["training"] = {"_target_": TRAINING}
    raw["dataloader"] = {"_target_": DATALOADER}
    resolve_root(raw, allowed_targets=TESTS)
    assert sorted(fake.CALLS) == ["RecordingOptimizerConfig", "recording_model_spec"]


def test_an_unknown_key_of_a_config_group_is_reported_before_its_class_is_called() -> None:
    raw = {
        "model": {"_target_": "tests.support.fake_targets.recording_model_spec"},
        "optimizer": {
            "_target_": "tests.support.fake_targets.RecordingOptimizerConfig",
            "lrr": 0.1,
            "lr": -1,
        },
        "training": {"_target_": TRAINING, "seq_len": -4},
    }
    # The optimizer is checked by names and types (lr: -1 is a number); its validators wait for its names.
    assert issues(raw, TESTS) == [
        ("optimizer.lrr", "unknown field 'lrr' for RecordingOptimizerConfig; did you mean 'lr'?"),
        ("training.seq_len", "must be > 0, got -4"),
    ]
    # The Config class was never constructed; the model's factory, its own names all known and every group
    # naming its target, was called, so the rules that read the model report in the same run.
    assert fake.CALLS == ["recording_model_spec"]


SECTIONS = "tests.support.fake_targets.SectionsOptimizerConfig"
RECORDED_SECTIONS = [  # what building a sound SectionsOptimizerConfig with one listed section records
    "validate RecordingSection.size",
    "RecordingSection",
    "validate RecordingSection.size",
    "RecordingSection",
    "validate SectionsOptimizerConfig.section",
    "validate SectionsOptimizerConfig.sections",
    "SectionsOptimizerConfig",
]


def test_nothing_is_constructed_or_validated_before_every_name_at_every_depth_is_known() -> None:
    raw = {
        "model": {"_target_": "tests.support.fake_targets.recording_model_spec"},
        "tokenizer": BYTES,
        "optimizer": {
            "_target_": SECTIONS,
            "lr": -1.0,
            "section": {"size": 2},
            "sections": [{"size": "3"}, {"sise": 4}],
        },
        "training": {"_target_": TRAINING, "seq_len": -4},
    }
    assert issues(raw, TESTS) == [
        ("optimizer.sections[0].size", "expected an integer, got the string '3'"),
        ("optimizer.sections[1].sise", "unknown field 'sise' for RecordingSection; did you mean 'size'?"),
        ("training.seq_len", "must be > 0, got -4"),
    ]
    assert fake.CALLS == ["recording_model_spec"]  # no section, no optimizer, no validator of theirs
    # The same names, all known: every class is built, and its validators run.
    fake.CALLS.clear()
    raw["optimizer"] = {"_target_": SECTIONS, "section": {"size": 2}, "sections": [{"size": 3}]}
    raw["training"] = {"_target_": TRAINING}
    resolve_root(raw, allowed_targets=TESTS)
    assert sorted(fake.CALLS) == sorted([*RECORDED_SECTIONS, "recording_model_spec"])


def test_an_unknown_name_in_a_dataset_variant_is_told_beside_its_other_fields_type_errors() -> None:
    dataset = {"source": "jsonl", "pathz": ["a.jsonl"], "paths": 3}
    raw = {
        "model": {"_target_": "tests.support.fake_targets.recording_model_spec"},
        "tokenizer": BYTES,
        "dataloader": {"_target_": DATALOADER, "dataset": dataset},
    }
    assert issues(raw, TESTS) == [
        ("dataloader.dataset.paths", "expected a list, got the integer 3"),
        ("dataloader.dataset.pathz", "unknown field 'pathz' for DatasetConfig; did you mean 'paths'?"),
    ]
    assert fake.CALLS == ["recording_model_spec"]  # the model's names are known: only the dataloader waits


def test_a_config_class_structured_alone_builds_no_section_before_every_name_is_known() -> None:
    raw = {"section": {"size": 2}, "sections": [{"size": 3}, {"sise": 4}]}
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, fake.SectionsOptimizerConfig)
    assert [(i.path, i.message) for i in info.value.issues] == [
        ("sections[1].sise", "unknown field 'sise' for RecordingSection; did you mean 'size'?")
    ]
    assert fake.CALLS == []  # not even the sound section before it


def test_no_factory_is_called_while_another_group_lacks_its_target() -> None:
    raw = {
        "model": {"_target_": "tests.support.fake_targets.recording_model_spec", "flavor": "debugmodel"},
        "tokenizer": BYTES,
        "optimizer": {"_target_": SECTIONS, "section": {"size": 2}, "sections": [{"size": 3}]},
        "loss": {"ignore_index": -100},
    }
    assert issues(raw, TESTS) == [("loss._target_", MISSING_TARGET)]
    assert "recording_model_spec" not in fake.CALLS  # the factory waits for every group's names
    assert fake.CALLS == RECORDED_SECTIONS  # a group whose names are all known is built and validated


def test_a_config_class_may_use_attrs_converters_and_post_init() -> None:
    raw = {
        "model": model(),
        "optimizer": {"_target_": "tests.support.fake_targets.PercentOptimizerConfig", "lr": 5},
    }
    cfg = resolve_root(raw, allowed_targets=TESTS)
    assert (type(cfg.optimizer).__name__, cfg.optimizer.lr) == ("PercentOptimizerConfig", 0.05)
    raw["optimizer"] = {"_target_": "tests.support.fake_targets.RecordingOptimizerConfig", "lr": 0.5}
    assert resolve_root(raw, allowed_targets=TESTS).optimizer.lr == 0.5
    assert fake.CALLS == ["RecordingOptimizerConfig"]


def test_validators_see_the_converted_value_when_another_field_of_the_group_is_wrong() -> None:
    percent = "tests.support.fake_targets.PercentOptimizerConfig"
    raw = {"model": model(), "optimizer": {"_target_": percent, "lr": 50, "weight_decay": "x"}}
    # 50 percent is 0.5, which the validator (0 < lr <= 1) accepts: only the other field is reported.
    assert issues(raw, TESTS) == [("optimizer.weight_decay", "expected a number, got the string 'x'")]
    raw["optimizer"]["lr"] = 150
    assert issues(raw, TESTS) == [
        ("optimizer.lr", "must be <= 1.0, got 1.5"),
        ("optimizer.weight_decay", "expected a number, got the string 'x'"),
    ]
    raw["optimizer"] = {"_target_": percent, "lr": 150, "weight_decay": -1.0}  # two validators fail
    assert issues(raw, TESTS) == [
        ("optimizer.lr", "must be <= 1.0, got 1.5"),
        ("optimizer.weight_decay", "must be >= 0.0, got -1.0"),
    ]


def test_every_unknown_root_field_is_reported() -> None:
    raw = doc(trainig={"_target_": TRAINING}, foo={}, _target_="x.y")
    assert issues(raw) == [
        ("_target_", "unknown root field '_target_'"),
        ("foo", "unknown root field 'foo'"),
        ("trainig", "unknown root field 'trainig'; did you mean 'training'?"),
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([{"model": {}}], "expected a mapping of root groups, got a list of 1 item"),
        ("model", "expected a mapping of root groups, got the string 'model'"),
        (None, "expected a mapping of root groups, got null"),
        (3, "expected a mapping of root groups, got the integer 3"),
    ],
)
def test_root_that_is_not_a_mapping(raw: object, message: str) -> None:
    assert issues(raw) == [("top level", message)]


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (ADAMW, f"expected a mapping with '_target_', got the string {ADAMW!r}"),
        ([ADAMW], "expected a mapping with '_target_', got a list of 1 item"),
        (None, "expected a mapping with '_target_', got null"),
        (0.1, "expected a mapping with '_target_', got the number 0.1"),
    ],
)
def test_group_that_is_not_a_mapping(node: object, message: str) -> None:
    assert issues(doc(optimizer=node)) == [("optimizer", message)]


def test_missing_target_in_a_given_group() -> None:
    assert issues(doc(optimizer={"lr": 1e-4})) == [("optimizer._target_", MISSING_TARGET)]
    assert issues(doc(training={})) == [("training._target_", MISSING_TARGET)]


def test_missing_target_does_not_hide_problems_in_other_groups() -> None:
    raw = doc(optimizer={"lr": 1e-4}, loss=group(LOSS, reduction="avg"), training=3)
    assert issues(raw) == [
        ("loss.reduction", "expected one of 'mean', 'sum', got the string 'avg'"),
        ("optimizer._target_", MISSING_TARGET),
        ("training", "expected a mapping with '_target_', got the integer 3"),
    ]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (5, "'_target_' must be a dotted name (a string), got 5"),
        (None, "'_target_' must be a dotted name (a string), got None"),
        ([ADAMW], f"'_target_' must be a dotted name (a string), got [{ADAMW!r}]"),
        (True, "'_target_' must be a dotted name (a string), got True"),
        ("AdamW", "'_target_' must be a dotted name such as 'package.module.Name', got 'AdamW'"),
        (
            "hyper_parallel..AdamW",
            "'_target_' must be a dotted name such as 'package.module.Name', got 'hyper_parallel..AdamW'",
        ),
    ],
)
def test_target_that_is_not_a_dotted_string(target: object, message: str) -> None:
    assert issues(doc(optimizer={"_target_": target})) == [("optimizer._target_", message)]


# -- importing targets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("hyper_parallel.nope.X", f"'hyper_parallel.nope.X' is not a config target: {RULE}"),
        (
            "hyper_parallel.components.nope.X",
            f"module 'hyper_parallel.components' has no attribute 'nope'{OPTIMIZERS}",
        ),
        (
            "hyper_parallel.components.optimizer.AdamX.Config",
            "module 'hyper_parallel.components.optimizer' has no attribute 'AdamX'; did you mean 'AdamW'?",
        ),
        (
            "hyper_parallel.components.optimizer.AdamW.Confg",
            "'hyper_parallel.components.optimizer.AdamW' has no attribute 'Confg'; did you mean 'Config'?",
        ),
        (
            "hyper_parallel.components.optimizer",
            f"'hyper_parallel.components.optimizer' is a module; {EXPECTED_TAIL}",
        ),
        (
            "hyper_parallel.components.optimizer.AdamW",
            "'hyper_parallel.components.optimizer.AdamW' is the class AdamW; "
            "did you mean 'hyper_parallel.components.optimizer.AdamW.Config'?",
        ),
        (LOSS, f"{LOSS!r} is the class CausalLMLoss.Config; {EXPECTED_TAIL}{OPTIMIZERS}"),
        (
            "hyper_parallel.trainer.config.TrainingConfig",
            f"'hyper_parallel.trainer.config.TrainingConfig' is the class TrainingConfig; {EXPECTED_TAIL}"
            f"{OPTIMIZERS}",
        ),
        (
            "hyper_parallel.components.optimizer.__all__",
            "'hyper_parallel.components.optimizer.__all__' names a private or dunder segment ('__all__'), "
            f"which is never a target: {RULE}",
        ),
        (
            "hyper_parallel.models._factory.apply_overrides",
            "'hyper_parallel.models._factory.apply_overrides' names a private or dunder segment "
            f"('_factory'), which is never a target: {RULE}",
        ),
        (
            "hyper_parallel.components.optimizer.AdamW.Config.__init__",
            "'hyper_parallel.components.optimizer.AdamW.Config.__init__' names a private or dunder "
            f"segment ('__init__'), which is never a target: {RULE}",
        ),
        (
            "os.system",
            f"'os.system' is outside the allowed target prefixes ({PACKAGES}); trusted code can allow "
            "more with allowed_targets=, --allow-target or $HYPER_PARALLEL_ALLOWED_TARGETS",
        ),
        (
            "hyper_parallelx.evil.Config",
            f"'hyper_parallelx.evil.Config' is outside the allowed target prefixes ({PACKAGES}); trusted "
            "code can allow more with allowed_targets=, --allow-target or $HYPER_PARALLEL_ALLOWED_TARGETS",
        ),
        (
            "tests.support.fake_targets.RecordingOptimizerConfig",
            "'tests.support.fake_targets.RecordingOptimizerConfig' is outside the allowed target prefixes "
            f"({PACKAGES}); trusted code can allow more with allowed_targets=, --allow-target or "
            "$HYPER_PARALLEL_ALLOWED_TARGETS",
        ),
        (
            "hyper_parallel.components.optimizer.attrs.field",
            "'hyper_parallel.components.optimizer.attrs.field' is defined in module "
            f"{attrs.field.__module__!r}, outside the allowed target prefixes ({PACKAGES})",
        ),
    ],
)
def test_target_import_failures(target: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYPER_PARALLEL_ALLOWED_TARGETS", raising=False)
    assert issues(doc(optimizer={"_target_": target, "lr": 1e-4})) == [("optimizer._target_", message)]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "tests.support.fake_targets.INSTANCE",
            f"'tests.support.fake_targets.INSTANCE' is an instance of NotAConfig; {EXPECTED_TAIL}",
        ),
        (
            "tests.support.fake_targets.NotAConfig",
            f"'tests.support.fake_targets.NotAConfig' is the class NotAConfig; {EXPECTED_TAIL}",
        ),
        (
            "tests.support.fake_targets.CALLS",
            f"'tests.support.fake_targets.CALLS' is an instance of list; {EXPECTED_TAIL}",
        ),
        (
            "tests.support.fake_targets.reexported_system",
            "'tests.support.fake_targets.reexported_system' is defined in module "
            f"{os.system.__module__!r}, outside "
            f"the allowed target prefixes ({PACKAGES}, tests.support.fake_targets)",
        ),
        (
            "tests.support.fake_targets.nope",
            f"module 'tests.support.fake_targets' has no attribute 'nope'{OPTIMIZERS}, "
            "tests.support.fake_targets.PercentOptimizerConfig, "
            "tests.support.fake_targets.RecordingOptimizerConfig, "
            "tests.support.fake_targets.SectionsOptimizerConfig, "
            "tests.support.fake_targets.make_optimizer",
        ),
    ],
)
def test_allowed_module_still_refuses_what_is_not_a_target(
    target: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HYPER_PARALLEL_ALLOWED_TARGETS", raising=False)
    assert issues(doc(optimizer={"_target_": target}), TESTS) == [("optimizer._target_", message)]
    assert fake.CALLS == []


def test_a_target_named_through_a_reexport_is_accepted_under_its_own_module() -> None:
    # tests.support.fake_targets imports create_model_spec; it is defined in an allowed module, so it may be
    # named.
    cfg = resolve_root(
        {"model": {"_target_": "tests.support.fake_targets.create_model_spec"}, "tokenizer": BYTES},
        allowed_targets=TESTS,
    )
    assert cfg.model == resolve_root({"model": {"_target_": QWEN}, "tokenizer": BYTES}).model


# -- parameters ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (
            doc(optimizer=group(ADAMW, lrr=1e-4)),
            "optimizer.lrr",
            "unknown field 'lrr' for AdamW.Config; did you mean 'lr'?",
        ),
        (
            {"model": model(weight_path="/w")},
            "model.weight_path",
            "unknown parameter 'weight_path' of create_model_spec(); did you mean 'weights_path'?",
        ),
        (
            doc(dataloader=group(DATALOADER, dataset={"source": "jsonl", "pathz": ["/d"]})),
            "dataloader.dataset.pathz",
            "unknown field 'pathz' for DatasetConfig; did you mean 'paths'?",
        ),
        (
            doc(optimizer=group(ADAMW, momentum=0.9)),
            "optimizer.momentum",
            "unknown field 'momentum' for AdamW.Config",
        ),
    ],
)
def test_unknown_parameter(raw: dict[str, Any], path: str, message: str) -> None:
    assert issues(raw) == [(path, message)]


def test_unknown_factory_parameter_is_refused_before_the_call() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.recording_model_spec", "flavour": "debugmodel"}}
    assert issues(raw, TESTS) == [
        ("model.flavour", "unknown parameter 'flavour' of recording_model_spec(); did you mean 'flavor'?")
    ]
    assert fake.CALLS == []


def test_missing_required_parameter_names_it_and_its_path() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.failing_model_spec"}}
    assert issues(raw, TESTS) == [
        ("model.flavor", "missing required parameter 'flavor' of failing_model_spec()")
    ]


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        # int field: int only
        (
            doc(training=group(TRAINING, max_steps="1")),
            "training.max_steps",
            "expected an integer, got the string '1'",
        ),
        (
            doc(training=group(TRAINING, max_steps=True)),
            "training.max_steps",
            "expected an integer, got the boolean true",
        ),
        (
            doc(training=group(TRAINING, max_steps=1.5)),
            "training.max_steps",
            "expected an integer, got the number 1.5",
        ),
        (
            doc(training=group(TRAINING, max_steps=100.0)),
            "training.max_steps",
            "expected an integer, got the number 100.0",
        ),
        (  # (max_steps may be null: training.epochs then gives the run's length)
            doc(training=group(TRAINING, global_batch_size=None)),
            "training.global_batch_size",
            "expected an integer, got null",
        ),
        # float field: int or float, never bool or str
        (
            doc(optimizer=group(ADAMW, lr="1e-4")),
            "optimizer.lr",
            "expected a number, got the string '1e-4'"
            " (a number in quotes is text: remove the quotes; a YAML 1.1 reader such as yaml.safe_load also "
            "reads 1e-4 as text: write 1.0e-4, or load the file with load_config, which reads YAML 1.2)",
        ),
        (doc(optimizer=group(ADAMW, lr=True)), "optimizer.lr", "expected a number, got the boolean true"),
        (doc(optimizer=group(ADAMW, lr=float("nan"))), "optimizer.lr", "expected a finite number, got nan"),
        # bool field: bool only
        (
            doc(training=group(TRAINING, enable_cpu_offload="yes")),
            "training.enable_cpu_offload",
            "expected a boolean (true or false), got the string 'yes'",
        ),
        (
            doc(parallelism=group(PARALLELISM, sequence_parallel=1)),
            "parallelism.sequence_parallel",
            "expected a boolean (true or false), got the integer 1",
        ),
        # str field: str only
        (
            doc(checkpoint=group(CHECKPOINT, folder=12)),
            "checkpoint.folder",
            "expected a string, got the integer 12",
        ),
        # a string is never a sequence
        (
            doc(optimizer=group(ADAMW, no_decay_names="bias")),
            "optimizer.no_decay_names",
            "expected a list, got the string 'bias'",
        ),
        (
            doc(dataloader=group(DATALOADER, dataset={"source": "jsonl", "paths": "/data/a.jsonl"})),
            "dataloader.dataset.paths",
            "expected a list, got the string '/data/a.jsonl'",
        ),
        (
            doc(dataloader=group(DATALOADER, dataset={"source": "jsonl", "paths": ["/a", 2]})),
            "dataloader.dataset.paths[1]",
            "expected a string, got the integer 2",
        ),
        (doc(optimizer=group(ADAMW, betas=[0.9])), "optimizer.betas", "expected a list of 2 items, got 1"),
        (
            doc(optimizer=group(ADAMW, betas=[0.9, "0.95"])),
            "optimizer.betas[1]",
            "expected a number, got the string '0.95' (a number in quotes is text: remove the quotes)",
        ),
        # Literal, with did-you-mean
        (
            doc(tokenizer=group(TOKENIZER, padding_side="rigth")),
            "tokenizer.padding_side",
            "expected one of 'left', 'right', got the string 'rigth'; did you mean 'right'?",
        ),
        (
            doc(activation_checkpoint=group(AC, mode="ful")),
            "activation_checkpoint.mode",
            "expected one of 'none', 'full', 'selective', got the string 'ful'; did you mean 'full'?",
        ),
        (
            doc(compile=group(COMPILE, components=["model", "los"])),
            "compile.components[1]",
            "expected one of 'model', 'loss', got the string 'los'; did you mean 'loss'?",
        ),
        # Optional
        (
            doc(training=group(TRAINING, max_grad_norm="1.0")),
            "training.max_grad_norm",
            "expected a number, got the string '1.0' (a number in quotes is text: remove the quotes)",
        ),
        # nested attrs section
        (
            doc(dataloader=group(DATALOADER, dataset="jsonl")),
            "dataloader.dataset",
            "expected a mapping for DatasetConfig, got the string 'jsonl'",
        ),
        # factory parameters are checked against the signature's annotations
        (
            {"model": model(flavor="0.9B")},
            "model.flavor",
            # another size is never suggested (tests/cli/test_hints.py): the choices are listed
            "expected one of 'debugmodel', '0.8B', '2B', '4B', '9B', 'auto', got the string '0.9B'",
        ),
        ({"model": model(weights_path=3)}, "model.weights_path", "expected a string, got the integer 3"),
        (
            {"model": model(overrides="n_layers=2")},
            "model.overrides",
            "expected a mapping, got the string 'n_layers=2'",
        ),
        (
            {"model": model(overrides={"n_layers": [2]})},
            "model.overrides.n_layers",
            "expected an integer or a number or a boolean (true or false) or a string or null, "
            "got a list of 1 item",
        ),
    ],
)
def test_parameter_type_errors(raw: dict[str, Any], path: str, message: str) -> None:
    assert issues(raw) == [(path, message)]


def test_factory_parameter_type_error_is_refused_before_the_call() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.recording_model_spec", "flavor": 7}}
    assert issues(raw, TESTS) == [("model.flavor", "expected a string, got the integer 7")]
    assert fake.CALLS == []


def test_sound_scalars_are_accepted_exactly() -> None:
    cfg = resolve_root(
        doc(
            optimizer=group(ADAMW, lr=1, no_decay_names=["bias"]),
            training=group(TRAINING, max_grad_norm=None, enable_cpu_offload=True),
            activation_checkpoint=group(AC, selective_option=2),
        )
    )
    assert cfg.optimizer.lr == 1.0
    assert type(cfg.optimizer.lr) is float
    assert cfg.optimizer.no_decay_names == ("bias",)
    assert cfg.training.max_grad_norm is None
    assert cfg.activation_checkpoint.selective_option == 2


# -- validators and cross-field checks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (doc(optimizer=group(ADAMW, lr=-1.0)), "optimizer.lr", "must be > 0.0, got -1.0"),
        (doc(optimizer=group(ADAMW, lr=0)), "optimizer.lr", "must be > 0.0, got 0.0"),
        (doc(training=group(TRAINING, max_steps=0)), "training.max_steps", "must be > 0, got 0"),
        (doc(parallelism=group(PARALLELISM, tp=0)), "parallelism.tp", "must be >= 1, or -1 for auto, got 0"),
        (
            doc(loss=group(LOSS, label_smoothing=1.0)),
            "loss.label_smoothing",
            "must be < 1.0, got 1.0",
        ),
        (
            doc(dataloader=group(DATALOADER, dataset={"source": "jsonl", "paths": ["/a"], "seed": -1})),
            "dataloader.dataset.seed",
            "must be >= 0, got -1",
        ),
    ],
)
def test_validator_failures_are_reported_at_the_field(raw: dict[str, Any], path: str, message: str) -> None:
    assert issues(raw) == [(path, message)]


def test_every_validator_failure_in_a_group_is_reported() -> None:
    raw = doc(optimizer=group(ADAMW, lr=-1.0, eps=0.0, weight_decay=-0.1, betas=[0.9, 1.5]))
    assert issues(raw) == [
        ("optimizer.betas[1]", "must be < 1.0, got 1.5"),
        ("optimizer.eps", "must be > 0.0, got 0.0"),
        ("optimizer.lr", "must be > 0.0, got -1.0"),
        ("optimizer.weight_decay", "must be >= 0.0, got -0.1"),
    ]


def test_a_type_error_does_not_hide_a_validator_failure_in_the_same_group() -> None:
    raw = doc(optimizer=group(ADAMW, lr=-1.0, eps="1e-8"))
    assert issues(raw) == [
        (
            "optimizer.eps",
            "expected a number, got the string '1e-8'"
            " (a number in quotes is text: remove the quotes; a YAML 1.1 reader such as yaml.safe_load also "
            "reads 1e-4 as text: write 1.0e-4, or load the file with load_config, which reads YAML 1.2)",
        ),
        ("optimizer.lr", "must be > 0.0, got -1.0"),
    ]


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (
            doc(training=group(TRAINING, global_batch_size=7, micro_batch_size=2)),
            "training.global_batch_size",
            "must be a multiple of micro_batch_size (2), got 7",
        ),
        (
            doc(
                parallelism=group(PARALLELISM, dp_shard=1, pp=2),
                training=group(TRAINING, micro_batch_size=2),
            ),
            "parallelism.pp",
            "pipeline parallelism is not supported yet by Qwen 3.5 (its model is not split into pipeline "
            "stages); use 1 and scale with dp_shard (FSDP) or tp, got 2",
        ),
        (
            doc(optimizer=group(SGD_T, nesterov=True)),
            "optimizer.momentum",
            "must be > 0 when nesterov is true, got 0.0",
        ),
        (
            doc(dataloader=group(DATALOADER, dataset={"source": "jsonl"})),
            "dataloader.dataset.paths",
            "must list at least one file or directory when source is 'jsonl'",
        ),
    ],
)
def test_cross_field_failures_name_the_field_to_change(raw: dict[str, Any], path: str, message: str) -> None:
    assert issues(raw) == [(path, message)]


def test_compile_without_pipeline_parallelism_is_fine() -> None:
    cfg = resolve_root(doc(compile=group(COMPILE, enable=True), parallelism=group(PARALLELISM, pp=1)))
    assert cfg.compile.enable


# -- factories -------------------------------------------------------------------------------------------


def test_wrong_return_annotation_is_refused_before_the_call() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.wrong_annotation"}}
    assert issues(raw, TESTS) == [
        (
            "model._target_",
            "factory 'tests.support.fake_targets.wrong_annotation' is declared to return int; "
            f"{EXPECTED_MODEL_TAIL}",
        )
    ]
    assert fake.CALLS == []


def test_factory_declared_for_another_group_is_refused() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.make_optimizer", "lr": 1.0}}
    assert issues(raw, TESTS) == [
        (
            "model._target_",
            "factory 'tests.support.fake_targets.make_optimizer' is declared to return Optimizer.Config; "
            f"{EXPECTED_MODEL_TAIL}",
        )
    ]


def test_lying_factory_is_refused_after_the_call() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.lying_model_spec"}}
    assert issues(raw, TESTS) == [
        ("model", "lying_model_spec() returned a str, not the ModelSpec it declares")
    ]


def test_unannotated_factory_is_refused_before_the_call() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.unannotated"}}
    assert issues(raw, TESTS) == [
        (
            "model._target_",
            "factory 'tests.support.fake_targets.unannotated' declares no return type; "
            f"{EXPECTED_MODEL_TAIL}",
        )
    ]
    assert fake.CALLS == []


def test_factory_raising_value_error_is_reported_at_the_group_without_traceback() -> None:
    raw = {"model": {"_target_": "tests.support.fake_targets.failing_model_spec", "flavor": "x"}}
    with pytest.raises(ConfigError) as info:
        resolve_root(raw, allowed_targets=TESTS)
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "model",
            "failing_model_spec() raised ValueError: no such checkpoint layout for 'x' "
            f"(at tests/support/fake_targets.py:{inspect.getsourcelines(fake.failing_model_spec)[1] + 2})",
        )
    ]
    assert "Traceback" not in str(info.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ or info.value.__context__ is None


def test_builtin_factory_reports_each_bad_model_argument_at_its_key() -> None:
    raw = {"model": model(overrides={"n_layers": "3", "dimm": 8})}
    assert issues(raw) == [
        ("model.overrides.dimm", "unknown argument 'dimm' of Qwen3_5Args; did you mean 'dim'?"),
        ("model.overrides.n_layers", "expected an integer, got the string '3'"),
    ]


def test_factory_result_is_recorded_as_called_once() -> None:
    cfg = resolve_root(
        {"model": {"_target_": "tests.support.fake_targets.recording_model_spec"}, "tokenizer": BYTES},
        allowed_targets=TESTS,
    )
    assert fake.CALLS == ["recording_model_spec"]
    assert cfg.model.flavor == "debugmodel"


# -- nested _target_ -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        (
            doc(
                dataloader=group(
                    DATALOADER, dataset={"_target_": "hyper_parallel.x.Dataset", "source": "text"}
                )
            ),
            "dataloader.dataset._target_",
        ),
        (
            doc(
                validator={
                    "_target_": "hyper_parallel.components.validator.LossValidator.Config",
                    "dataset": {"_target_": "hyper_parallel.x.Dataset"},
                }
            ),
            "validator.dataset._target_",
        ),
        ({"model": model(overrides={"_target_": "hyper_parallel.x.Args"})}, "model.overrides._target_"),
    ],
)
def test_nested_target_is_an_error(raw: dict[str, Any], path: str) -> None:
    assert issues(raw) == [(path, NESTED_TARGET)]


# -- no side effects -----------------------------------------------------------------------------------


def test_resolving_calls_no_runtime_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import hyper_parallel.models.qwen3_5 as qwen
    import hyper_parallel.models.qwen3_5._runtime as runtime

    called: list[str] = []

    def recorder(name: str) -> Any:
        def hook(*args: Any, **kwargs: Any) -> None:
            called.append(name)

        return hook

    class RecordingAdapter(runtime.Qwen3_5StateDictAdapter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            called.append("adapter")

    hooks = {"build_model": recorder("build_model"), "parallelize": recorder("parallelize")}
    for module in (qwen, runtime):
        for name, hook in hooks.items():
            monkeypatch.setattr(module, name, hook)
        monkeypatch.setattr(module, "Qwen3_5StateDictAdapter", RecordingAdapter)

    cfg = resolve_root(load("qwen3_5_full.yaml"))
    assert cfg.model.build_model_fn is hooks["build_model"]  # the hook is stored ...
    assert cfg.model.parallelize_fn is hooks["parallelize"]
    assert cfg.model.state_dict_adapter is RecordingAdapter
    assert called == []  # ... and never called


@pytest.mark.multiprocess
def test_resolving_imports_no_torch_numpy_or_trainer(tmp_path: Path) -> None:
    # Shadow packages: if anything imports torch or numpy, it lands in sys.modules even where they are
    # not installed, so the check below cannot pass vacuously.
    for name in ("torch", "numpy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("", encoding="utf-8")
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from hyper_parallel.config import resolve_root\n"
        "from hyper_parallel.config.yaml_load import parse_yaml\n"
        "cfg = resolve_root(parse_yaml(Path('configs/qwen3_5_full.yaml').read_text())[0])\n"
        "assert type(cfg).__name__ == 'TrainerConfig'\n"
        "names = ['torch', 'numpy', 'hyper_parallel.launch', 'hyper_parallel.train_lm']\n"
        "print(json.dumps({n: n in sys.modules for n in names}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == {
        "torch": False,
        "numpy": False,
        "hyper_parallel.launch": False,
        "hyper_parallel.train_lm": False,
    }


def test_resolved_groups_are_configs_not_runtime_objects() -> None:
    cfg = resolve_root(load("qwen3_5_full.yaml"))
    for name in FULL_TYPES:
        value = getattr(cfg, name)
        assert attrs.has(type(value)), name
        assert attrs.fields(type(value)) is not None


# -- one error, every issue ------------------------------------------------------------------------------


def test_five_independent_mistakes_give_one_error_with_five_issues() -> None:
    raw = load("qwen3_5_full.yaml")
    raw["model"]["weight_path"] = raw["model"].pop("weights_path")
    raw["optimizer"]["lrr"] = raw["optimizer"].pop("lr")
    raw["training"]["max_steps"] = "5000"
    raw["parallelism"]["tp"] = 0
    raw["checkpoint"]["_target_"] = "hyper_parallel.components.checkpoint.DCPCheckpoin.Config"
    with pytest.raises(ConfigError) as info:
        resolve_root(raw)
    assert [i.path for i in info.value.issues] == [
        "checkpoint._target_",
        "model.weight_path",
        "optimizer.lrr",
        "parallelism.tp",
        "training.max_steps",
    ]


def test_str_of_the_error_has_one_line_per_issue() -> None:
    raw = doc(optimizer=group(ADAMW, lrr=1e-4, lr=-1.0), training=group(TRAINING, max_steps="1"))
    with pytest.raises(ConfigError) as info:
        resolve_root(raw)
    assert str(info.value).splitlines() == [  # lr's validator waits for the optimizer's names
        "optimizer.lrr: unknown field 'lrr' for AdamW.Config; did you mean 'lr'?",
        "training.max_steps: expected an integer, got the string '1'",
    ]
    assert all(issue.location is None for issue in info.value.issues)


def test_error_is_a_value_error_and_pickles_with_its_issues() -> None:
    with pytest.raises(ValueError, match="unknown root field 'optimzer'") as info:
        resolve_root(doc(optimzer=group(ADAMW)))
    error = info.value
    assert isinstance(error, ConfigError)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ConfigError
    assert copy.issues == error.issues
    assert copy.issues == (Issue("optimzer", "unknown root field 'optimzer'; did you mean 'optimizer'?"),)
    assert str(copy) == str(error)


def test_an_already_resolved_group_is_checked_for_its_type_like_any_other() -> None:
    from hyper_parallel.config.root import Resolved

    raw = {"model": Resolved(resolve_root(doc()).model), "optimizer": Resolved(CausalLMLoss.Config())}
    with pytest.raises(ConfigError) as info:
        converter.structure(raw, TrainerConfig)
    assert [(i.path, i.message) for i in info.value.issues] == [
        ("optimizer", "expected an instance of Optimizer.Config, got a CausalLMLoss.Config"),
    ]
    raw["optimizer"] = Resolved(SGD.Config(lr=0.5))
    assert converter.structure(raw, TrainerConfig).optimizer == SGD.Config(lr=0.5)
