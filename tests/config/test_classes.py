"""The config classes on their own (no resolver): defaults, validators, cross checks, model factories."""

import importlib
import importlib.util
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from hyper_parallel.components.checkpoint import Checkpoint, DCPCheckpoint
from hyper_parallel.components.dataloader import (
    DataLoader,
    DatasetConfig,
    JsonlSource,
    SyntheticSource,
    TextDataLoader,
)
from hyper_parallel.components.loss import CausalLMLoss, Loss
from hyper_parallel.components.lr_scheduler import LRScheduler, WarmupDecay
from hyper_parallel.components.metrics import Metrics, MetricsLogger
from hyper_parallel.components.optimizer import SGD, AdamW, Optimizer
from hyper_parallel.components.profiler import Profiler, TorchProfiler
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer, Tokenizer
from hyper_parallel.components.validator import LossValidator, Validator
from hyper_parallel.config import ConfigError, converter
from hyper_parallel.models import ModelArgs, ModelSpec, llama3, qwen3_5
from hyper_parallel.models.llama3 import _runtime as llama3_runtime
from hyper_parallel.models.qwen3_5 import _runtime as qwen3_5_runtime
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

SECTIONS: list[type] = [
    Tokenizer.Config,
    HuggingFaceTokenizer.Config,
    *DatasetConfig.__variants__,
    DataLoader.Config,
    TextDataLoader.Config,
    Optimizer.Config,
    AdamW.Config,
    SGD.Config,
    LRScheduler.Config,
    WarmupDecay.Config,
    Loss.Config,
    CausalLMLoss.Config,
    Checkpoint.Config,
    DCPCheckpoint.Config,
    Metrics.Config,
    MetricsLogger.Config,
    Profiler.Config,
    TorchProfiler.Config,
    Validator.Config,
    LossValidator.Config,
    TrainingConfig,
    ParallelismConfig,
    ActivationCheckpointConfig,
    DebugConfig,
    CompileConfig,
    CommConfig,
]


def debug_spec() -> ModelSpec:
    # weights_path gives the default tokenizer its files (without it, tokenizer.path would be required)
    return llama3.create_model_spec("debugmodel", weights_path="/weights")


def issues(obj: Any) -> list[tuple[str, str]]:
    return list(obj.cross_check())


# --- defaults and class conventions -------------------------------------------------------------


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__qualname__)
def test_defaults_construct_and_are_consistent(cls: type) -> None:
    obj = cls()
    # A dataset source that reads files has no default files: the one thing its defaults lack.
    files = "paths" in attrs.fields_dict(cls) if attrs.has(cls) else False
    message = f"must list at least one file or directory when source is {getattr(obj, 'source', '')!r}"
    assert issues(obj) == ([("paths", message)] if files else [])
    assert hash(obj) == hash(cls())


@pytest.mark.parametrize("cls", [*SECTIONS, TrainerConfig, ModelSpec], ids=lambda c: c.__qualname__)
def test_every_field_has_help_and_real_annotations(cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        assert field.kw_only, field.name
        text = field.metadata.get("help", "")
        assert isinstance(text, str), field.name
        assert len(text) > 10, field.name
        assert "\n" not in text, field.name
        assert not isinstance(field.type, str), field.name
        assert hints[field.name] is not typing.Any, field.name


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.__qualname__)
def test_sections_are_frozen(cls: type) -> None:
    obj = cls()
    name = attrs.fields(cls)[0].name
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(obj, name, getattr(obj, name))


def test_trainer_config_fields_in_rfc_order_with_concrete_defaults() -> None:
    names = [f.name for f in attrs.fields(TrainerConfig)]
    assert names == [
        "model",
        "tokenizer",
        "dataloader",
        "optimizer",
        "lr_scheduler",
        "loss",
        "training",
        "parallelism",
        "checkpoint",
        "activation_checkpoint",
        "metrics",
        "profiler",
        "validator",
        "debug",
        "compile",
        "comm",
        "peft",
    ]
    model_default: object = attrs.fields(TrainerConfig).model.default
    assert model_default is attrs.NOTHING
    hints = typing.get_type_hints(TrainerConfig)
    assert hints["optimizer"] is Optimizer.Config
    assert hints["model"] is ModelSpec
    # The default tokenizer reads tokenizer.json from the model's weights folder.
    config = TrainerConfig(model=llama3.create_model_spec("debugmodel", weights_path="/weights"))
    assert type(config.optimizer) is AdamW.Config
    assert type(config.lr_scheduler) is WarmupDecay.Config
    assert config.lr_scheduler.decay_type == "cosine"
    assert type(config.loss) is CausalLMLoss.Config
    assert config.profiler.enable is False
    assert config.validator.enable is False
    assert issues(config) == []
    with pytest.raises(TypeError):
        TrainerConfig()  # type: ignore[call-arg]


