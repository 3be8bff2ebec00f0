"""Issue 44 point 6: the keys users bring from transformers, TRL, Axolotl and TorchTitan get a hint naming
what replaces them, at the root, in the wrong group, in the right group and as an override; the table
behind the hints names only fields that exist, so it cannot rot."""

import re
from typing import Any

import pytest

from hyper_parallel.config import ConfigError, converter, load_config, resolve_root
from hyper_parallel.config.targets import discover_targets, load_target
from hyper_parallel.config.types import class_fields
from hyper_parallel.trainer.config import FOREIGN_NAMES, TARGET_PACKAGES, TrainerConfig

FACTS = converter.root_facts(TrainerConfig)
QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
MODEL = {"_target_": QWEN, "weights_path": "/w"}
TRAINING = "hyper_parallel.trainer.config.TrainingConfig"
DEBUG = "configs/qwen3_5_debug.yaml"
ACCUMULATION = (
    "it is derived: training.global_batch_size / (training.micro_batch_size x parallelism.dp_replicate "
    "x parallelism.dp_shard)"
)
EPOCHS = "whole passes over the data, with training.max_steps: null (one of the two gives the run's length)"
LORA = "with peft._target_: hyper_parallel.components.peft.LoRA.Config"


def fields_of(target_name: str, group: str) -> set[str]:
    """The fields (or factory parameters) of the target ``target_name`` of root group ``group``."""
    target = load_target(target_name, FACTS.types[group], TARGET_PACKAGES, packages=TARGET_PACKAGES)
    return set(target.params if target.is_factory else class_fields(target.obj))


def targets_of(group: str) -> list[str]:
    """What a hint's field is looked up in: the group's default target, else every target it may name."""
    default = FACTS.default_targets.get(group)
    if default is not None:
        return [default]
    found = discover_targets(FACTS.types[group], TARGET_PACKAGES)
    return [f"{t.__module__}.{t.__qualname__}" for t in found]


@pytest.mark.parametrize("name", sorted(FOREIGN_NAMES))
def test_every_field_the_table_names_exists(name: str) -> None:
    path, note = FOREIGN_NAMES[name]
    assert path or note, "an entry says something"
    named = re.findall(r"\b([a-z_]+)\._target_: ([\w.]+)", note)
    for group, target in named:  # a field of a class other than the default is named with that class
        assert group in FACTS.types
        fields_of(target, group)
    if not path:
        return
    group, _, field = path.partition(".")
    assert group in FACTS.types, path
    where = [target for g, target in named if g == group] or targets_of(group)
    for target in where:
        assert field in fields_of(target, group), (name, path, target)


@pytest.mark.parametrize("name", sorted(FOREIGN_NAMES))
def test_no_key_of_the_table_is_a_name_the_config_has(name: str) -> None:
    # a hint never stands in for a real group or field: those are said as they are today
    assert name not in FACTS.types
    for group, target in FACTS.default_targets.items():
        assert name not in fields_of(target, group), (name, group)


