"""The parameter sections of a run that belong to no component: ``training``, ``parallelism``,
``activation_checkpoint``, ``debug``, ``compile`` and ``comm``.

Each is a plain frozen Config with its own field checks and ``cross_check``; none builds anything. They sit
here, below the techniques, because both sides read them: the models' parallel plans and
``hyper_parallel.parallel`` take them as arguments, the preflight prices them, and the root config
(:class:`hyper_parallel.trainer.config.TrainerConfig`) holds one of each. Defined in the trainer's module they
made every model and technique import the trainer (TorchTitan keeps its sections apart likewise, in
``torchtitan/config/configs.py``). This module imports attrs, :mod:`hyper_parallel._checks` and
:mod:`hyper_parallel.config_base` only: never torch, and nothing of the trainer, the components, the models or
the techniques.

Users name these classes ``hyper_parallel.trainer.config.TrainingConfig`` (in a YAML ``_target_`` and in
Python), and that module re-exports them; see :func:`_public_home` for why each class says so itself.
"""

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import attrs

from hyper_parallel._checks import RuleViolation, positive_or_auto, quote, said, unread_while_off
from hyper_parallel.config_base import ConfigBase, config_class

__all__ = [
    "PP_STAGES_PER_RANK",
    "ActivationCheckpointConfig",
    "CommConfig",
    "CompileConfig",
    "DebugConfig",
    "ParallelismConfig",
    "TrainingConfig",
]

_C = TypeVar("_C", bound=type)

#: The module where users name the classes of this one (the root config, which re-exports them).
_PUBLIC_HOME = "hyper_parallel.trainer.config"


def _public_home(cls: _C) -> _C:
    """Give ``cls`` the module users name it by, :data:`_PUBLIC_HOME`, as numpy's ``set_module`` and the
    standard library's ``collections.abc`` do.

    A class's ``__module__`` is its name to the config layer and to pickle: a dump writes the ``_target_``
    of a section from ``__module__`` and ``__qualname__``, the ``_target_`` allowlist refuses an object
    whose own module lies outside the target packages (this module is outside them on purpose: it is no
    place to look for components), and pickle imports ``__module__`` to find the class again. Every
    shipped config, dump and test names ``hyper_parallel.trainer.config.TrainingConfig``; with this, moving
    the definitions here changed none of them.
    """
    cls.__module__ = _PUBLIC_HOME
    return cls


_pos = attrs.validators.gt(0)
# Typed loosely: mypy infers a field's type from its non-None default and would reject an optional validator.
_optional_pos: Callable[[Any, Any, Any], Any] = attrs.validators.optional(attrs.validators.gt(0))