def test_implementations_subclass_their_base_config() -> None:
    assert issubclass(AdamW.Config, Optimizer.Config)
    assert issubclass(SGD.Config, Optimizer.Config)
    assert issubclass(AdamW, Optimizer)
    assert AdamW.Config().weight_decay == 0.1
    assert Optimizer.Config().weight_decay == 0.0


# --- validators -----------------------------------------------------------------------------------

BAD_VALUES: list[tuple[type, dict[str, Any], str]] = [
    (AdamW.Config, {"lr": 0.0}, "'lr' must be > 0.0"),
    (AdamW.Config, {"lr": -1e-3}, "'lr' must be > 0.0"),
    (AdamW.Config, {"weight_decay": -0.1}, "'weight_decay' must be >= 0.0"),
    (AdamW.Config, {"betas": (0.9, 1.0)}, "must be < 1.0"),
    (AdamW.Config, {"eps": 0.0}, "'eps' must be > 0.0"),
    (AdamW.Config, {"no_decay_names": ("",)}, "Length of"),
    (SGD.Config, {"momentum": 1.0}, "'momentum' must be < 1.0"),
    (SGD.Config, {"dampening": 1.5}, "'dampening' must be <= 1.0"),
    (WarmupDecay.Config, {"warmup_steps": -1}, "'warmup_steps' must be >= 0"),
    (WarmupDecay.Config, {"decay_ratio": 0.0}, "'decay_ratio' must be > 0.0"),
    (WarmupDecay.Config, {"decay_ratio": 1.5}, "'decay_ratio' must be <= 1.0"),
    (WarmupDecay.Config, {"min_lr_factor": 1.1}, "'min_lr_factor' must be <= 1.0"),
    (CausalLMLoss.Config, {"label_smoothing": 1.0}, "'label_smoothing' must be < 1.0"),
    (CausalLMLoss.Config, {"z_loss_weight": -1.0}, "'z_loss_weight' must be >= 0.0"),
    (DCPCheckpoint.Config, {"interval": 0}, "'interval' must be > 0"),
    (DCPCheckpoint.Config, {"keep_latest_k": -1}, "'keep_latest_k' must be >= 0"),
    (DCPCheckpoint.Config, {"load_step": -2}, "'load_step' must be >= 0, or -1 for latest"),
    (DCPCheckpoint.Config, {"folder": ""}, "Length of 'folder'"),
    (MetricsLogger.Config, {"log_freq": 0}, "'log_freq' must be > 0"),
    (MetricsLogger.Config, {"run_name": ""}, "Length of 'run_name'"),
    (TorchProfiler.Config, {"active": 0}, "'active' must be > 0"),
    (TorchProfiler.Config, {"wait": -1}, "'wait' must be >= 0"),
    (LossValidator.Config, {"freq": 0}, "'freq' must be > 0"),
    (LossValidator.Config, {"steps": 0}, "'steps' must be >= 1, or -1 for the whole set"),
    (LossValidator.Config, {"micro_batch_size": 0}, "'micro_batch_size' must be > 0"),
    (TextDataLoader.Config, {"num_workers": -1}, "'num_workers' must be >= 0"),
    (TextDataLoader.Config, {"prefetch_factor": 0}, "'prefetch_factor' must be >= 1"),
    (JsonlSource, {"paths": ("a.jsonl", "")}, "Length of"),
    (JsonlSource, {"text_field": ""}, "Length of 'text_field'"),
    (HuggingFaceTokenizer.Config, {"path": ""}, "Length of 'path'"),
    (HuggingFaceTokenizer.Config, {"model_max_length": 0}, "'model_max_length' must be > 0"),
    (TrainingConfig, {"max_steps": 0}, "'max_steps' must be > 0"),
    (TrainingConfig, {"global_batch_size": 0}, "'global_batch_size' must be > 0"),
    (TrainingConfig, {"micro_batch_size": -1}, "'micro_batch_size' must be > 0"),
    (TrainingConfig, {"seq_len": 0}, "'seq_len' must be > 0"),
    (TrainingConfig, {"max_grad_norm": 0.0}, "'max_grad_norm' must be > 0"),
    (TrainingConfig, {"gc_freq": 0}, "'gc_freq' must be > 0"),
    (TrainingConfig, {"seed": -1}, "'seed' must be >= 0"),
    (ParallelismConfig, {"tp": 0}, "'tp' must be >= 1, or -1 for auto"),
    (ParallelismConfig, {"dp_shard": -2}, "'dp_shard' must be >= 1, or -1 for auto"),
    (ParallelismConfig, {"dp_replicate": 0}, "'dp_replicate' must be >= 1, or -1 for auto"),
    (ParallelismConfig, {"ep": -1}, "'ep' must be >= 1"),
    (ParallelismConfig, {"pp_microbatches": 0}, "'pp_microbatches' must be >= 1"),
    (ActivationCheckpointConfig, {"selective_option": 0}, "'selective_option' must be 'op' or a layer"),
    (ActivationCheckpointConfig, {"selective_option": "all"}, "'selective_option' must be 'op' or a layer"),
    (DebugConfig, {"seed": -5}, "'seed' must be >= 0"),
    (CommConfig, {"init_timeout_seconds": 0}, "'init_timeout_seconds' must be > 0"),
    (CommConfig, {"train_timeout_seconds": -1}, "'train_timeout_seconds' must be > 0"),
    (CommConfig, {"trace_buf_size": -1}, "'trace_buf_size' must be >= 0"),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "fragment"),
    BAD_VALUES,
    ids=[f"{c.__qualname__}-{next(iter(k))}={next(iter(k.values()))!r}" for c, k, _ in BAD_VALUES],
)
def test_validator_rejects(cls: type, kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        cls(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (ParallelismConfig, {"dp_shard": -1, "tp": 8}),
        (DCPCheckpoint.Config, {"load_step": 0}),
        (LossValidator.Config, {"steps": -1}),
        (ActivationCheckpointConfig, {"selective_option": 2}),
        (TrainingConfig, {"max_grad_norm": None, "gc_freq": None}),
        (WarmupDecay.Config, {"decay_ratio": 1.0, "min_lr_factor": 1.0}),
    ],
)
def test_validator_accepts_boundaries(cls: type, kwargs: dict[str, Any]) -> None:
    obj = cls(**kwargs)
    for name, value in kwargs.items():
        assert getattr(obj, name) == value


