"""The full trainer config expressed the Hydra way: structured-config dataclasses, then ``instantiate``.

Each root group's ``_target_`` picks a schema dataclass from a table (the role Hydra's config groups play);
the group is merged into ``OmegaConf.structured(schema)`` (struct mode: unknown keys are errors, values are
type-checked) and ``hydra.utils.instantiate(node, _convert_="object")`` calls the ``_target_``, which is
our own attrs Config class or model factory, so the value constraints (attrs validators) are the very same
code as ours; nested sections (``dataset``) carry their own ``_target_`` in the schema. Hydra has no hook
for cross-field checks, so the groups' and the root's ``cross_check`` are called after instantiation (the
same rules as ours, first problem only).

Where OmegaConf/Hydra cannot match our strictness (documented, not hidden):

* OmegaConf coerces: ``"12"`` becomes 12 in an int field, ``"0.5"`` a float, ``"true"``/``"yes"``/``1``
  a boolean, and a number becomes a string in a str field;
* ``Literal`` is not supported: choices are ``str`` Enums named by their values (so the choice is
  checked, and the result is a str-Enum member that compares equal to the string);
* unions other than ``Optional`` are not supported (OmegaConf 2.3): ``selective_option`` (``'op'`` or an
  int) is ``Any``, checked only by the attrs validator; ``dict`` values of model ``overrides`` are ``Any``;
* tuples come back as lists (``ListConfig``), the attrs classes receive lists;
* integers are not limited to 64 bits, and inf/nan are accepted by float nodes (the attrs validators
  catch some of them);
* the error is the first one only, with ``full_key`` but no YAML line; an unknown ``_target_`` is refused
  by the schema table here, Hydra itself would import anything (1.3.8 has a blocklist only).
"""

import dataclasses
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import hyper_parallel.models.qwen3_5  # noqa: F401  (imported by instantiate anyway; kept out of timing)
from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["load", "resolve"]


def _choice(name: str, *values: str) -> Any:
    return Enum(name, {v: v for v in values}, type=str)


Flavor = _choice("Flavor", "debugmodel", "0.8B", "2B", "4B", "9B")
PaddingSide = _choice("PaddingSide", "left", "right")
Source = _choice("Source", "jsonl")
Implementation = _choice("Implementation", "auto", "fused", "foreach", "for_loop")
DecayType = _choice("DecayType", "linear", "cosine", "constant")
Reduction = _choice("Reduction", "mean", "sum")
ParamDtype = _choice("ParamDtype", "bfloat16", "float16", "float32")
ReduceDtype = _choice("ReduceDtype", "float32", "bfloat16")
InitDevice = _choice("InitDevice", "meta", "cpu", "cuda", "npu")
PPSchedule = _choice(
    "PPSchedule", "1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"
)
Reshard = _choice("Reshard", "default", "always", "never")
StatePart = _choice("StatePart", "model", "optimizer", "lr_scheduler", "dataloader", "train_state")
ExportDtype = _choice("ExportDtype", "float16", "bfloat16", "float32")
AsyncMode = _choice("AsyncMode", "disabled", "async", "async_with_pinned_mem")
ACMode = _choice("ACMode", "none", "full", "selective")
Component = _choice("Component", "model", "loss")
Backend = _choice("Backend", "inductor", "aot_eager", "eager")
CompileMode = _choice(
    "CompileMode", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
)
CommBackend = _choice("CommBackend", "nccl", "hccl", "gloo")

_TOK = "hyper_parallel.components.tokenizer"
_DATA = "hyper_parallel.components.dataloader"
_OPT = "hyper_parallel.components.optimizer"
_SCHED = "hyper_parallel.components.lr_scheduler"
_CKPT = "hyper_parallel.components.checkpoint"
_METRICS = "hyper_parallel.components.metrics"
_PROF = "hyper_parallel.components.profiler"
_VAL = "hyper_parallel.components.validator"
_CFG = "hyper_parallel.trainer.config"


@dataclass
class Qwen35ModelSchema:
    _target_: str = "hyper_parallel.models.qwen3_5.create_model_spec"
    flavor: Flavor = Flavor["0.8B"]
    weights_path: str | None = None
    overrides: dict[str, Any] | None = None


@dataclass
class Qwen35VLModelSchema(Qwen35ModelSchema):
    _target_: str = "hyper_parallel.models.qwen3_5.create_vl_model_spec"


@dataclass
class TokenizerSchema:
    _target_: str = f"{_TOK}.Tokenizer.Config"
    path: str | None = None
    add_bos: bool = True
    add_eos: bool = True


@dataclass
class HuggingFaceTokenizerSchema(TokenizerSchema):
    _target_: str = f"{_TOK}.HuggingFaceTokenizer.Config"
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    padding_side: PaddingSide = PaddingSide["right"]
    use_fast: bool = True
    model_max_length: int | None = None