def issues(error: pytest.ExceptionInfo[ConfigError]) -> list[tuple[Any, str, str]]:
    return [(i.location, i.path, i.message) for i in error.value.issues]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("learning_rate", "; did you mean 'optimizer.lr'?"),
        ("num_train_epochs", f"; did you mean 'training.epochs'? ({EPOCHS})"),
        ("gradient_accumulation_steps", f"; {ACCUMULATION}"),
        (
            "warmup_ratio",
            "; did you mean 'lr_scheduler.warmup_steps'? (a number of steps, not a fraction of "
            "training.max_steps)",
        ),
        ("per_device_train_batch_size", "; did you mean 'training.micro_batch_size'?"),
        ("lr_scheduler_type", "; did you mean 'lr_scheduler.decay_type'?"),
        ("bf16", "; did you mean 'training.mixed_precision_param'? ('bfloat16', the default)"),
        ("gradient_checkpointing", "; did you mean 'activation_checkpoint.mode'? ('full' or 'selective')"),
        ("output_dir", "; did you mean 'checkpoint.folder'?"),
        ("save_steps", "; did you mean 'checkpoint.interval'?"),
        ("logging_steps", "; did you mean 'metrics.log_freq'?"),
        ("max_seq_length", "; did you mean 'training.seq_len'?"),
        ("sequence_len", "; did you mean 'training.seq_len'?"),
        ("lora_r", f"; did you mean 'peft.rank'? ({LORA})"),
        ("lora_alpha", f"; did you mean 'peft.alpha'? ({LORA})"),
        ("lora_dropout", f"; did you mean 'peft.dropout'? ({LORA})"),
        ("lora_target_modules", f"; did you mean 'peft.targets'? ({LORA})"),
        (
            "model_name_or_path",
            "; did you mean 'model.weights_path'? (a local directory of safetensors weights, with "
            "model._target_: hyper_parallel.models.llama3.create_model_spec or another native model; any "
            "transformers causal LM, by folder or Hub id: hyper_parallel.models.hf.create_model_spec's path)",
        ),
        ("tensor_parallel_degree", "; did you mean 'parallelism.tp'?"),
    ],
)
def test_a_foreign_key_at_the_root_names_what_replaces_it(key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root({"model": MODEL, key: 1})
    assert issues(info) == [(None, key, f"unknown root field {key!r}{hint}")]
    with pytest.raises(ConfigError) as info:
        load_config(DEBUG, {key: "1"})
    assert issues(info) == [(f"overrides[{key!r}]", key, f"unknown root field {key!r}{hint}")]


def test_a_foreign_key_in_a_group_of_a_file_is_hinted_where_it_stands() -> None:
    text = (
        f"model:\n  _target_: {QWEN}\n  weights_path: /w\n  learning_rate: 1\n"
        f"training:\n  _target_: {TRAINING}\n  learning_rate: 1.0e-3\n  gradient_accumulation_steps: 4\n"
        "  max_seq_length: 512\n  num_train_epochs: 3\n"
        "optimizer:\n  _target_: hyper_parallel.components.optimizer.AdamW.Config\n  learning_rate: 1\n"
        "lr_scheduler:\n  _target_: hyper_parallel.components.lr_scheduler.WarmupDecay.Config\n"
        "  warmup_ratio: 0.1\n"
        "learning_rate: 2\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config("run.yaml", text=text)
    assert issues(info) == [
        (
            "run.yaml:4:3",
            "model.learning_rate",
            "unknown parameter 'learning_rate' of create_model_spec(); did you mean 'optimizer.lr'?",
        ),
        (
            "run.yaml:7:3",
            "training.learning_rate",
            "unknown field 'learning_rate' for TrainingConfig; did you mean 'optimizer.lr'?",
        ),
        (
            "run.yaml:8:3",
            "training.gradient_accumulation_steps",
            f"unknown field 'gradient_accumulation_steps' for TrainingConfig; {ACCUMULATION}",
        ),
        (  # in the group that has the field, its own name
            "run.yaml:9:3",
            "training.max_seq_length",
            "unknown field 'max_seq_length' for TrainingConfig; did you mean 'seq_len'?",
        ),
        (
            "run.yaml:10:3",
            "training.num_train_epochs",
            f"unknown field 'num_train_epochs' for TrainingConfig; did you mean 'epochs'? ({EPOCHS})",
        ),
        (
            "run.yaml:13:3",
            "optimizer.learning_rate",
            "unknown field 'learning_rate' for AdamW.Config; did you mean 'lr'?",
        ),
        (  # the table's answer, not the spelling's closest ('decay_ratio')
            "run.yaml:16:3",
            "lr_scheduler.warmup_ratio",
            "unknown field 'warmup_ratio' for WarmupDecay.Config; did you mean 'warmup_steps'? "
            "(a number of steps, not a fraction of training.max_steps)",
        ),
        (
            "run.yaml:17:1",
            "learning_rate",
            "unknown root field 'learning_rate'; did you mean 'optimizer.lr'?",
        ),
    ]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("training.learning_rate", "no field 'learning_rate' under 'training'; did you mean 'optimizer.lr'?"),
        ("optimizer.learning_rate", "no field 'learning_rate' under 'optimizer'; did you mean 'lr'?"),
        (
            "training.gradient_accumulation_steps",
            f"no field 'gradient_accumulation_steps' under 'training'; {ACCUMULATION}",
        ),
        (
            "training.per_device_train_batch_size",
            "no field 'per_device_train_batch_size' under 'training'; did you mean 'micro_batch_size'?",
        ),
        (
            "parallelism.tensor_parallel_degree",
            "no field 'tensor_parallel_degree' under 'parallelism'; did you mean 'tp'?",
        ),
    ],
)
def test_a_foreign_key_in_an_override_is_hinted_at_its_override(key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(DEBUG, {key: "1"})
    assert issues(info) == [(f"overrides[{key!r}]", key, message)]


def test_names_the_config_has_keep_their_own_hints() -> None:
    # a real field of another group is still named as one, and a close spelling still guessed
    with pytest.raises(ConfigError) as info:
        load_config(DEBUG, {"weight_decay": "0.1", "training.seq_length": "8"})
    assert issues(info) == [
        (
            "overrides['training.seq_length']",
            "training.seq_length",
            "no field 'seq_length' under 'training'; did you mean 'seq_len'?",
        ),
        (
            "overrides['weight_decay']",
            "weight_decay",
            "unknown root field 'weight_decay'; it is a field of 'optimizer' (optimizer.weight_decay)",
        ),
    ]