# --- section cross checks -------------------------------------------------------------------------

CROSS_CHECKS: list[tuple[Any, list[tuple[str, str]]]] = [
    (
        SGD.Config(nesterov=True),
        [("momentum", "must be > 0 when nesterov is true, got 0.0")],
    ),
    (
        SGD.Config(nesterov=True, momentum=0.0, dampening=0.5),
        [
            ("momentum", "must be > 0 when nesterov is true, got 0.0"),
            ("dampening", "must be 0 when nesterov is true, got 0.5"),
        ],
    ),
    (SGD.Config(nesterov=True, momentum=0.9), []),
    (
        JsonlSource(),
        [("paths", "must list at least one file or directory when source is 'jsonl'")],
    ),
    (
        TextDataLoader.Config(num_workers=0, prefetch_factor=2, persistent_workers=True),
        [
            ("prefetch_factor", "needs num_workers > 0 (num_workers is 0); set it to null"),
            ("persistent_workers", "needs num_workers > 0 (num_workers is 0); set it to false"),
        ],
    ),
    (
        DCPCheckpoint.Config(
            enable=True,
            exclude_from_loading=("model", "optimizer", "optimizer"),
            export_dtype="bfloat16",
            last_save_model_only=False,
            async_mode="async",
            keep_latest_k=1,
        ),
        [
            ("exclude_from_loading", "cannot exclude 'model': a resume always restores the model"),
            ("exclude_from_loading", "lists the same part more than once"),
            (
                "export_dtype",
                "'bfloat16' only applies to the model-only final save; set last_save_model_only to true "
                "or export_dtype to 'float32'",
            ),
            (
                "keep_latest_k",
                "must be 0 or >= 2 with an async save: the newest checkpoint may still be in flight when "
                "the previous one is deleted",
            ),
        ],
    ),
    (
        TorchProfiler.Config(enable=True, profile_freq=3, warmup=3, active=1),
        [("profile_freq", "must be >= warmup + active (3 + 1 = 4), got 3")],
    ),
    (
        TorchProfiler.Config(enable=True, profile_freq=10, wait=2),
        [
            (
                "wait",
                "wait + warmup + active must equal profile_freq (10), got 2 + 3 + 1 = 6; or set wait to "
                "null to derive it",
            )
        ],
    ),
    (TorchProfiler.Config(enable=True, profile_freq=10, wait=6), []),
    (
        TrainingConfig(global_batch_size=10, micro_batch_size=4),
        [("global_batch_size", "must be a multiple of micro_batch_size (4), got 10")],
    ),
    (
        ParallelismConfig(dp_shard=-1, tp=-1, pp=-1),
        [
            ("tp", "only one degree may be -1 (auto), and dp_shard already is"),
            ("pp", "only one degree may be -1 (auto), and dp_shard already is"),
        ],
    ),
    (ParallelismConfig(dp_shard=2, pp=4, pp_schedule="GPipe", pp_microbatches=2), []),
    (ParallelismConfig(dp_shard=2, pp=1), []),
    (ParallelismConfig(dp_shard=4, cp=1, ep=2), []),  # whether ep fits dp_shard needs the world size
    (ParallelismConfig(tp=1, sequence_parallel=True), []),
    (
        CompileConfig(enable=True, components=()),
        [("components", "is empty, so compile.enable has nothing to compile")],
    ),
    (
        CompileConfig(components=("model", "model")),
        [("components", "lists the same component more than once")],
    ),
]