@dataclass
class DatasetSchema:
    """The JSONL source's section (``source: jsonl``, what the benchmarked configs name): a dataset section
    is one class per source, and OmegaConf's structured configs have no union to pick a schema by a key's
    value."""

    _target_: str = f"{_DATA}.JsonlSource"
    source: Source = Source["jsonl"]
    paths: list[str] = field(default_factory=list)
    text_field: str = "text"
    seed: int | None = None
    pack_sequences: bool = True
    document_masking: bool = True
    max_samples: int | None = None


@dataclass
class DataLoaderSchema:
    _target_: str = f"{_DATA}.DataLoader.Config"
    num_workers: int = 2
    pin_memory: bool = True
    prefetch_factor: int | None = None
    persistent_workers: bool = False


@dataclass
class TextDataLoaderSchema(DataLoaderSchema):
    _target_: str = f"{_DATA}.TextDataLoader.Config"
    dataset: DatasetSchema = field(default_factory=DatasetSchema)
    shuffle: bool = True
    drop_last: bool = True


@dataclass
class OptimizerSchema:
    _target_: str = f"{_OPT}.Optimizer.Config"
    lr: float = 3e-4
    weight_decay: float = 0.0
    no_decay_bias: bool = True
    no_decay_norm: bool = True
    no_decay_embedding: bool = False
    no_decay_names: list[str] = field(default_factory=list)


@dataclass
class AdamWSchema(OptimizerSchema):
    _target_: str = f"{_OPT}.AdamW.Config"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    amsgrad: bool = False
    implementation: Implementation = Implementation["auto"]


@dataclass
class SGDSchema(OptimizerSchema):
    _target_: str = f"{_OPT}.SGD.Config"
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False


@dataclass
class LRSchedulerSchema:
    _target_: str = f"{_SCHED}.LRScheduler.Config"
    warmup_steps: int = 10


@dataclass
class WarmupDecaySchema(LRSchedulerSchema):
    _target_: str = f"{_SCHED}.WarmupDecay.Config"
    decay_type: DecayType = DecayType["cosine"]
    decay_ratio: float | None = None
    min_lr_factor: float = 0.1


@dataclass
class LossSchema:
    _target_: str = "hyper_parallel.components.loss.Loss.Config"
    reduction: Reduction = Reduction["sum"]


@dataclass
class CausalLMLossSchema(LossSchema):
    _target_: str = "hyper_parallel.components.loss.CausalLMLoss.Config"
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss_weight: float = 0.0


@dataclass
class TrainingSchema:
    _target_: str = f"{_CFG}.TrainingConfig"
    max_steps: int | None = 1000
    epochs: int | None = None
    global_batch_size: int = 8
    micro_batch_size: int = 1
    seq_len: int = 2048
    seed: int = 42
    max_grad_norm: float | None = 1.0
    mixed_precision_param: ParamDtype = ParamDtype["bfloat16"]
    mixed_precision_reduce: ReduceDtype = ReduceDtype["float32"]
    init_device: InitDevice = InitDevice["meta"]
    gc_freq: int | None = 50
    enable_cpu_offload: bool = False


@dataclass
class ParallelismSchema:
    _target_: str = f"{_CFG}.ParallelismConfig"
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    pp_schedule: PPSchedule = PPSchedule["1F1B"]
    pp_microbatches: int | None = None
    sequence_parallel: bool = True
    fsdp_reshard_after_forward: Reshard = Reshard["default"]


@dataclass
class CheckpointSchema:
    _target_: str = f"{_CKPT}.Checkpoint.Config"
    enable: bool = False
    folder: str = "checkpoint"
    interval: int = 500
    keep_latest_k: int = 10
    initial_load_path: str | None = None
    initial_load_model_only: bool = True
    load_step: int = -1
    exclude_from_loading: list[StatePart] = field(default_factory=list)
    last_save_model_only: bool = True
    export_dtype: ExportDtype = ExportDtype["float32"]


@dataclass
class DCPCheckpointSchema(CheckpointSchema):
    _target_: str = f"{_CKPT}.DCPCheckpoint.Config"
    async_mode: AsyncMode = AsyncMode["disabled"]
    enable_first_step_checkpoint: bool = False


@dataclass
class ActivationCheckpointSchema:
    _target_: str = f"{_CFG}.ActivationCheckpointConfig"
    mode: ACMode = ACMode["selective"]
    selective_option: Any = "op"
    preserve_rng_state: bool = False
    early_stop: bool = False


@dataclass
class MetricsSchema:
    _target_: str = f"{_METRICS}.Metrics.Config"
    log_freq: int = 10
    rank0_only: bool = True


@dataclass
class MetricsLoggerSchema(MetricsSchema):
    _target_: str = f"{_METRICS}.MetricsLogger.Config"
    enable_tensorboard: bool = False
    tensorboard_folder: str = "tb"
    enable_jsonl: bool = False
    jsonl_path: str = "metrics.jsonl"
    run_name: str | None = None


