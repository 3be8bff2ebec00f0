"""The full trainer config expressed in pydantic v2: one model per Config class, unions keyed by ``_target_``.

Every model is ``strict=True, extra="forbid", frozen=True, allow_inf_nan=False``; each root group is a
discriminated union on its ``_target_`` (an alias: pydantic reserves leading underscores), listing the same
implementations our resolver accepts for that field (the base Config and its subclasses). Field
constraints mirror the attrs validators (``gt``/``ge``/``lt``/``le``, non-empty strings, "-1 or >= n"),
and the ``cross_check`` rules are ``model_validator(mode="after")`` methods, so both sides do the same work.

Where pydantic does not match our resolver (documented, not hidden):

* tuple fields are declared ``Strict(False)`` on the tuple only, because strict pydantic refuses a list for
  a tuple and YAML has no tuples; the items stay strict (``"0.9"`` is still refused as a float);
* integers are not limited to 64 bits (ours refuses ``2**63``);
* it stops a union at the discriminator: an unknown ``_target_`` is one error with the allowed tags, with
  no did-you-mean and no import of the target (the table of targets is closed, nothing can be allowed by
  trusted code at run time, and no signature or return type is checked: there is no call to check);
* the model factory is called in an after-validator of the ``model`` group; the spec lives in a private
  attribute;
* errors carry a ``loc`` path but no YAML line, and a failing after-validator hides the group's other
  cross-field problems (raised one at a time).
"""

import functools
import operator
import sys
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, Strict, model_validator

from hyper_parallel.models import ModelSpec
from hyper_parallel.models.qwen3_5 import create_model_spec, create_vl_model_spec

_OPT = "hyper_parallel.components.optimizer"
_CFG = "hyper_parallel.trainer.config"

NonEmpty = Annotated[str, Field(min_length=1)]
PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0.0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
UnitOpen = Annotated[float, Field(ge=0.0, lt=1.0)]
UnitClosed = Annotated[float, Field(ge=0.0, le=1.0)]


def _positive_or_auto(value: int) -> int:
    if value != -1 and value < 1:
        raise ValueError("must be >= 1, or -1 for auto")
    return value


def _minus_one_or_at_least(minimum: int) -> AfterValidator:
    def check(value: int) -> int:
        if value != -1 and value < minimum:
            raise ValueError(f"must be >= {minimum}, or -1")
        return value

    return AfterValidator(check)


Degree = Annotated[int, AfterValidator(_positive_or_auto)]


class _Model(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=False
    )


# -- model -----------------------------------------------------------------------------------------------
Flavor = Literal["debugmodel", "0.8B", "2B", "4B", "9B"]
OverrideValue = int | float | bool | str | None


class _ModelGroup(_Model):
    flavor: Flavor = "0.8B"
    weights_path: str | None = None
    overrides: dict[str, OverrideValue] | None = None
    _spec: ModelSpec = PrivateAttr()

    @property
    def spec(self) -> ModelSpec:
        return self._spec


class Qwen35Model(_ModelGroup):
    target: Literal["hyper_parallel.models.qwen3_5.create_model_spec"] = Field(alias="_target_")

    @model_validator(mode="after")
    def _build(self) -> "Qwen35Model":
        self._spec = create_model_spec(self.flavor, self.weights_path, self.overrides)
        return self


class Qwen35VLModel(_ModelGroup):
    target: Literal["hyper_parallel.models.qwen3_5.create_vl_model_spec"] = Field(alias="_target_")

    @model_validator(mode="after")
    def _build(self) -> "Qwen35VLModel":
        self._spec = create_vl_model_spec(self.flavor, self.weights_path, self.overrides)
        return self


# -- tokenizer -------------------------------------------------------------------------------------------
class TokenizerConfig(_Model):
    target: Literal["hyper_parallel.components.tokenizer.Tokenizer.Config"] = Field(alias="_target_")
    path: NonEmpty | None = None
    add_bos: bool = True
    add_eos: bool = True