@pytest.mark.parametrize(("obj", "expected"), CROSS_CHECKS, ids=lambda v: type(v).__qualname__)
def test_section_cross_check(obj: Any, expected: list[tuple[str, str]]) -> None:
    assert issues(obj) == expected


def test_a_source_without_files_has_no_paths_and_refuses_them_by_name() -> None:
    assert "paths" not in attrs.fields_dict(SyntheticSource)
    with pytest.raises(ConfigError) as info:
        converter.structure({"source": "synthetic", "paths": ["a.txt"]}, DatasetConfig)
    assert [(i.path, i.message) for i in info.value.issues] == [
        ("paths", "must be empty when source is 'synthetic' (or set source to 'jsonl' or 'text')")
    ]


def test_lr_scheduler_decay_steps() -> None:
    assert WarmupDecay.Config(warmup_steps=10).decay_steps(100) == 90
    assert WarmupDecay.Config(warmup_steps=10, decay_ratio=0.2).decay_steps(100) == 20


def test_gradient_accumulation_is_derived() -> None:
    training = TrainingConfig(global_batch_size=64, micro_batch_size=2)
    assert "gradient_accumulation_steps" not in attrs.fields_dict(TrainingConfig)
    assert training.gradient_accumulation_steps() == 32
    assert training.gradient_accumulation_steps(dp_degree=8) == 4
    with pytest.raises(ValueError, match="not a multiple"):
        training.gradient_accumulation_steps(dp_degree=5)


# --- world size -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "world_size", "expected"),
    [
        (ParallelismConfig(tp=2), 8, []),
        (
            ParallelismConfig(tp=2),
            7,
            [
                (
                    "dp_shard",
                    "cannot infer dp_shard: the other degrees multiply to 2, which does not divide the "
                    "world size 7",
                )
            ],
        ),
        (
            ParallelismConfig(dp_shard=2, tp=2),
            8,
            [("dp_shard", "dp_replicate * dp_shard * cp * tp * pp = 4, but the world size is 8")],
        ),
        (ParallelismConfig(dp_replicate=2, dp_shard=2, tp=2), 8, []),
        (
            ParallelismConfig(dp_shard=-1, cp=-1),
            8,
            [("cp", "only one degree may be -1 (auto), and dp_shard already is")],
        ),
        (
            ParallelismConfig(tp=2, ep=3),
            8,
            [("ep", "must divide dp_shard * cp (4 with world size 8), got 3")],
        ),
    ],
)
def test_world_size_issues(
    parallelism: ParallelismConfig, world_size: int, expected: list[tuple[str, str]]
) -> None:
    assert parallelism.world_size_issues(world_size) == expected