@dataclass
class ProfilerSchema:
    _target_: str = f"{_PROF}.Profiler.Config"
    enable: bool = False
    profile_freq: int = 10
    save_traces_folder: str = "profile_traces"


@dataclass
class TorchProfilerSchema(ProfilerSchema):
    _target_: str = f"{_PROF}.TorchProfiler.Config"
    wait: int | None = None
    warmup: int = 3
    active: int = 1
    record_memory: bool = False
    record_shapes: bool = False
    with_stack: bool = False


@dataclass
class ValidatorSchema:
    _target_: str = f"{_VAL}.Validator.Config"
    enable: bool = False
    freq: int = 10
    steps: int = -1


@dataclass
class LossValidatorSchema(ValidatorSchema):
    _target_: str = f"{_VAL}.LossValidator.Config"
    dataset: DatasetSchema = field(default_factory=DatasetSchema)
    micro_batch_size: int | None = None


@dataclass
class DebugSchema:
    _target_: str = f"{_CFG}.DebugConfig"
    seed: int | None = None
    deterministic: bool = False
    deterministic_warn_only: bool = False
    detect_anomaly: bool = False
    check_nan_inf: bool = False
    print_config: bool = False


@dataclass
class CompileSchema:
    _target_: str = f"{_CFG}.CompileConfig"
    enable: bool = False
    components: list[Component] = field(default_factory=lambda: [Component["model"], Component["loss"]])
    backend: Backend = Backend["inductor"]
    mode: CompileMode = CompileMode["default"]
    fullgraph: bool = False


@dataclass
class CommSchema:
    _target_: str = f"{_CFG}.CommConfig"
    backend: CommBackend | None = None
    init_timeout_seconds: int = 300
    train_timeout_seconds: int = 100
    trace_buf_size: int = 20_000
    save_traces_folder: str = "comm_traces"


@dataclass
class FullFineTuningSchema:
    _target_: str = "hyper_parallel.components.peft.FullFineTuning.Config"


#: Root group -> the schemas its ``_target_`` may name (what Hydra's config groups would hold).
GROUPS: dict[str, tuple[type, ...]] = {
    "model": (Qwen35ModelSchema, Qwen35VLModelSchema),
    "tokenizer": (TokenizerSchema, HuggingFaceTokenizerSchema),
    "dataloader": (DataLoaderSchema, TextDataLoaderSchema),
    "optimizer": (OptimizerSchema, AdamWSchema, SGDSchema),
    "lr_scheduler": (LRSchedulerSchema, WarmupDecaySchema),
    "loss": (LossSchema, CausalLMLossSchema),
    "training": (TrainingSchema,),
    "parallelism": (ParallelismSchema,),
    "checkpoint": (CheckpointSchema, DCPCheckpointSchema),
    "activation_checkpoint": (ActivationCheckpointSchema,),
    "metrics": (MetricsSchema, MetricsLoggerSchema),
    "profiler": (ProfilerSchema, TorchProfilerSchema),
    "validator": (ValidatorSchema, LossValidatorSchema),
    "debug": (DebugSchema,),
    "compile": (CompileSchema,),
    "comm": (CommSchema,),
    "peft": (FullFineTuningSchema,),
}


def _target_default(schema: type) -> str:
    return next(f.default for f in dataclasses.fields(schema) if f.name == "_target_")  # type: ignore[no-any-return]


#: group -> {target: structured schema node}, built once (a long-lived Hydra app builds these once too).
_SCHEMAS: dict[str, dict[str, DictConfig]] = {
    group: {_target_default(s): OmegaConf.structured(s) for s in schemas} for group, schemas in GROUPS.items()
}


class HydraPeerError(ValueError):
    """A document the Hydra peer refuses (first problem only)."""


def _check(obj: Any, prefix: str) -> None:
    for path, message in obj.cross_check():
        raise HydraPeerError(f"{prefix}{path}: {message}")


def resolve(raw: Any) -> TrainerConfig:
    """Merge each group into its schema, instantiate it, build the root and run the cross-field checks."""
    groups: dict[str, Any] = {}
    for name, node in raw.items():
        table = _SCHEMAS.get(name)
        if table is None:
            raise HydraPeerError(f"unknown root group {name!r}")
        schema = table.get(node["_target_"])
        if schema is None:
            raise HydraPeerError(f"{name}._target_: {node['_target_']!r} is not a known schema")
        merged = OmegaConf.merge(schema, node)
        groups[name] = value = instantiate(merged, _convert_="object")
        _check(value, f"{name}.")
    root = TrainerConfig(**groups)
    _check(root, "")
    return root


def load(path: str) -> TrainerConfig:
    """``OmegaConf.load`` the file (how Hydra reads config files) and resolve it."""
    return resolve(OmegaConf.load(path))


if __name__ == "__main__":
    load(sys.argv[1])