class HuggingFaceTokenizerConfig(TokenizerConfig):
    target: Literal["hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    bos_token: NonEmpty | None = None
    eos_token: NonEmpty | None = None
    pad_token: NonEmpty | None = None
    padding_side: Literal["left", "right"] = "right"
    use_fast: bool = True
    model_max_length: PosInt | None = None


# -- data ------------------------------------------------------------------------------------------------
class DatasetConfig(_Model):
    source: Literal["jsonl", "text", "synthetic"] = "synthetic"
    paths: Annotated[tuple[NonEmpty, ...], Strict(False)] = ()
    text_field: NonEmpty = "text"
    seed: NonNegInt | None = None
    pack_sequences: bool = True
    document_masking: bool = True
    max_samples: PosInt | None = None
    synthetic_num_samples: PosInt = 10_000
    weights: Annotated[tuple[PosFloat, ...], Strict(False)] | None = None
    holdout_fraction: UnitOpen = 0.0
    split: Literal["train", "holdout"] = "train"

    @model_validator(mode="after")
    def _cross(self) -> "DatasetConfig":
        if self.source != "synthetic" and not self.paths:
            raise ValueError(f"paths: must list at least one file when source is {self.source!r}")
        if self.source == "synthetic" and self.paths:
            raise ValueError("paths: must be empty when source is 'synthetic'")
        return self


class DataLoaderConfig(_Model):
    target: Literal["hyper_parallel.components.dataloader.DataLoader.Config"] = Field(alias="_target_")
    num_workers: NonNegInt = 2
    pin_memory: bool = True
    prefetch_factor: Annotated[int, Field(ge=1)] | None = None
    persistent_workers: bool = False

    @model_validator(mode="after")
    def _cross(self) -> "DataLoaderConfig":
        if self.num_workers == 0 and self.prefetch_factor is not None:
            raise ValueError("prefetch_factor: needs num_workers > 0")
        if self.num_workers == 0 and self.persistent_workers:
            raise ValueError("persistent_workers: needs num_workers > 0")
        return self


class TextDataLoaderConfig(DataLoaderConfig):
    target: Literal["hyper_parallel.components.dataloader.TextDataLoader.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    shuffle: bool = True
    drop_last: bool = True


# -- optimizer -------------------------------------------------------------------------------------------
class OptimizerConfig(_Model):
    target: Literal["hyper_parallel.components.optimizer.Optimizer.Config"] = Field(alias="_target_")
    lr: PosFloat = 3e-4
    weight_decay: NonNegFloat = 0.0
    no_decay_bias: bool = True
    no_decay_norm: bool = True
    no_decay_embedding: bool = False
    no_decay_names: Annotated[tuple[NonEmpty, ...], Strict(False)] = ()


class AdamWConfig(OptimizerConfig):
    target: Literal["hyper_parallel.components.optimizer.AdamW.Config"] = Field(alias="_target_")  # type: ignore[assignment]
    weight_decay: NonNegFloat = 0.1
    betas: Annotated[tuple[UnitOpen, UnitOpen], Strict(False)] = (0.9, 0.95)
    eps: PosFloat = 1e-8
    amsgrad: bool = False
    implementation: Literal["auto", "fused", "foreach", "for_loop"] = "auto"


class SGDConfig(OptimizerConfig):
    target: Literal["hyper_parallel.components.optimizer.SGD.Config"] = Field(alias="_target_")  # type: ignore[assignment]
    momentum: UnitOpen = 0.0
    dampening: UnitClosed = 0.0
    nesterov: bool = False

    @model_validator(mode="after")
    def _cross(self) -> "SGDConfig":
        if self.nesterov and (self.momentum <= 0.0 or self.dampening != 0.0):
            raise ValueError("nesterov needs momentum > 0 and dampening 0")
        return self


# -- lr scheduler, loss ----------------------------------------------------------------------------------
class LRSchedulerConfig(_Model):
    target: Literal["hyper_parallel.components.lr_scheduler.LRScheduler.Config"] = Field(alias="_target_")
    warmup_steps: NonNegInt = 10


class WarmupDecayConfig(LRSchedulerConfig):
    target: Literal["hyper_parallel.components.lr_scheduler.WarmupDecay.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    decay_type: Literal["linear", "cosine", "constant"] = "cosine"
    decay_ratio: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    min_lr_factor: UnitClosed = 0.1


class LossConfig(_Model):
    target: Literal["hyper_parallel.components.loss.Loss.Config"] = Field(alias="_target_")
    reduction: Literal["mean", "sum"] = "sum"


class CausalLMLossConfig(LossConfig):
    target: Literal["hyper_parallel.components.loss.CausalLMLoss.Config"] = Field(alias="_target_")  # type: ignore[assignment]
    ignore_index: int = -100
    label_smoothing: UnitOpen = 0.0
    z_loss_weight: NonNegFloat = 0.0


# -- parameter sections ----------------------------------------------------------------------------------
class TrainingConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.TrainingConfig"] = Field(alias="_target_")
    max_steps: PosInt | None = 1000
    epochs: PosInt | None = None
    global_batch_size: PosInt = 8
    micro_batch_size: PosInt = 1
    seq_len: PosInt = 2048
    seed: NonNegInt = 42
    max_grad_norm: PosFloat | None = 1.0
    mixed_precision_param: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    mixed_precision_reduce: Literal["float32", "bfloat16"] = "float32"
    init_device: Literal["meta", "cpu", "cuda", "npu"] = "meta"
    gc_freq: PosInt | None = 50
    enable_cpu_offload: bool = False
    signal_check_freq: PosInt = 1
    peak_tflops: PosFloat | None = None
    cpu_threads: PosInt | None = None

    @model_validator(mode="after")
    def _cross(self) -> "TrainingConfig":
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError("global_batch_size: must be a multiple of micro_batch_size")
        return self


class ParallelismConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.ParallelismConfig"] = Field(alias="_target_")
    dp_replicate: Degree = 1
    dp_shard: Degree = -1
    tp: Degree = 1
    pp: Degree = 1
    cp: Degree = 1
    ep: Annotated[int, Field(ge=1)] = 1
    pp_schedule: Literal[
        "1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"
    ] = "1F1B"
    pp_microbatches: Annotated[int, Field(ge=1)] | None = None
    sequence_parallel: bool = True
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = "default"

    @model_validator(mode="after")
    def _cross(self) -> "ParallelismConfig":
        autos = [d for d in (self.dp_replicate, self.dp_shard, self.cp, self.tp, self.pp) if d == -1]
        if len(autos) > 1:
            raise ValueError("only one degree may be -1 (auto)")
        if self.pp > 1 and self.pp_microbatches is not None and self.pp_microbatches < self.pp:
            raise ValueError("pp_microbatches: must be >= pp")
        if self.ep > 1 and self.dp_shard != -1 and self.cp != -1 and (self.dp_shard * self.cp) % self.ep:
            raise ValueError("ep: must divide dp_shard * cp")
        return self


class CheckpointConfig(_Model):
    target: Literal["hyper_parallel.components.checkpoint.Checkpoint.Config"] = Field(alias="_target_")
    enable: bool = False
    folder: NonEmpty = "checkpoint"
    interval: PosInt = 500
    keep_latest_k: NonNegInt = 10
    initial_load_path: NonEmpty | None = None
    initial_load_model_only: bool = True
    load_step: Annotated[int, _minus_one_or_at_least(0)] = -1
    exclude_from_loading: Annotated[
        tuple[Literal["model", "optimizer", "lr_scheduler", "dataloader", "train_state"], ...], Strict(False)
    ] = ()
    last_save_model_only: bool = True
    export_dtype: Literal["float16", "bfloat16", "float32"] = "float32"

    @model_validator(mode="after")
    def _cross(self) -> "CheckpointConfig":
        if "model" in self.exclude_from_loading:
            raise ValueError("exclude_from_loading: cannot exclude 'model'")
        if len(set(self.exclude_from_loading)) != len(self.exclude_from_loading):
            raise ValueError("exclude_from_loading: lists the same part more than once")
        if self.export_dtype != "float32" and not self.last_save_model_only:
            raise ValueError("export_dtype: only applies to the model-only final save")
        return self


class DCPCheckpointConfig(CheckpointConfig):
    target: Literal["hyper_parallel.components.checkpoint.DCPCheckpoint.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
    enable_first_step_checkpoint: bool = False

    @model_validator(mode="after")
    def _cross_dcp(self) -> "DCPCheckpointConfig":
        if self.async_mode != "disabled" and self.keep_latest_k == 1:
            raise ValueError("keep_latest_k: must be 0 or >= 2 with an async save")
        return self


class ActivationCheckpointConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.ActivationCheckpointConfig"] = Field(alias="_target_")
    mode: Literal["none", "full", "selective"] = "selective"
    selective_option: Literal["op"] | Annotated[int, Field(ge=1)] = "op"
    preserve_rng_state: bool = False
    early_stop: bool = False


class MetricsConfig(_Model):
    target: Literal["hyper_parallel.components.metrics.Metrics.Config"] = Field(alias="_target_")
    log_freq: PosInt = 10
    rank0_only: bool = True


class MetricsLoggerConfig(MetricsConfig):
    target: Literal["hyper_parallel.components.metrics.MetricsLogger.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    enable_tensorboard: bool = False
    tensorboard_folder: NonEmpty = "tb"
    enable_jsonl: bool = False
    jsonl_path: NonEmpty = "metrics.jsonl"
    run_name: NonEmpty | None = None
    enable_wandb: bool = False
    wandb_project: NonEmpty = "hyper_parallel"
    wandb_folder: NonEmpty = "runs"


class ProfilerConfig(_Model):
    target: Literal["hyper_parallel.components.profiler.Profiler.Config"] = Field(alias="_target_")
    enable: bool = False
    profile_freq: PosInt = 10
    save_traces_folder: NonEmpty = "profile_traces"


class TorchProfilerConfig(ProfilerConfig):
    target: Literal["hyper_parallel.components.profiler.TorchProfiler.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    wait: NonNegInt | None = None
    warmup: NonNegInt = 3
    active: PosInt = 1
    record_memory: bool = False
    record_shapes: bool = False
    with_stack: bool = False

    @model_validator(mode="after")
    def _cross(self) -> "TorchProfilerConfig":
        busy = self.warmup + self.active
        if busy > self.profile_freq:
            raise ValueError("profile_freq: must be >= warmup + active")
        if self.wait is not None and self.wait + busy != self.profile_freq:
            raise ValueError("wait: wait + warmup + active must equal profile_freq")
        return self


class ValidatorConfig(_Model):
    target: Literal["hyper_parallel.components.validator.Validator.Config"] = Field(alias="_target_")
    enable: bool = False
    freq: PosInt = 10
    steps: Annotated[int, _minus_one_or_at_least(1)] = -1


class LossValidatorConfig(ValidatorConfig):
    target: Literal["hyper_parallel.components.validator.LossValidator.Config"] = Field(  # type: ignore[assignment]
        alias="_target_"
    )
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    micro_batch_size: PosInt | None = None


class DebugConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.DebugConfig"] = Field(alias="_target_")
    seed: NonNegInt | None = None
    deterministic: bool = False
    deterministic_warn_only: bool = False
    detect_anomaly: bool = False
    check_nan_inf: bool = False
    print_config: bool = False


class CompileConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.CompileConfig"] = Field(alias="_target_")
    enable: bool = False
    components: Annotated[tuple[Literal["model", "loss"], ...], Strict(False)] = ("model", "loss")
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    fullgraph: bool = False

    @model_validator(mode="after")
    def _cross(self) -> "CompileConfig":
        if len(set(self.components)) != len(self.components):
            raise ValueError("components: lists the same component more than once")
        if self.enable and not self.components:
            raise ValueError("components: is empty")
        return self


class CommConfig(_Model):
    target: Literal["hyper_parallel.trainer.config.CommConfig"] = Field(alias="_target_")
    backend: Literal["nccl", "hccl", "gloo"] | None = None
    init_timeout_seconds: PosInt = 300
    train_timeout_seconds: PosInt = 100
    trace_buf_size: NonNegInt = 20_000
    save_traces_folder: NonEmpty = "comm_traces"


class FullFineTuningConfig(_Model):
    target: Literal["hyper_parallel.components.peft.FullFineTuning.Config"] = Field(alias="_target_")


def _group(*members: type) -> Any:
    return Annotated[functools.reduce(operator.or_, members), Field(discriminator="target")]


def _default(cls: type[_Model], target: str) -> Any:
    return Field(default_factory=lambda: cls.model_validate({"_target_": target}))


class TrainerConfig(_Model):
    """The root: one discriminated union per group, then the cross-group checks."""

    model: _group(Qwen35Model, Qwen35VLModel)  # type: ignore[valid-type]
    tokenizer: _group(TokenizerConfig, HuggingFaceTokenizerConfig) = _default(  # type: ignore[valid-type]
        HuggingFaceTokenizerConfig, "hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config"
    )
    dataloader: _group(DataLoaderConfig, TextDataLoaderConfig) = _default(  # type: ignore[valid-type]
        TextDataLoaderConfig, "hyper_parallel.components.dataloader.TextDataLoader.Config"
    )
    optimizer: _group(OptimizerConfig, AdamWConfig, SGDConfig) = _default(  # type: ignore[valid-type]
        AdamWConfig, f"{_OPT}.AdamW.Config"
    )
    lr_scheduler: _group(LRSchedulerConfig, WarmupDecayConfig) = _default(  # type: ignore[valid-type]
        WarmupDecayConfig, "hyper_parallel.components.lr_scheduler.WarmupDecay.Config"
    )
    loss: _group(LossConfig, CausalLMLossConfig) = _default(  # type: ignore[valid-type]
        CausalLMLossConfig, "hyper_parallel.components.loss.CausalLMLoss.Config"
    )
    training: _group(TrainingConfig) = _default(TrainingConfig, f"{_CFG}.TrainingConfig")  # type: ignore[valid-type]
    parallelism: _group(ParallelismConfig) = _default(  # type: ignore[valid-type]
        ParallelismConfig, f"{_CFG}.ParallelismConfig"
    )
    checkpoint: _group(CheckpointConfig, DCPCheckpointConfig) = _default(  # type: ignore[valid-type]
        DCPCheckpointConfig, "hyper_parallel.components.checkpoint.DCPCheckpoint.Config"
    )
    activation_checkpoint: _group(ActivationCheckpointConfig) = _default(  # type: ignore[valid-type]
        ActivationCheckpointConfig, f"{_CFG}.ActivationCheckpointConfig"
    )
    metrics: _group(MetricsConfig, MetricsLoggerConfig) = _default(  # type: ignore[valid-type]
        MetricsLoggerConfig, "hyper_parallel.components.metrics.MetricsLogger.Config"
    )
    profiler: _group(ProfilerConfig, TorchProfilerConfig) = _default(  # type: ignore[valid-type]
        TorchProfilerConfig, "hyper_parallel.components.profiler.TorchProfiler.Config"
    )
    validator: _group(ValidatorConfig, LossValidatorConfig) = _default(  # type: ignore[valid-type]
        LossValidatorConfig, "hyper_parallel.components.validator.LossValidator.Config"
    )
    debug: _group(DebugConfig) = _default(DebugConfig, f"{_CFG}.DebugConfig")  # type: ignore[valid-type]
    compile: _group(CompileConfig) = _default(CompileConfig, f"{_CFG}.CompileConfig")  # type: ignore[valid-type]
    comm: _group(CommConfig) = _default(CommConfig, f"{_CFG}.CommConfig")  # type: ignore[valid-type]
    peft: _group(FullFineTuningConfig) = _default(  # type: ignore[valid-type]
        FullFineTuningConfig, "hyper_parallel.components.peft.FullFineTuning.Config"
    )

    @model_validator(mode="after")
    def _cross(self) -> "TrainerConfig":
        training, par, sched = self.training, self.parallelism, self.lr_scheduler
        max_steps = training.max_steps
        if sched.warmup_steps > max_steps:
            raise ValueError("lr_scheduler.warmup_steps: must be <= training.max_steps")
        if (
            isinstance(sched, WarmupDecayConfig)
            and sched.decay_ratio is not None
            and sched.warmup_steps + round(max_steps * sched.decay_ratio) > max_steps
        ):
            raise ValueError("lr_scheduler.decay_ratio: warmup plus decay exceeds training.max_steps")
        if self.validator.enable and self.validator.freq > max_steps:
            raise ValueError("validator.freq: exceeds training.max_steps")
        if self.profiler.enable and self.profiler.profile_freq > max_steps:
            raise ValueError("profiler.profile_freq: exceeds training.max_steps")
        if self.compile.enable and "model" in self.compile.components and par.pp > 1:
            raise ValueError("compile.enable: not supported with pipeline parallelism")
        args = self.model.spec.args
        n_layers, max_len = args.num_layers(), args.max_sequence_length()
        option = self.activation_checkpoint.selective_option
        if n_layers is not None:
            if (
                self.activation_checkpoint.mode == "selective"
                and isinstance(option, int)
                and option > n_layers
            ):
                raise ValueError("activation_checkpoint.selective_option: more than the model's blocks")
            if par.pp > n_layers:
                raise ValueError("parallelism.pp: must be <= the model's layers")
        if max_len is not None and training.seq_len > max_len:
            raise ValueError("training.seq_len: must be <= the model's max_seq_len")
        if par.cp > 1 and training.seq_len % (2 * par.cp):
            raise ValueError("training.seq_len: must be divisible by 2 * parallelism.cp")
        if (
            training.global_batch_size % training.micro_batch_size == 0
            and par.dp_replicate != -1
            and par.dp_shard != -1
            and training.global_batch_size % (training.micro_batch_size * par.dp_replicate * par.dp_shard)
        ):
            raise ValueError("training.global_batch_size: not a multiple of micro_batch_size x dp degrees")
        devices = {"nccl": "cuda", "hccl": "npu"}
        backend, device = self.comm.backend, training.init_device
        if backend in devices and device in devices.values() and devices[backend] != device:
            raise ValueError("comm.backend: does not run on training.init_device")
        return self


def resolve(raw: Any) -> TrainerConfig:
    """Validate a parsed document (``model_validate``)."""
    return TrainerConfig.model_validate(raw)


def load(path: str) -> TrainerConfig:
    """Read the file with PyYAML's C loader (pydantic has no YAML reader) and validate it."""
    with open(path, encoding="utf-8") as stream:
        return resolve(yaml.load(stream, Loader=yaml.CSafeLoader))


if __name__ == "__main__":
    load(sys.argv[1])