def test_resolved_degrees() -> None:
    degrees = ParallelismConfig(dp_replicate=2, tp=2, pp=2, ep=2).resolved_degrees(32)
    assert degrees == {"dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 2, "pp": 2, "ep": 2}
    assert ParallelismConfig(dp_shard=1, tp=-1).resolved_degrees(4)["tp"] == 4
    with pytest.raises(ValueError, match=r"parallelism\.dp_shard: cannot infer dp_shard"):
        ParallelismConfig(tp=3).resolved_degrees(8)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        ParallelismConfig().world_size_issues(0)


def test_trainer_world_size_issues_checks_the_batch() -> None:
    config = TrainerConfig(
        model=debug_spec(),
        training=TrainingConfig(global_batch_size=8, micro_batch_size=2),
        parallelism=ParallelismConfig(tp=1),
    )
    assert config.world_size_issues(4) == []
    assert config.world_size_issues(8) == [
        (
            "training.global_batch_size",
            "must be a multiple of micro_batch_size x dp_replicate x dp_shard (16 on 8 ranks), got 8",
        )
    ]
    assert TrainerConfig(model=debug_spec(), parallelism=ParallelismConfig(tp=3)).world_size_issues(8) == [
        (
            "parallelism.dp_shard",
            "cannot infer dp_shard: the other degrees multiply to 3, which does not divide the world size 8",
        )
    ]


# --- root cross checks ----------------------------------------------------------------------------


def trainer(**groups: Any) -> TrainerConfig:
    return TrainerConfig(model=groups.pop("model", debug_spec()), **groups)


ROOT_CHECKS: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    (
        "compile-with-pp",
        {
            "compile": CompileConfig(enable=True),
            "parallelism": ParallelismConfig(pp=2),
            "training": TrainingConfig(micro_batch_size=2),
        },
        [
            (
                "compile.enable",
                "compiling the model is not supported with pipeline parallelism (parallelism.pp = 2)",
            )
        ],
    ),
    (
        "compile-loss-only-with-pp-is-fine",
        {
            "compile": CompileConfig(enable=True, components=("loss",)),
            "parallelism": ParallelismConfig(pp=2),
            "training": TrainingConfig(micro_batch_size=2),
        },
        [],
    ),
    (
        "ac-frequency-beyond-layers",
        {"activation_checkpoint": ActivationCheckpointConfig(mode="selective", selective_option=8)},
        [
            (
                "activation_checkpoint.selective_option",
                "checkpoints every 8th block but the model has only 4 blocks, so nothing would be "
                "checkpointed",
            )
        ],
    ),
    (
        "ac-frequency-ignored-in-full-mode",
        {"activation_checkpoint": ActivationCheckpointConfig(mode="full", selective_option=8)},
        [],
    ),
    (
        "more-stages-than-layers",
        {
            "parallelism": ParallelismConfig(pp=8, pp_microbatches=8),
            "training": TrainingConfig(micro_batch_size=8),
        },
        [("parallelism.pp", "must be <= the model's 4 layers, got 8 stages")],
    ),
    (
        "seq-len-beyond-model",
        {"training": TrainingConfig(seq_len=4096)},
        [("training.seq_len", "must be <= the model's max_seq_len (2048), got 4096")],
    ),
    (
        "seq-len-vs-cp",
        {"training": TrainingConfig(seq_len=1000), "parallelism": ParallelismConfig(cp=8)},
        [
            (
                "training.seq_len",
                "must be divisible by 2 * parallelism.cp (16) for load-balanced context parallelism, "
                "got 1000",
            )
        ],
    ),
    (
        "batch-vs-fixed-dp",
        {
            "training": TrainingConfig(global_batch_size=8, micro_batch_size=2),
            "parallelism": ParallelismConfig(dp_shard=8),
        },
        [
            (
                "training.global_batch_size",
                "must be a multiple of micro_batch_size x dp_replicate x dp_shard (16), got 8",
            )
        ],
    ),
    (
        "nccl-on-npu",
        {"comm": CommConfig(backend="nccl"), "training": TrainingConfig(init_device="npu")},
        [
            (
                "comm.backend",
                "'nccl' does not run on 'npu' devices (training.init_device); use null to pick the backend "
                "automatically",
            )
        ],
    ),
    (
        "hccl-with-meta-init",
        {"comm": CommConfig(backend="hccl"), "training": TrainingConfig(init_device="meta")},
        [],
    ),
    ("sequence-parallel-without-tp", {"parallelism": ParallelismConfig(tp=1, sequence_parallel=True)}, []),
]


