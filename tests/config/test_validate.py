"""One report for every rule: ``validate()`` for configs built in Python, and a layout that breaks several
rules gets every issue in one pass (RFC 9.2: all problems at once)."""

from typing import Any

import pytest

from hyper_parallel.components.tokenizer import ByteTokenizer
from hyper_parallel.config import ConfigError, resolve_root, validate
from hyper_parallel.config.manager import load_config_report
from hyper_parallel.models.qwen3_5 import create_model_spec
from hyper_parallel.trainer.config import CompileConfig, ParallelismConfig, TrainerConfig, TrainingConfig

DEBUG = "configs/qwen3_5_debug.yaml"
QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
SEQ_TP = (
    "must be divisible by parallelism.tp (3) for sequence parallelism (each tp rank holds an equal slice "
    "of the sequence; or set parallelism.sequence_parallel to false), got 256"
)
COMPILE_PP = "compiling the model is not supported with pipeline parallelism (parallelism.pp = 2)"
SHARD = "cannot infer dp_shard: the other degrees multiply to 6, which does not divide the world size 4"
CP = (
    "context parallelism is not supported yet: PyTorch's ring attention covers only the CUDA flash, "
    "memory-efficient and cuDNN attention kernels, not CPU attention with gloo, so this release cannot "
    "test it; use 1, and for long sequences use tp with sequence_parallel and activation_checkpoint, got 2"
)
PP = (
    "pipeline parallelism is not supported yet by Qwen 3.5 (its model is not split into pipeline stages); "
    "use 1 and scale with dp_shard (FSDP) or tp, got 2"
)
BATCH = "must be a multiple of micro_batch_size (3), got 8"

#: What tp 3 is told on the Qwen 3.5 debug model (the stated degree decides it, with the world size or not).
HEADS_3 = (
    "must divide the model's 4 attention heads and 2 key/value heads, got 3",
    "must divide the model's 4 linear-attention (Gated DeltaNet) key heads and 8 value heads, got 3",
    "must divide the model's feed-forward hidden size 512, got 3",
)


def pairs(exc: ConfigError) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in exc.issues]


def test_a_layout_that_breaks_seven_rules_gets_seven_issues_at_once() -> None:
    overrides = {"parallelism.tp": "3", "parallelism.pp": "2", "compile.enable": "true"}
    with pytest.raises(ConfigError) as info:
        load_config_report(DEBUG, overrides, world_size=4, command_line=True)
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [
        (f"{DEBUG}:38:12", "training.seq_len", SEQ_TP.replace("(3)", "(3, set by --parallelism.tp)")),
        (f"{DEBUG}:44:13", "parallelism.dp_shard", SHARD),
        ("--compile.enable", "compile.enable", COMPILE_PP),
        ("--parallelism.pp", "parallelism.pp", PP),
        *(("--parallelism.tp", "parallelism.tp", message) for message in HEADS_3),
    ]


def python_config(**groups: Any) -> TrainerConfig:
    return TrainerConfig(
        model=create_model_spec(flavor="debugmodel"), tokenizer=ByteTokenizer.Config(), **groups
    )


def test_validate_raises_what_the_resolver_raises_for_the_same_config() -> None:
    cfg = python_config(
        training=TrainingConfig(seq_len=256, micro_batch_size=3, global_batch_size=8),
        parallelism=ParallelismConfig(tp=3, cp=2),
    )
    raw = {
        "model": {"_target_": QWEN, "flavor": "debugmodel"},
        "tokenizer": {"_target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config"},
        "training": {
            "_target_": "hyper_parallel.trainer.config.TrainingConfig",
            "seq_len": 256,
            "micro_batch_size": 3,
            "global_batch_size": 8,
        },
        "parallelism": {"_target_": "hyper_parallel.trainer.config.ParallelismConfig", "tp": 3, "cp": 2},
    }
    with pytest.raises(ConfigError) as resolved:
        resolve_root(raw)
    with pytest.raises(ConfigError) as validated:
        validate(cfg)
    # Each group's own checks first (the resolver stops there too: the cross-group rules need sound groups).
    assert (
        pairs(validated.value)
        == pairs(resolved.value)
        == [
            ("parallelism.cp", CP),
            ("training.global_batch_size", BATCH),
        ]
    )


def test_validate_runs_every_cross_group_rule_and_the_world_size_in_one_pass() -> None:
    cfg = python_config(
        training=TrainingConfig(seq_len=256, micro_batch_size=2, global_batch_size=8),
        parallelism=ParallelismConfig(tp=3, pp=2),
        compile=CompileConfig(enable=True),
    )
    with pytest.raises(ConfigError) as info:
        validate(cfg, world_size=4)
    assert pairs(info.value) == [
        ("compile.enable", COMPILE_PP),
        ("parallelism.dp_shard", SHARD),
        ("parallelism.pp", PP),
        *(("parallelism.tp", message) for message in HEADS_3),
        ("training.seq_len", SEQ_TP),
    ]
    assert all(i.location is None for i in info.value.issues)


def test_validate_returns_the_warnings_and_strict_refuses_them() -> None:
    cfg = python_config(training=TrainingConfig(max_steps=5))
    expected = [
        ("lr_scheduler.warmup_steps", "must be <= training.max_steps (5), got 10"),
        ("metrics.log_freq", "no metrics would be logged: log_freq (10) exceeds training.max_steps (5)"),
    ]
    assert [(i.path, i.message) for i in validate(cfg)] == expected
    with pytest.raises(ConfigError) as info:
        validate(cfg, strict=True)
    assert pairs(info.value) == expected
    assert validate(python_config()) == ()


def test_validate_checks_each_group_type() -> None:
    cfg = python_config()
    object.__setattr__(cfg, "optimizer", ByteTokenizer.Config())
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert pairs(info.value) == [
        ("optimizer", "expected an instance of Optimizer.Config, got a ByteTokenizer.Config")
    ]
    with pytest.raises(ConfigError) as info:
        validate({"model": 1})  # type: ignore[arg-type]
    assert pairs(info.value) == [("top level", "expected a TrainerConfig, got a dict")]