@_public_home
@config_class
class TrainingConfig(ConfigBase):
    """The training loop: length, batch geometry, precision and initialization."""

    max_steps: int | None = attrs.field(
        default=1000,
        validator=_optional_pos,
        metadata={"help": "Number of optimizer steps to train for; null when epochs gives the run's length."},
    )
    #: One of ``max_steps`` and ``epochs`` gives the run's length (:meth:`cross_check`). ``max_steps`` keeps
    #: its default, so every config written before ``epochs`` existed loads to the config it was; a run by
    #: epochs writes ``max_steps: null`` beside them.
    epochs: int | None = attrs.field(
        default=None,
        validator=_optional_pos,
        metadata={
            "help": "Passes over the training data instead of max_steps (then null): the run trains "
            "ceil(epochs x samples per epoch / global_batch_size) steps, counted when the data is loaded."
        },
    )
    global_batch_size: int = attrs.field(
        default=8,
        validator=_pos,
        metadata={"help": "Sequences per optimizer step, summed over all data-parallel ranks."},
    )
    micro_batch_size: int = attrs.field(
        default=1,
        validator=_pos,
        metadata={
            "help": "Sequences per rank per forward/backward pass (under pp: per pipeline step); the rest "
            "is gradient accumulation."
        },
    )
    seq_len: int = attrs.field(
        default=2048, validator=_pos, metadata={"help": "Tokens per training sequence."}
    )
    seed: int = attrs.field(
        default=42,
        validator=attrs.validators.ge(0),
        metadata={"help": "Seed of parameter initialization and data order (debug.seed overrides it)."},
    )
    max_grad_norm: float | None = attrs.field(
        default=1.0,
        validator=_optional_pos,
        metadata={"help": "Clip the global gradient L2 norm to this value; null disables clipping."},
    )
    mixed_precision_param: Literal["bfloat16", "float16", "float32"] = attrs.field(
        default="bfloat16",
        metadata={"help": "Dtype of parameters in forward and backward (master weights stay float32)."},
    )
    mixed_precision_reduce: Literal["float32", "bfloat16"] = attrs.field(
        default="float32",
        metadata={"help": "Dtype in which gradients are reduced across data-parallel ranks."},
    )
    init_device: Literal["meta", "cpu", "cuda", "npu"] = attrs.field(
        default="meta",
        metadata={"help": "Device the model is first created on; 'meta' allocates after sharding."},
    )
    gc_freq: int | None = attrs.field(
        default=50,
        validator=_optional_pos,
        metadata={"help": "Run Python garbage collection every this many steps; null leaves it automatic."},
    )
    enable_cpu_offload: bool = attrs.field(
        default=False,
        metadata={"help": "Keep sharded parameters, gradients and optimizer state in host memory."},
    )
    cpu_threads: int | None = attrs.field(
        default=None,
        validator=_optional_pos,
        metadata={
            "help": "Torch intra-op threads per rank; null: OMP_NUM_THREADS if exported, else the cores "
            "available to the process divided by the ranks on the node."
        },
    )
    peak_tflops: float | None = attrs.field(
        default=None,
        validator=_optional_pos,
        metadata={
            "help": "Dense peak TFLOP/s of one device, for the logged MFU; null looks the device up in the "
            "preflight's table (none for a CPU)."
        },
    )
    signal_check_freq: int = attrs.field(
        default=1,
        validator=_pos,
        metadata={
            "help": "Under torchrun, ranks compare stop signals every this many steps (and on logged, "
            "validation and checkpoint steps); a host-side gloo all-reduce that never waits for the device."
        },
    )

    def gradient_accumulation_steps(self, dp_degree: int = 1) -> int:
        """Micro-batches per optimizer step on each rank, with ``dp_degree`` data-parallel ranks."""
        per_step = self.micro_batch_size * dp_degree
        if dp_degree < 1 or self.global_batch_size % per_step:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not a multiple of micro_batch_size "
                f"{self.micro_batch_size} x data-parallel degree {dp_degree}"
            )
        return self.global_batch_size // per_step

    def steps_for(self, samples_per_epoch: int) -> int:
        """Optimizer steps of the run when an epoch of the data is ``samples_per_epoch`` samples:
        ``max_steps``, or enough steps to read ``epochs`` epochs whole (the last step may take the next
        epoch's first samples: the data loader streams epoch after epoch)."""
        if self.max_steps is not None:
            return self.max_steps
        assert self.epochs is not None, "cross_check: one of max_steps and epochs is set"
        return -(-self.epochs * samples_per_epoch // self.global_batch_size)

    def epochs_at(self, step: int, samples_per_epoch: int) -> float:
        """Epochs of ``samples_per_epoch`` samples read by the end of ``step`` (fractional)."""
        return step * self.global_batch_size / samples_per_epoch

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: one of ``max_steps`` and ``epochs`` gives the run's length; the
        global batch is a whole number of micro-batches."""
        if self.max_steps is not None and self.epochs is not None:
            yield (
                "epochs",
                f"is {self.epochs} and max_steps is {self.max_steps}: give one of the two; to train by "
                "epochs, set max_steps to null",
            )
        elif self.max_steps is None and self.epochs is None:
            yield "max_steps", "is null and so is epochs: give one of the two (the run's length)"
        if self.global_batch_size % self.micro_batch_size:
            yield (
                "global_batch_size",
                said(
                    "must be a multiple of ",
                    quote("micro_batch_size", self.micro_batch_size),
                    f", got {self.global_batch_size}",
                ),
            )


_WORLD_DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")

#: Degrees this release's runtime cannot run above 1, and what to say instead.
_NOT_YET = {
    "cp": "context parallelism is not supported yet: PyTorch's ring attention covers only the CUDA flash, "
    "memory-efficient and cuDNN attention kernels, not CPU attention with gloo, so this release cannot "
    "test it; use 1, and for long sequences use tp with sequence_parallel and activation_checkpoint",
}


#: Pipeline schedule -> stages each pipeline rank holds (its model chunks).
PP_STAGES_PER_RANK = {
    "1F1B": 1,
    "GPipe": 1,
    "Interleaved1F1B": 2,
    "LoopedBFS": 2,
    "InterleavedZeroBubble": 2,
    "ZBVZeroBubble": 2,
}


def _not_yet(name: str, value: int) -> str:
    return f"{_NOT_YET[name]}, got {value}"


@_public_home
@config_class
class ParallelismConfig(ConfigBase):
    """Parallel degrees and strategies; dp_replicate * dp_shard * cp * tp * pp equals the world size."""

    dp_replicate: int = attrs.field(
        default=1,
        validator=positive_or_auto,
        metadata={"help": "Data-parallel replicas (DDP / HSDP replicate dimension); -1 infers it."},
    )
    dp_shard: int = attrs.field(
        default=-1,
        validator=positive_or_auto,
        metadata={"help": "Data-parallel shards (FSDP dimension); -1 infers it from the world size."},
    )
    tp: int = attrs.field(
        default=1, validator=positive_or_auto, metadata={"help": "Tensor-parallel degree; -1 infers it."}
    )
    pp: int = attrs.field(
        default=1, validator=positive_or_auto, metadata={"help": "Pipeline-parallel stages; -1 infers it."}
    )
    cp: int = attrs.field(
        default=1,
        validator=positive_or_auto,
        metadata={"help": "Context-parallel degree (sequence split for attention); -1 infers it."},
    )
    ep: int = attrs.field(
        default=1,
        validator=attrs.validators.ge(1),
        metadata={"help": "Expert-parallel degree for MoE layers, carved out of dp_shard * cp."},
    )
    pp_schedule: Literal[
        "1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"
    ] = attrs.field(
        default="1F1B",
        metadata={
            "help": "Pipeline schedule used when pp > 1; Interleaved1F1B, LoopedBFS, InterleavedZeroBubble "
            "and ZBVZeroBubble hold 2 stages per rank."
        },
    )
    pp_microbatches: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.ge(1)),
        metadata={
            "help": "Pipeline micro-batches each training micro-batch (training.micro_batch_size "
            "sequences, one pipeline step) is split into; must divide micro_batch_size; null uses pp."
        },
    )
    sequence_parallel: bool = attrs.field(
        default=True,
        metadata={"help": "Shard norm and dropout activations along the sequence when tp > 1."},
    )
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = attrs.field(
        default="default",
        metadata={
            "help": "Free gathered parameters after forward: 'always', 'never' (faster, more memory) "
            "or 'default' (never for the last stage under pipelining, else always)."
        },
    )

    def _autos(self) -> list[str]:
        return [name for name in _WORLD_DEGREES if getattr(self, name) == -1]

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for contradictions that do not depend on the world size.

        Layouts the runtime of this release cannot run are refused here, each with what to use instead.
        """
        autos = self._autos()
        for name in autos[1:]:
            yield name, f"only one degree may be -1 (auto), and {autos[0]} already is"
        for name in _NOT_YET:
            value = getattr(self, name)
            if value > 1:
                yield name, _not_yet(name, value)
        if self.dp_shard != -1 and self.cp != -1:  # stated: decided without the world size
            yield from self._expert_split(self.dp_shard * self.cp, "")

    def _expert_split(self, shard_cp: int, ranks: str) -> Iterator[tuple[str, str]]:
        """``ep`` carves its groups out of ``dp_shard * cp`` (``shard_cp``), so it must divide it."""
        if self.ep > 1 and shard_cp % self.ep:
            yield "ep", f"must divide dp_shard * cp ({shard_cp}{ranks}), got {self.ep}"

    def pipeline_stages_per_rank(self) -> int:
        """Pipeline stages (model chunks) each pipeline rank holds under ``pp_schedule``."""
        return PP_STAGES_PER_RANK[self.pp_schedule]

    def pipeline_microbatches(self, pp: int) -> int:
        """Micro-batches of one pipeline step with ``pp`` resolved: ``pp_microbatches``, or ``pp`` if null."""
        return self.pp_microbatches if self.pp_microbatches is not None else pp

    def not_supported_yet(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for resolved ``degrees`` the runtime cannot run yet, however set.

        The trainer asks this of configs built in Python, which the resolver's checks never saw.
        """
        for name in _NOT_YET:
            if degrees[name] > 1:
                yield name, _not_yet(name, degrees[name])

    def unsupported_degrees(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for degrees left at -1 (auto) that resolved to a layout the
        runtime cannot run yet (explicit values are refused by ``cross_check``)."""
        for name in _NOT_YET:
            if getattr(self, name) == -1 and degrees[name] > 1:
                yield name, _not_yet(name, degrees[name]) + " (inferred from the world size)"

    def world_size_issues(self, world_size: int) -> list[tuple[str, str]]:
        """``(field path, message)`` pairs explaining why these degrees do not fit ``world_size`` ranks."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        autos = self._autos()
        if len(autos) > 1:
            return [
                (name, f"only one degree may be -1 (auto), and {autos[0]} already is") for name in autos[1:]
            ]
        known = {name: getattr(self, name) for name in _WORLD_DEGREES if name not in autos}
        product = math.prod(known.values())
        formula = " * ".join(_WORLD_DEGREES)
        if autos:
            if world_size % product:
                return [
                    (
                        autos[0],
                        f"cannot infer {autos[0]}: the other degrees multiply to {product}, which does "
                        f"not divide the world size {world_size}",
                    )
                ]
            degrees = {**known, autos[0]: world_size // product}
        else:
            if product != world_size:
                return [("dp_shard", f"{formula} = {product}, but the world size is {world_size}")]
            degrees = known
        # Stated dp_shard and cp: the message of cross_check, which reports it without the world size.
        stated = self.dp_shard != -1 and self.cp != -1
        ranks = "" if stated else f" with world size {world_size}"
        return list(self._expert_split(degrees["dp_shard"] * degrees["cp"], ranks))

    def resolved_degrees(self, world_size: int) -> dict[str, int]:
        """Every degree with ``-1`` inferred for ``world_size``; ``ValueError`` if they do not fit."""
        issues = self.world_size_issues(world_size)
        if issues:
            raise ValueError("; ".join(f"parallelism.{path}: {message}" for path, message in issues))
        known = {name: getattr(self, name) for name in _WORLD_DEGREES}
        autos = self._autos()
        if autos:
            others = math.prod(v for k, v in known.items() if k not in autos)
            known[autos[0]] = world_size // others
        return {**known, "ep": self.ep}


def _selective_option(instance: object, attribute: "attrs.Attribute[Any]", value: object) -> None:
    if value != "op" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise RuleViolation(attribute.name, "must be 'op' or a layer frequency >= 1", value, bound=1)


@_public_home
@config_class
class ActivationCheckpointConfig(ConfigBase):
    """Activation checkpointing (recomputation in backward) to trade compute for memory."""

    mode: Literal["none", "full", "selective"] = attrs.field(
        default="selective",
        metadata={
            "help": "'none' keeps all activations, 'full' recomputes every block, 'selective' recomputes "
            "what selective_option picks."
        },
    )
    selective_option: Literal["op"] | int = attrs.field(
        default="op",
        validator=_selective_option,
        metadata={
            "help": "For mode 'selective': 'op' saves only expensive ops (matmuls, attention); an integer "
            "n checkpoints every n-th block."
        },
    )
    preserve_rng_state: bool = attrs.field(
        default=False,
        metadata={"help": "Restore the RNG state during recomputation so dropout masks match exactly."},
    )
    early_stop: bool = attrs.field(
        default=False,
        metadata={"help": "Stop recomputation as soon as the needed activations are regenerated."},
    )


@_public_home
@config_class
class DebugConfig(ConfigBase):
    """Determinism and numerical checks for debugging (all off by default)."""

    seed: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.ge(0)),
        metadata={
            "help": "Seed every RNG with this value instead of training.seed; null keeps training.seed."
        },
    )
    deterministic: bool = attrs.field(
        default=False,
        metadata={"help": "Use deterministic kernels only (slower; bitwise reproducible runs)."},
    )
    deterministic_warn_only: bool = attrs.field(
        default=False,
        metadata={
            "help": "With deterministic, warn instead of failing on ops without a deterministic kernel."
        },
    )
    detect_anomaly: bool = attrs.field(
        default=False,
        metadata={"help": "Enable autograd anomaly detection (very slow; finds the op producing NaN)."},
    )
    check_nan_inf: bool = attrs.field(
        default=True,
        metadata={
            "help": "Stop (exit 1) when the loss or gradient norm turns NaN/Inf, naming the first such step; "
            "checked on the device every step and read on logged steps and before every save, so a "
            "non-finite state is never saved and never prunes a finite checkpoint."
        },
    )
    print_config: bool = attrs.field(
        default=False,
        metadata={"help": "Print the resolved configuration on rank 0 at startup."},
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: ``deterministic_warn_only`` qualifies ``deterministic``."""
        if self.deterministic_warn_only and not self.deterministic:
            yield (
                "deterministic_warn_only",
                "has no effect unless deterministic is true; set deterministic: true or remove it",
            )


@_public_home
@config_class
class CompileConfig(ConfigBase):
    """torch.compile of the model and/or the loss."""

    enable: bool = attrs.field(default=False, metadata={"help": "Compile the components listed below."})
    components: tuple[Literal["model", "loss"], ...] = attrs.field(
        default=("model", "loss"),
        metadata={"help": "What to compile when enable is true: 'model' (per block) and/or 'loss'."},
    )
    backend: Literal["inductor", "aot_eager", "eager"] = attrs.field(
        default="inductor",
        metadata={"help": "torch.compile backend; 'aot_eager' and 'eager' are for debugging."},
    )
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = attrs.field(
        default="default",
        metadata={"help": "torch.compile optimization mode."},
    )
    fullgraph: bool = attrs.field(
        default=False,
        metadata={"help": "Fail on graph breaks instead of falling back to eager for that region."},
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for an empty or repeated component list when compiling."""
        if len(set(self.components)) != len(self.components):
            yield "components", "lists the same component more than once"
        if self.enable and not self.components:
            yield "components", "is empty, so compile.enable has nothing to compile"


@_public_home
@config_class
class CommConfig(ConfigBase):
    """Collective-communication backend and timeouts."""

    backend: Literal["nccl", "hccl", "gloo"] | None = attrs.field(
        default=None,
        metadata={"help": "Process-group backend; null picks nccl on CUDA, hccl on NPU and gloo on CPU."},
    )
    init_timeout_seconds: int = attrs.field(
        default=300,
        validator=_pos,
        metadata={"help": "Timeout in seconds for collectives until the first training step."},
    )
    train_timeout_seconds: int = attrs.field(
        default=100,
        validator=_pos,
        metadata={"help": "Timeout in seconds for each collective once training has started."},
    )
    trace_buf_size: int = attrs.field(
        default=20_000,
        validator=attrs.validators.ge(0),
        metadata={"help": "Entries of the flight recorder ring buffer for hang debugging; 0 disables it."},
    )
    save_traces_folder: str = attrs.field(
        default="comm_traces",
        validator=attrs.validators.min_len(1),
        metadata={"help": "Directory receiving flight-recorder dumps after a timeout."},
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: the dump folder of a flight recorder that is off is refused,
        as every sink's options are (:func:`hyper_parallel._checks.unread_while_off`)."""
        yield from unread_while_off(
            self,
            ("save_traces_folder",),
            switch="trace_buf_size",
            on=self.trace_buf_size > 0,
            when="trace_buf_size > 0",
        )