@pytest.mark.parametrize(
    ("groups", "expected"), [c[1:] for c in ROOT_CHECKS], ids=[c[0] for c in ROOT_CHECKS]
)
def test_trainer_cross_check(groups: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    assert issues(trainer(**groups)) == expected


#: Settings that make a run pointless but not wrong: ``TrainerConfig.warnings``, never ``cross_check``.
WARNING_CHECKS: list[tuple[str, dict[str, Any], list[tuple[str, str]]]] = [
    (
        "warmup-longer-than-run",
        {"lr_scheduler": WarmupDecay.Config(warmup_steps=200), "training": TrainingConfig(max_steps=100)},
        [("lr_scheduler.warmup_steps", "must be <= training.max_steps (100), got 200")],
    ),
    (
        "warmup-plus-decay-too-long",
        {
            "lr_scheduler": WarmupDecay.Config(warmup_steps=50, decay_ratio=0.6),
            "training": TrainingConfig(max_steps=100),
        },
        [
            (
                "lr_scheduler.decay_ratio",
                "warmup_steps (50) plus the decay phase (60 steps = decay_ratio x 100) exceeds "
                "training.max_steps (100); the decay is shortened to 50 steps",
            )
        ],
    ),
    (
        "validator-never-runs",
        {"validator": LossValidator.Config(enable=True, freq=500), "training": TrainingConfig(max_steps=100)},
        [("validator.freq", "validation would never run: freq (500) exceeds training.max_steps (100)")],
    ),
    (
        "disabled-validator-is-fine",
        {
            "validator": LossValidator.Config(enable=False, freq=500),
            "training": TrainingConfig(max_steps=100),
        },
        [],
    ),
    (
        "profiler-never-captures",
        {
            "profiler": TorchProfiler.Config(enable=True, profile_freq=200),
            "training": TrainingConfig(max_steps=100),
        },
        [
            (
                "profiler.profile_freq",
                "no trace would be captured: profile_freq (200) exceeds training.max_steps (100)",
            )
        ],
    ),
    (
        "metrics-never-log",
        {"metrics": MetricsLogger.Config(log_freq=20), "training": TrainingConfig(max_steps=10)},
        [
            (
                "metrics.log_freq",
                "no metrics would be logged: log_freq (20) exceeds training.max_steps (10)",
            )
        ],
    ),
]


@pytest.mark.parametrize(("groups", "expected"), [pytest.param(g, e, id=i) for i, g, e in WARNING_CHECKS])
def test_trainer_warnings_are_not_errors(groups: dict[str, Any], expected: list[tuple[str, str]]) -> None:
    config = trainer(**groups)
    assert list(config.warnings()) == expected
    assert issues(config) == []


def test_trainer_cross_check_reports_every_problem() -> None:
    config = trainer(
        lr_scheduler=WarmupDecay.Config(warmup_steps=500),
        training=TrainingConfig(max_steps=100, seq_len=4096, micro_batch_size=2),
        compile=CompileConfig(enable=True),
        parallelism=ParallelismConfig(pp=2),
    )
    assert [path for path, _ in issues(config)] == [
        "compile.enable",
        "training.seq_len",
    ]


# --- model specs and factories --------------------------------------------------------------------


def test_llama3_flavors_match_published_dims() -> None:
    assert typing.get_args(llama3.Llama3Flavor) == (*llama3.LLAMA3_FLAVORS, "auto")  # auto: config.json
    args = llama3.LLAMA3_FLAVORS
    assert (args["8B"].dim, args["8B"].n_layers, args["8B"].n_heads, args["8B"].n_kv_heads) == (
        4096,
        32,
        32,
        8,
    )
    assert (args["70B"].dim, args["70B"].n_layers, args["70B"].n_heads) == (8192, 80, 64)
    assert (args["405B"].dim, args["405B"].n_layers, args["405B"].n_heads) == (16384, 126, 128)
    assert [args[f].ffn_hidden_dim for f in ("8B", "70B", "405B")] == [14336, 28672, 53248]
    assert args["8B"].vocab_size == 128_256
    for flavor_args in args.values():
        assert issues(flavor_args) == []


def test_qwen3_5_flavors_are_hybrid_and_consistent() -> None:
    assert typing.get_args(qwen3_5.Qwen3_5Flavor) == (*qwen3_5.QWEN3_5_FLAVORS, "auto")
    assert tuple(qwen3_5.QWEN3_5_VL_FLAVORS) == tuple(qwen3_5.QWEN3_5_FLAVORS)
    for flavor_args in qwen3_5.QWEN3_5_FLAVORS.values():
        assert issues(flavor_args) == []
        kinds = flavor_args.layer_types()
        assert kinds.count("linear_attention") == 3 * kinds.count("full_attention")
    debug = qwen3_5.QWEN3_5_FLAVORS["debugmodel"]
    assert debug.layer_types() == ("linear_attention",) * 3 + ("full_attention",)
    for vl_args in qwen3_5.QWEN3_5_VL_FLAVORS.values():
        assert issues(vl_args) == []


@pytest.mark.parametrize(
    ("factory", "flavor", "name"),
    [
        (llama3.create_model_spec, "debugmodel", "llama3"),
        (llama3.create_model_spec, "405B", "llama3"),
        (qwen3_5.create_model_spec, "0.8B", "qwen3_5"),
        (qwen3_5.create_model_spec, "9B", "qwen3_5"),
        (qwen3_5.create_vl_model_spec, "2B", "qwen3_5_vl"),
    ],
)
def test_factory_returns_flavor(factory: Any, flavor: str, name: str) -> None:
    spec = factory(flavor, weights_path="/weights")
    assert isinstance(spec, ModelSpec)
    assert (spec.name, spec.flavor, spec.weights_path) == (name, flavor, "/weights")
    assert isinstance(spec.args, ModelArgs)
    assert callable(spec.build_model_fn)
    assert callable(spec.parallelize_fn)
    assert isinstance(spec.state_dict_adapter, type)
    assert issues(spec) == []
    assert spec == factory(flavor, weights_path="/weights")
    hash(spec)


def test_factory_defaults() -> None:
    assert llama3.create_model_spec().flavor == "8B"
    assert qwen3_5.create_model_spec().flavor == "0.8B"
    assert qwen3_5.create_model_spec().weights_path is None
    assert qwen3_5.create_vl_model_spec().args.vision.patch_size == 16  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "factory", [llama3.create_model_spec, qwen3_5.create_model_spec, qwen3_5.create_vl_model_spec]
)
def test_factory_signatures_are_fully_annotated(factory: Any) -> None:
    hints = typing.get_type_hints(factory)
    assert set(hints) == {"flavor", "weights_path", "overrides", "return"}
    assert hints["return"] is ModelSpec
    literal, none = typing.get_args(hints["flavor"])  # null: auto where weights_path is given
    assert (typing.get_origin(literal), none) == (typing.Literal, type(None))
    assert hints["weights_path"] == str | None
    assert hints["overrides"] == dict[str, int | float | bool | str | None] | None


