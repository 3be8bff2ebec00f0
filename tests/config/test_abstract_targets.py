"""Issue 12 point 7: abstract bases are not targets. A file (or an override) naming one is refused with the
concrete choices, Python code still constructs them, and the JSON schema never offers them."""

import pytest

from hyper_parallel.components.optimizer import AdamW, Optimizer
from hyper_parallel.config import ConfigError, apply_overrides, converter, load_config
from hyper_parallel.config.schema import json_schema
from hyper_parallel.config.targets import discover_targets, is_abstract
from hyper_parallel.models import ModelSpec
from hyper_parallel.trainer.config import TARGET_PACKAGES, TrainerConfig

C = "hyper_parallel.components"
MODEL = "model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  weights_path: /w\n"

BASES = [
    (
        "tokenizer",
        f"{C}.tokenizer.Tokenizer.Config",
        f"{C}.tokenizer.ByteTokenizer.Config, {C}.tokenizer.HuggingFaceTokenizer.Config",
    ),
    ("dataloader", f"{C}.dataloader.DataLoader.Config", f"{C}.dataloader.TextDataLoader.Config"),
    ("optimizer", f"{C}.optimizer.Optimizer.Config", f"{C}.optimizer.AdamW.Config, {C}.optimizer.SGD.Config"),
    ("lr_scheduler", f"{C}.lr_scheduler.LRScheduler.Config", f"{C}.lr_scheduler.WarmupDecay.Config"),
    ("loss", f"{C}.loss.Loss.Config", f"{C}.loss.CausalLMLoss.Config"),
    ("checkpoint", f"{C}.checkpoint.Checkpoint.Config", f"{C}.checkpoint.DCPCheckpoint.Config"),
    ("metrics", f"{C}.metrics.Metrics.Config", f"{C}.metrics.MetricsLogger.Config"),
    ("profiler", f"{C}.profiler.Profiler.Config", f"{C}.profiler.TorchProfiler.Config"),
    ("validator", f"{C}.validator.Validator.Config", f"{C}.validator.LossValidator.Config"),
]


@pytest.mark.parametrize(("group", "base", "choices"), BASES, ids=[b[0] for b in BASES])
def test_a_component_base_in_a_file_is_refused_with_its_concrete_choices(
    group: str, base: str, choices: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=f"{MODEL}{group}:\n  _target_: {base}\n")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "run.yaml:5:13",
            f"{group}._target_",
            f"'{base}' is a base class, not a target; name one of: {choices}",
        )
    ]


@pytest.mark.parametrize("name", ["hyper_parallel.models.ModelSpec", "hyper_parallel.models.spec.ModelSpec"])
def test_model_spec_itself_is_refused_with_the_model_factories(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=f"model:\n  _target_: {name}\n  name: x\n  flavor: y\n")
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (
            "run.yaml:2:13",
            "model._target_",
            f"'{name}' is a base class, not a target; name one of: "
            "hyper_parallel.models.hf.create_model_spec, "
            "hyper_parallel.models.llama3.create_model_spec, "
            "hyper_parallel.models.qwen3_5.create_model_spec, "
            "hyper_parallel.models.qwen3_5.create_vl_model_spec, "
            "hyper_parallel.models.qwen3_5_moe.create_model_spec",
        )
    ]


def test_a_base_named_by_an_override_is_refused_at_its_flag() -> None:
    cfg = load_config("configs/qwen3_5.yaml")
    with pytest.raises(ConfigError) as info:
        apply_overrides(cfg, {"optimizer._target_": f"{C}.optimizer.Optimizer.Config"})
    (issue,) = info.value.issues
    assert (issue.location, issue.path) == ("overrides['optimizer._target_']", "optimizer._target_")
    assert issue.message.endswith(
        f"'{C}.optimizer.Optimizer.Config' is a base class, not a target; name one of: "
        f"{C}.optimizer.AdamW.Config, {C}.optimizer.SGD.Config"
    )


def test_an_abc_base_is_refused_and_trusted_concrete_subclasses_are_listed() -> None:
    text = f"{MODEL}optimizer:\n  _target_: tests.support.fake_targets.AbstractOptimizerConfig\n"
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=text, allowed_targets=["tests.support.fake_targets"])
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "optimizer._target_",
            "'tests.support.fake_targets.AbstractOptimizerConfig' is a base class, not a target; "
            "name one of: "
            "a Config class deriving from it, or a factory returning one",
        )
    ]


def test_the_mark_is_not_inherited_and_python_code_still_builds_a_base() -> None:
    assert is_abstract(Optimizer.Config)
    assert is_abstract(ModelSpec)
    assert not is_abstract(AdamW.Config)
    assert Optimizer.Config(lr=0.1).lr == 0.1  # a base stays a value Python code may construct
    assert load_config("configs/qwen3_5.yaml", {"optimizer._target_": f"{C}.optimizer.SGD.Config"})


def test_discovery_and_the_schema_offer_no_base() -> None:
    assert Optimizer.Config not in discover_targets(Optimizer.Config, TARGET_PACKAGES)
    assert AdamW.Config in discover_targets(Optimizer.Config, TARGET_PACKAGES)
    schema = json_schema(converter, TrainerConfig)
    offered = {
        name for group in schema["properties"].values() for name in group["properties"]["_target_"]["enum"]
    }
    assert offered.isdisjoint({*(b[1] for b in BASES), "hyper_parallel.models.spec.ModelSpec"})
    assert f"{C}.optimizer.SGD.Config" in offered