def test_factory_never_touches_the_filesystem(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("factory touched the filesystem")

    monkeypatch.setattr("builtins.open", forbidden)
    monkeypatch.setattr("os.stat", forbidden)
    spec = qwen3_5.create_model_spec("0.8B", weights_path="/does/not/exist")
    assert spec.weights_path == "/does/not/exist"


@pytest.mark.parametrize(
    ("factory", "flavor", "fragment"),
    [
        (llama3.create_model_spec, "8b", "unknown llama3 flavor '8b'; did you mean '8B'?"),
        (qwen3_5.create_model_spec, "0.8b", "unknown qwen3_5 flavor '0.8b'; did you mean '0.8B'?"),
        (qwen3_5.create_model_spec, "debugmodle", "did you mean 'debugmodel'?"),
        (qwen3_5.create_vl_model_spec, "72B", "unknown qwen3_5_vl flavor '72B'"),
    ],
)
def test_factory_rejects_unknown_flavor(factory: Any, flavor: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="known: 'debugmodel'") as info:
        factory(flavor)
    assert fragment in str(info.value)


def test_overrides_replace_single_fields() -> None:
    spec = llama3.create_model_spec(
        "debugmodel", overrides={"n_layers": 2, "norm_eps": 1, "n_kv_heads": None}
    )
    args = spec.args
    assert isinstance(args, llama3.Llama3Args)
    assert args.n_layers == 2
    assert args.norm_eps == 1.0
    assert type(args.norm_eps) is float
    assert args.n_kv_heads is None
    assert llama3.LLAMA3_FLAVORS["debugmodel"].n_layers == 4  # the table is untouched
    scaled = llama3.create_model_spec("8B", overrides={"rope_scaling.factor": 16.0})
    assert scaled.args.rope_scaling.factor == 16.0  # type: ignore[attr-defined]
    vl = qwen3_5.create_vl_model_spec("debugmodel", overrides={"vision.depth": 3, "text.n_layers": 8})
    assert (vl.args.vision.depth, vl.args.text.n_layers) == (3, 8)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("factory", "overrides", "fragment"),
    [
        (
            llama3.create_model_spec,
            {"dimm": 512},
            "overrides.dimm: unknown argument 'dimm' of Llama3Args; did you mean 'dim'?",
        ),
        (qwen3_5.create_model_spec, {"full_attn_interval": 2}, "did you mean 'full_attention_interval'?"),
        (qwen3_5.create_vl_model_spec, {"vision.dpth": 2}, "did you mean 'vision.depth'?"),
        (
            llama3.create_model_spec,
            {"dim": "512"},
            "overrides.dim: expected an integer, got the string '512'",
        ),
        (llama3.create_model_spec, {"dim": True}, "overrides.dim: expected an integer, got the boolean true"),
        (
            llama3.create_model_spec,
            {"n_layers": 2.5},
            "overrides.n_layers: expected an integer, got the number 2.5",
        ),
        (llama3.create_model_spec, {"dim": None}, "overrides.dim: expected an integer, got null"),
        (
            qwen3_5.create_model_spec,
            {"attn_output_gate": 1},
            "overrides.attn_output_gate: expected a boolean (true or false), got the integer 1",
        ),
        (llama3.create_model_spec, {"dim": -8}, "overrides.dim: must be > 0, got -8"),
        (llama3.create_model_spec, {"n_heads": 6}, "n_heads: must divide dim (256), got 6"),
        (llama3.create_model_spec, {"n_kv_heads": 3}, "n_kv_heads: must divide n_heads (8), got 3"),
        (
            qwen3_5.create_model_spec,
            {"full_attention_interval": 5},
            "full_attention_interval: must be <= n_layers (4)",
        ),
        (
            qwen3_5.create_model_spec,
            {"partial_rotary_factor": 0.3},
            "partial_rotary_factor: head_dim * partial_rotary_factor",
        ),
        (
            qwen3_5.create_vl_model_spec,
            {"vision.n_heads": 3},
            "vision.n_heads: must divide hidden_size (128), got 3",
        ),
        (qwen3_5.create_vl_model_spec, {"vision": 3}, "overrides.vision: 'vision' is a section"),
        (llama3.create_model_spec, {"rope_scaling.factor": 2.0}, "rope_scaling is null in this flavor"),
        (llama3.create_model_spec, {"dim.x": 2}, "dim is not a section"),
    ],
)
def test_factory_rejects_bad_overrides(factory: Any, overrides: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match="invalid model arguments") as info:
        factory("debugmodel", overrides=overrides)
    assert fragment in str(info.value)


def test_bad_overrides_are_all_reported() -> None:
    with pytest.raises(ValueError, match="invalid model arguments") as info:
        llama3.create_model_spec("debugmodel", overrides={"dimm": 1, "n_layers": "2"})
    assert str(info.value) == (
        "invalid model arguments for llama3 debugmodel: "
        "overrides.dimm: unknown argument 'dimm' of Llama3Args; did you mean 'dim'?; "
        "overrides.n_layers: expected an integer, got the string '2'"
    )


def test_model_spec_cross_check_prefixes_args() -> None:
    bad_args = attrs.evolve(llama3.LLAMA3_FLAVORS["debugmodel"], n_heads=6, n_kv_heads=None)
    spec = attrs.evolve(debug_spec(), args=bad_args)
    assert issues(spec) == [("args.n_heads", "must divide dim (256), got 6")]


# --- runtime hooks --------------------------------------------------------------------------------


def test_spec_hooks_are_the_model_runtime() -> None:
    spec = qwen3_5.create_model_spec("debugmodel")
    assert spec.build_model_fn is qwen3_5_runtime.build_model
    assert spec.parallelize_fn is qwen3_5_runtime.parallelize
    assert spec.state_dict_adapter is qwen3_5_runtime.Qwen3_5StateDictAdapter
    llama = llama3.create_model_spec("debugmodel")
    assert llama.build_model_fn is llama3_runtime.build_model
    assert llama.state_dict_adapter is llama3_runtime.Llama3StateDictAdapter


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
@pytest.mark.parametrize(
    "call",
    [
        lambda: llama3_runtime.build_model(llama3.LLAMA3_FLAVORS["debugmodel"]),
        lambda: qwen3_5_runtime.build_model(qwen3_5.QWEN3_5_FLAVORS["debugmodel"]),
        lambda: qwen3_5_runtime.build_vl_model(qwen3_5.QWEN3_5_VL_FLAVORS["2B"], device="meta"),
    ],
)
def test_runtime_hooks_without_torch_name_the_extra_to_install(call: Any) -> None:
    with pytest.raises(ImportError, match=r"hyper_parallel\[torch\]"):
        call()


def test_state_dict_adapters_rename_without_torch() -> None:
    adapter = llama3_runtime.Llama3StateDictAdapter(llama3.LLAMA3_FLAVORS["debugmodel"])
    assert adapter.to_hf({}) == {}
    assert adapter.from_hf({}) == {}


# --- import cost and shipped YAML -----------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "module",
    [
        "hyper_parallel.trainer.config",
        "hyper_parallel.models.llama3",
        "hyper_parallel.models.qwen3_5",
        "hyper_parallel.models.qwen3_5_moe",
    ],
)
def test_import_does_not_load_torch_or_numpy(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'numpy') if m in sys.modules)\n"
        # The config layer's machinery stays unread: only the common Config base (outside the package, like
        # the decorator that lets a factory record its own call), the adapter whose field transformer makes
        # the Config classes' validators fast and the error types.
        "light = {'hyper_parallel.config', 'hyper_parallel.config_base', 'hyper_parallel.errors', "
        "'hyper_parallel.config.attrs_validators'}\n"
        "config_layer = sorted(m for m in sys.modules if m.startswith('hyper_parallel.config') "
        "and m not in light)\n"
        "print(heavy, config_layer)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def _import(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _build(cls: Any, args: dict[str, Any]) -> Any:
    """A tiny stand-in for the resolver: lists become tuples, mappings for attrs sections recurse."""
    if not isinstance(cls, type) or not attrs.has(cls):
        return cls(**args)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in args.items():
        hint = hints[key]
        if isinstance(value, dict) and hint is DatasetConfig:  # one class per source: the one it names
            hint = {v.tag(): v for v in DatasetConfig.__variants__}[value.get("source")]
        if isinstance(value, dict) and isinstance(hint, type) and attrs.has(hint):
            value = _build(hint, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


@pytest.mark.parametrize("name", ["qwen3_5.yaml", "qwen3_5_full.yaml", "llama3_8b.yaml", "qwen3_5_vl.yaml"])
def test_shipped_configs_construct_cleanly(name: str) -> None:
    raw = yaml.safe_load((ROOT / "configs" / name).read_text())
    groups: dict[str, Any] = {}
    for group, node in raw.items():
        node = dict(node)
        target = _import(node.pop("_target_"))
        groups[group] = _build(target, node)
        for path, message in issues(groups[group]):
            pytest.fail(f"{name}: {group}.{path}: {message}")
    config = TrainerConfig(**groups)
    assert issues(config) == []
    if name == "qwen3_5_full.yaml":
        assert set(raw) == {f.name for f in attrs.fields(TrainerConfig)}
        assert config.world_size_issues(8) == []
        assert isinstance(config.optimizer, AdamW.Config)
        assert config.optimizer.lr == 2.0e-4
        assert config.dataloader.dataset.paths[0].endswith("shard-000.jsonl")  # type: ignore[attr-defined]
    if name == "qwen3_5.yaml":
        # A run from model.weights_path saves what it trains: the checkpoint group is part of the minimum.
        assert set(raw) == {
            "model",
            "training",
            "parallelism",
            "optimizer",
            "loss",
            "dataloader",
            "checkpoint",
        }
        assert config.model.name == "qwen3_5"
        assert config.parallelism.tp == 2
