"""``Trainer``: builds every component of a resolved ``TrainerConfig`` in order, then trains.

Build order (the trainer owns it; users never wire components by hand):

1. process group from torchrun's environment (``comm``), device, seeds and debug switches (``debug``);
2. device mesh from ``parallelism`` (``ParallelDims``);
3. model on ``training.init_device`` (``meta``: nothing allocated), then the model's ``parallelize_fn``
   (TP/SP, activation checkpointing, ``torch.compile``, FSDP2 with the mixed-precision policy and CPU
   offload), then materialised on the device: pretrained weights from ``model.weights_path`` through the
   state-dict adapter, or initialised from the seed (the same full weights for every layout); under
   pipeline parallelism (``parallelism.pp`` > 1) each rank builds only its stages (``parallel.pipeline``);
4. optimizer, loss (compiled when ``compile.components`` lists it);
5. the data loader of this rank's data-parallel coordinates (the tokenizer is loaded before the model,
   when the files the config names are checked: see ``_inputs``), then the run's length (``max_steps``:
   ``training.max_steps``, or the steps of ``training.epochs`` over the loader's samples per epoch) and
   the lr scheduler over it;
6. checkpoint manager, which resumes model, optimizer, scheduler, data position, RNG and step;
7. metrics, profiler, validator.

One optimizer step reads ``global_batch_size / (micro_batch_size x dp)`` micro-batches on each rank.
With ``loss.reduction: sum`` (the default) every token counts equally: the summed token losses are
divided by the tokens counted in the whole global batch (every micro-batch, every data-parallel rank),
so the step's loss and gradients do not depend on how the batch is split (Hugging Face's fix of the
gradient-accumulation loss normalises the same way). With ``mean`` every micro-batch counts equally
(the mean of the micro-batch means over accumulation and data-parallel ranks), whatever its counted
tokens. FSDP averages gradients over data-parallel ranks, which the scaling below accounts for. Under
pipeline parallelism each micro-batch is one pipeline step (split into ``pp_microbatches``) with the same
loss weights; the loss is summed from the last stage and the gradient norm is clipped over every stage.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar, SupportsFloat, TextIO

import attrs
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from hyper_parallel._checks import counted
from hyper_parallel._dtypes import torch_dtype
from hyper_parallel.components.checkpoint import CheckpointNotResumableError
from hyper_parallel.components.dataloader import LoaderRequest
from hyper_parallel.components.loss.chunking import loss_chunking
from hyper_parallel.config import dump_config, validate
from hyper_parallel.parallel.parallel_dims import ParallelDims
from hyper_parallel.parallel.process_group import (
    DistributedEnv,
    init_distributed,
    new_group,
    peer_failure,
    set_collective_timeout,
    shutdown,
)
from hyper_parallel.trainer import rules
from hyper_parallel.trainer._agreement import config_disagreement, step_disagreement
from hyper_parallel.trainer._inputs import build_tokenizer, check_files
from hyper_parallel.trainer.config import TrainerConfig
from hyper_parallel.trainer.machine import intra_op_threads

if TYPE_CHECKING:
    from hyper_parallel.parallel.pipeline import Pipeline
    from hyper_parallel.trainer.config import ParallelismConfig

__all__ = [
    "CollectiveError",
    "NonFiniteError",
    "RanksDisagreeError",
    "StepResult",
    "Trainer",
    "TrainingError",
]


class TrainingError(RuntimeError):
    """Training stopped on a condition the user must act on (the message says which and where)."""


class NonFiniteError(TrainingError):
    """``debug.check_nan_inf`` found a NaN or infinite loss or gradient norm; ``step`` is the first such."""

    def __init__(self, step: int, what: str, value: float) -> None:
        super().__init__(
            f"step {step}: {what} is {value} (debug.check_nan_inf); lower optimizer.lr, enable "
            "training.max_grad_norm, or set debug.detect_anomaly to find the operation"
        )
        self.step, self.what, self.value = step, what, value


class RanksDisagreeError(TrainingError):
    """The ranks resolved different configs or see different checkpoints; every rank raises it at once.

    An input error (the files or environment differ between ranks): the command line exits 2.
    """

    exit_status: ClassVar[int] = 2


class CollectiveError(TrainingError):
    """A collective timed out or lost its peer: another rank stopped or is stalled.

    Raised on each rank that saw it, naming the rank, the phase (``step 3``, ``validation at step 2``, the
    checkpoint save of a step, ``start-up (...)``), the collective and the ``comm`` timeout in force. Every
    such rank prints its own line (the stalled rank may be rank 0), then exits 1.
    """

    every_rank: ClassVar[bool] = True


class Deferred:
    """A scalar still on the device: ``float()`` of it waits for the device (a host sync), once.

    The step's loss and gradient norm are handed on as ``Deferred`` values so that nothing reads them
    before a logged step needs them (``metrics.record`` converts only then).
    """

    __slots__ = ("_divisor", "_tensor", "_value")

    def __init__(self, tensor: torch.Tensor, divisor: int = 1) -> None:
        self._tensor: torch.Tensor | None = tensor
        self._divisor = divisor
        self._value = 0.0

    def __float__(self) -> float:
        if self._tensor is not None:
            self._value = self._tensor.item() / self._divisor
            self._tensor = None
        return self._value


class StepResult:
    """What one optimizer step produced (global values, identical on every rank).

    ``loss_value`` and ``grad_norm_value`` stay on the device until read (see :class:`Deferred`);
    ``loss`` and ``grad_norm`` read them. ``extra`` holds model-specific figures of the step (a mixture of
    experts' ``aux_loss`` and expert load), device values too, read on logged steps only.
    """

    __slots__ = ("extra", "grad_norm_value", "loss_value", "lr", "step", "tokens")

    def __init__(
        self,
        step: int,
        loss: SupportsFloat,
        grad_norm: SupportsFloat,
        lr: float,
        tokens: int,
        extra: Mapping[str, SupportsFloat] | None = None,
    ) -> None:
        self.step, self.lr, self.tokens = step, lr, tokens
        self.loss_value, self.grad_norm_value = loss, grad_norm
        self.extra: dict[str, SupportsFloat] = dict(extra or {})

    @property
    def loss(self) -> float:
        """The step's loss (the module docstring says how micro-batches and ranks are weighted)."""
        return float(self.loss_value)

    @property
    def grad_norm(self) -> float:
        """The global gradient L2 norm before clipping."""
        return float(self.grad_norm_value)

    def __repr__(self) -> str:
        return f"StepResult(step={self.step}, loss={self.loss:.6f}, grad_norm={self.grad_norm:.4f})"


class _TrainState:
    """Trainer counters saved in checkpoints beside model, optimizer and data (rank-local, JSON)."""

    def __init__(self) -> None:
        self.tokens_seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tokens_seen = int(state.get("tokens_seen", 0))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """Trains the model of a ``TrainerConfig``; ``LLMTrainer`` and ``VLTrainer`` say how a batch is fed.

    ``Trainer(cfg)`` builds everything (see the module docstring for the order) and resumes from the newest
    complete checkpoint when checkpointing is enabled; ``train()`` runs to ``max_steps`` (see
    :meth:`_build_length`). Under
    torchrun every rank constructs its own trainer from the same config.
    """

    #: Which trainer this is, for the rules that depend on it (:func:`.rules.trainer_issues`); None: any.
    kind: ClassVar[rules.TrainerKind | None] = None

    def __init__(self, config: TrainerConfig, *, stream: TextIO | None = None) -> None:
        self.config = config
        #: What the trainer is doing now, named by a :class:`CollectiveError` if a collective fails in it.
        self.phase = "start-up"
        self._timeout_field = "init_timeout_seconds"  # the comm field bounding collectives now
        try:
            self._build(config, stream)
        except RuntimeError as exc:
            error = self._peer_error(exc)
            if error is None:
                raise
            raise error from exc

    def _build(self, config: TrainerConfig, stream: TextIO | None) -> None:
        """Everything, in the order of the module docstring (``phase`` names the part under way)."""
        # The resolver's rules again, for configs built in Python (the same functions, never a copy).
        _refuse(rules.trainer_issues(config, self.kind, rules.TRAINER_CLASSES))
        validate(config)  # every check a file meets, in one ConfigError (warnings are the launcher's to show)
        self._stream = stream if stream is not None else sys.stdout
        self._stop_signal: int | None = None
        self._ranks_must_agree = False  # several ranks: stop flags are compared (see _stop_check_due)
        self._first_nonfinite: torch.Tensor | None = None  # see _watch_finite
        self.seed = config.run_seed()

        self._build_processes(config)
        self._build_mesh(config)
        # The files the config names, before anything is built: data, weights, then the tokenizer
        # (loaded here: the model's vocabulary must hold its ids). A bad one is an InputFileError, exit 2.
        self.phase = "start-up (the files the config names)"
        check_files(config)
        self.tokenizer = build_tokenizer(config)
        self._build_model_and_training(config)
        self._build_data(config)
        self._build_checkpoint(config)
        self._build_observers(config)
        self.phase = "start-up"

    def _build_processes(self, config: TrainerConfig) -> None:
        """1. The processes (which must agree on the config), the device, determinism."""
        training, debug = config.training, config.debug
        self.env: DistributedEnv = init_distributed(config.comm)
        self._ranks_must_agree = dist.is_initialized()
        self.cpu_threads, self._threads_reason = intra_op_threads(training.cpu_threads)
        torch.set_num_threads(self.cpu_threads)
        self._failed = False  # train() raised: close() then waits on no collective
        self.config_yaml = dump_config(config)
        self.phase = "start-up (the ranks comparing their configs)"
        _refuse_disagreement(config_disagreement(self.config_yaml))
        self.dims = ParallelDims.from_config(config.parallelism, self.env.world_size)
        if self.dims.world_size != self.env.world_size:
            raise TrainingError(
                f"parallelism needs {self.dims.world_size} ranks ({self.dims.describe()}), but "
                f"{self.env.world_size} were launched"
            )
        _refuse(rules.layout_issues(config, {**self.dims.degrees(), "ep": self.dims.ep}))
        self.device = self.env.device
        _seed_everything(self.seed)
        if debug.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=debug.deterministic_warn_only)
        torch.autograd.set_detect_anomaly(debug.detect_anomaly)

    def _build_mesh(self, config: TrainerConfig) -> None:
        """2. The device mesh and this rank's data-parallel coordinates."""
        training = config.training
        self.phase = "start-up (the device mesh)"
        self.mesh = self.dims.build_mesh(self.device.type)
        set_collective_timeout(config.comm.init_timeout_seconds, self.mesh)  # its groups too, until step 1
        # Stop flags are host values compared over gloo (the default group on the CPU): comparing them never
        # waits for an accelerator's queue, so it can run every step.
        self._signal_group = (
            new_group(backend="gloo") if self._ranks_must_agree and self.device.type != "cpu" else None
        )
        self.dp_group = self.dims.dp_group(self.mesh)
        self.dp_rank = self.dims.dp_rank(self.env.rank)
        self.accumulation_steps = training.gradient_accumulation_steps(self.dims.dp_size)

    def _build_model_and_training(self, config: TrainerConfig) -> None:
        """3. The model (under pipeline parallelism: this rank's stages, see ``parallel.pipeline``); 4. its
        optimizer, schedule and loss."""
        training = config.training
        self.pipeline: Pipeline | None = None
        self._parameter_count: int | None = None
        self.phase = "start-up (the model and its weights)"
        self.model = self._build_model()
        self.fsdp = self.pipeline.fsdp if self.pipeline is not None else isinstance(self.model, FSDPModule)
        moe_layers = getattr(self.model, "moe_layers", None)  # mixture-of-experts models expose them
        self._moe_layers: list[Any] = list(moe_layers()) if callable(moe_layers) else []
        self._autocast_dtype = torch_dtype(training.mixed_precision_param)

        self.optimizer = config.optimizer.build(self.model)
        self.loss_fn = config.loss.build()
        self._sum_and_count = self.loss_fn.sum_and_count
        if config.compile.enable and "loss" in config.compile.components:
            self._sum_and_count = torch.compile(
                self._sum_and_count,
                backend=config.compile.backend,
                mode=config.compile.mode,
                fullgraph=config.compile.fullgraph,
            )
        self.ignore_index = int(getattr(config.loss, "ignore_index", -100))
        self.loss_chunking = loss_chunking(config, self.dims.tp, self.dims.pp)
        if self.pipeline is not None:
            self.pipeline.sum_and_count = self._sum_and_count

    def _build_data(self, config: TrainerConfig) -> None:
        """5. The data loader of this rank's share."""
        training = config.training
        self.phase = "start-up (the data)"
        self.data_request = LoaderRequest(
            self.tokenizer,
            self.dp_rank,
            self.dims.dp_size,
            seq_len=training.seq_len,
            micro_batch_size=training.micro_batch_size,
            seed=self.seed,
            ignore_index=self.ignore_index,
            process_group=self._world_group(),
            **self.data_inputs(),
        )
        self.dataloader = config.dataloader.build(self.data_request)
        self._build_length(config)

    def _build_length(self, config: TrainerConfig) -> None:
        """5. The run's length and its schedule: ``max_steps`` is ``training.max_steps``, or with
        ``training.epochs`` the steps that read that many epochs of the loader's samples (the same on every
        rank: every rank's loader counts the whole dataset). The epoch is logged from the loader's samples
        per epoch whenever the loader knows it (None: not logged)."""
        training = config.training
        per_epoch = getattr(self.dataloader, "samples_per_epoch", None)
        self.samples_per_epoch: int | None = int(per_epoch) if per_epoch is not None else None
        if training.max_steps is None and self.samples_per_epoch is None:
            raise TrainingError(
                f"training.epochs: {type(self.dataloader).__qualname__} does not say how many samples an "
                "epoch holds; give training.max_steps instead"
            )
        self.max_steps = training.steps_for(self.samples_per_epoch or 0)
        if training.max_steps is None:
            for path, message in rules.step_warnings(config, self.max_steps, "the steps of training.epochs"):
                self._print(f"warning: {path}: {message}")
        self.lr_scheduler = config.lr_scheduler.build(self.optimizer, self.max_steps)

    def _build_checkpoint(self, config: TrainerConfig) -> None:
        """6. The checkpointer, and the resume (every checkpoint holds the run's config, for export)."""
        self.phase = "start-up (the checkpoint folder and the resume)"
        self.train_state = _TrainState()
        holds_base = config.peft.checkpoint_holds_base(config.model.weights_path)
        self.checkpointer = config.checkpoint.build(
            self.model,
            self.optimizer,
            self.lr_scheduler,
            self.dataloader,
            train_state=self.train_state,
            max_steps=self.max_steps,
            run_config_yaml=self.config_yaml,
            # A LoRA base built again at every start (from model.weights_path, or NF4) is not saved.
            save_frozen=holds_base,
            # ... and every checkpoint names the base it was trained on (base.json), checked on resume.
            base_record=self._base_record(config) if config.model.weights_path or not holds_base else None,
        )
        if config.checkpoint.enable:  # every rank must resume the same step (a shared folder)
            latest = getattr(self.checkpointer, "latest_step", None)
            if latest is not None:
                _refuse_disagreement(step_disagreement(latest(), str(config.checkpoint.folder)))
        try:
            self.step = int(self.checkpointer.load())
        except CheckpointNotResumableError as exc:
            raise TrainingError(str(exc)) from None
        self.resumed_from = self.step

    def _base_record(self, config: TrainerConfig) -> dict[str, Any]:
        """The identity of the base this run built (``checkpoint._base_record``): its weights folder's
        headers and sampled values, or the seed it was drawn from, and its parameter count."""
        from hyper_parallel.components.checkpoint._base_record import base_identity
        from hyper_parallel.models import parameter_count

        spec = config.model
        return base_identity(spec.weights_path, parameters=parameter_count(spec.args), seed=self.seed)

    def _build_observers(self, config: TrainerConfig) -> None:
        """7. Metrics, profiler and validator."""
        debug = config.debug
        self.flops_per_step = self._flops_per_step()
        self.peak_flops, self._peak_source = self._peak_flops()
        self.metrics = config.metrics.build(
            self.env.rank,
            stream=self._stream,
            max_steps=self.max_steps,
            resumed_from=self.step or None,
            peak_flops=self.peak_flops,
        )
        self.profiler = config.profiler.build(self.env.rank)
        self.validator = self._build_validator()
        self._data: Iterator[Mapping[str, torch.Tensor]] | None = None
        if debug.print_config:
            self._print(self.config_yaml.rstrip("\n"))

    # -- building --------------------------------------------------------------------------------------
    def _build_model(self) -> torch.nn.Module:
        cfg = self.config
        spec = cfg.model
        init_device = "meta" if cfg.training.init_device == "meta" else str(self.device)
        model: torch.nn.Module = spec.build_model_fn(spec.args, device=init_device)
        # LoRA: frozen base and adapters, before any parallelism wraps them
        model = cfg.peft.apply(model, spec.args)
        if self.dims.pp > 1:  # the whole model is only copied from: each stage is cut from it
            from hyper_parallel.parallel.pipeline import build_pipeline

            assert self.mesh is not None
            self._parameter_count = sum(p.numel() for p in model.parameters())
            dtypes = {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
            self.pipeline = build_pipeline(
                model,
                cfg.parallelism,
                self.mesh,
                self.device,
                lambda stage, parallelism: self._prepare_model(stage, parallelism, expected=dtypes),
            )
            return self.pipeline.model
        model = self._prepare_model(model, cfg.parallelism)
        if model_device(model) != self.device:
            model.to(self.device)
        model.train()
        return model

    def _prepare_model(
        self,
        model: torch.nn.Module,
        parallelism: ParallelismConfig,
        expected: Mapping[str, torch.dtype] | None = None,
    ) -> torch.nn.Module:
        """The model's ``parallelize_fn``, then its weights (``expected``: those of the whole model)."""
        from hyper_parallel.models import initialize, load_pretrained, materialize

        cfg = self.config
        spec, training = cfg.model, cfg.training
        model = spec.parallelize_fn(
            model,
            parallelism,
            self.mesh,
            training=training,
            activation_checkpoint=cfg.activation_checkpoint,
            compile=cfg.compile,
        )
        if spec.weights_path is not None:  # allocates a meta model first
            load_pretrained(model, spec, device=self.device, expected=expected)
        elif training.init_device == "meta":
            materialize(model, spec, device=self.device, seed=self.seed)
        else:  # the same weights as from meta: each parameter drawn from (seed, its name)
            initialize(model, spec, seed=self.seed)
        # LoRA: adapters drawn, the frozen base stored as the method holds it (full fine-tuning: nothing)
        cfg.peft.after_load(model, spec.args, seed=self.seed, compute_dtype=training.mixed_precision_param)
        return model

    def _build_validator(self) -> Any:
        cfg = self.config
        if not cfg.validator.enable:
            return None
        build_loader = getattr(cfg.validator, "build_dataloader", None)
        if build_loader is None:
            raise TrainingError(f"{type(cfg.validator).__qualname__} has no validation data to build")
        # The validator feeds the model tokens only, so its request carries no image layout.
        loader = build_loader(attrs.evolve(self.data_request, vision=None, image_token_id=None))
        return cfg.validator.build(loader, self.loss_fn, process_group=self.dp_group)

    def _flops_per_step(self) -> float | None:
        """Model FLOPs of one optimizer step on this rank: the preflight's count per token, never recounted.

        The whole step's tokens times the FLOPs per token (forward and backward, in TorchTitan's convention:
        ``hyper_parallel.preflight.flops``), shared
        evenly by the ranks (data, tensor and pipeline parallelism each divide the work); None when the
        model's arguments offer no cost model.
        """
        from hyper_parallel.preflight.estimate import model_costs

        costs = model_costs(self.config)
        if costs is None:
            return None
        training = self.config.training
        per_token = costs.flop_count(training.seq_len).total
        return float(per_token) * training.global_batch_size * training.seq_len / self.env.world_size

    def _peak_flops(self) -> tuple[float | None, str]:
        """The device's dense peak FLOP/s in the compute dtype, and where the figure comes from."""
        from hyper_parallel.preflight.devices import peak_flops

        training = self.config.training
        if training.peak_tflops is not None:
            return training.peak_tflops * 1e12, "training.peak_tflops"
        kind = self.device.type
        if kind == "cpu":
            return None, "a CPU has no table peak; training.peak_tflops gives one"
        module = getattr(torch, kind, None)
        name = str(module.get_device_name(self.device)) if module is not None else kind
        peak = peak_flops(name, training.mixed_precision_param)
        if peak is None:
            return None, f"{name} is not in the preflight's device table; training.peak_tflops gives it"
        return peak, f"{name}, {training.mixed_precision_param}"

    def _data_tokens(self, step: int) -> dict[str, int] | None:
        """Tokens each data source has supplied so far, on logging steps (None on the others)."""
        count = getattr(self.dataloader, "data_tokens", None)
        if count is None or not self.metrics.should_log(step):
            return None
        return dict(count()) or None

    @staticmethod
    def _world_group() -> Any:
        """Every rank: they share the work of tokenising the corpus (each needs all of it)."""
        return dist.group.WORLD if dist.is_initialized() else None

    def data_inputs(self) -> dict[str, Any]:
        """The model's input layout in the data-loader request (``LoaderRequest`` fields); none here."""
        return {}

    # -- one step --------------------------------------------------------------------------------------
    def forward(self, batch: Mapping[str, torch.Tensor], head: Any = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` of one micro-batch (subclasses say which inputs the model takes);
        with ``head``, what the model's forward returns from it in place of the output projection."""
        raise NotImplementedError

    def micro_batch_loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed loss of one micro-batch and its counted tokens: the model's logits, then the loss; or,
        with the fused loss (``loss.chunk_tokens``, ``components/loss/chunking.py``), the model's forward
        handing its final hidden states and output weight to it, chunk by chunk."""
        chunk = self.loss_chunking.tokens
        if chunk:
            from hyper_parallel.components.loss._chunked import ChunkedLinearCrossEntropy

            head = ChunkedLinearCrossEntropy(self.loss_fn, batch["labels"], chunk)
            with self.autocast():
                total = self.forward(batch, head=head)
            return total, self.loss_fn.count_tokens(batch["labels"])
        with self.autocast():
            logits = self.forward(batch)
        total, count = self._sum_and_count(logits, batch["labels"])
        return total, count

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context the model computes in, training and validating alike: ``torch.autocast`` to
        ``training.mixed_precision_param`` without FSDP2 (which applies it through its policy), else none.
        A LoRA base stored in bf16 (or QLoRA's) meets float32 adapters only under it."""
        if self.fsdp or self._autocast_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def host_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        """Inputs read from ``batch`` while it is still in host memory (none here; see the subclasses).

        The loader builds batches on the host, so reading them waits for nothing; read after the move,
        the same values would stall the device's queue every step. Each returned entry replaces the
        batch's entry of that name and is not moved: a subclass places it where the model uses it; an
        entry of None removes it from the batch.
        """
        return {}

    def _next_micro_batches(self, documents: _RowDocuments | None = None) -> list[Mapping[str, torch.Tensor]]:
        """The step's micro-batches on the device; ``documents`` counts their rows' documents on the host."""
        if self._data is None:
            self._data = iter(self.dataloader)
        batches: list[Mapping[str, torch.Tensor]] = []
        for _ in range(self.accumulation_steps):
            batch = next(self._data)
            if documents is not None:
                documents.add(batch.get("document_ids"))
            host = self.host_inputs(batch)
            moved = {k: v.to(self.device, non_blocking=True) for k, v in batch.items() if k not in host}
            batches.append({**moved, **{k: v for k, v in host.items() if v is not None}})
        return batches

    def _all_reduce(self, value: torch.Tensor, op: Any = None) -> torch.Tensor:
        if self.dp_group is not None:
            dist.all_reduce(value, op=op or dist.ReduceOp.SUM, group=self.dp_group)
        return value

    def train_step(self) -> StepResult:
        """One optimizer step: accumulate, reduce, clip, step the optimizer and the schedule."""
        step = self.step + 1
        clock = _StepClock(self.device, self.metrics.should_log(step))
        documents = _RowDocuments() if clock.on else None
        batches = self._next_micro_batches(documents)
        clock.mark("data")
        token_weighted = getattr(self.config.loss, "reduction", "sum") == "sum"
        local_tokens = torch.zeros((), dtype=torch.float64, device=self.device)
        for batch in batches:
            local_tokens += self.loss_fn.count_tokens(batch["labels"])
        clock.mark("fwd_bwd")
        # Stays on the device: a token-weighted loss divides by it there (no host sync).
        global_tokens = self._all_reduce(local_tokens).to(torch.float32).clamp(min=1.0)
        clock.mark("comm")
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        moe = _MoEStep(self) if self._moe_layers else None
        for index, batch in enumerate(batches if self.pipeline is None else ()):
            last = index == len(batches) - 1
            if self.fsdp and len(batches) > 1:
                self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
            total, count = self.micro_batch_loss(batch)
            if token_weighted:
                loss = total * self.dims.dp_size / global_tokens
            else:
                loss = total / count.clamp(min=1) / len(batches)
            if moe is not None:  # the load-balancing loss, added as transformers adds it (per micro-batch)
                loss = loss + moe.balance_loss(len(batches))
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += loss.detach().float()
        if self.pipeline is not None:
            loss_sum = self._pipeline_steps(batches, token_weighted, global_tokens)
        clock.mark("fwd_bwd")
        loss_tensor = self._all_reduce(loss_sum, dist.ReduceOp.SUM)
        clock.mark("comm")
        max_norm = self.config.training.max_grad_norm
        if self.pipeline is not None:
            from hyper_parallel.parallel.pipeline import clip_grad_norm

            grad_norm = clip_grad_norm(
                self.model.parameters(), max_norm if max_norm is not None else math.inf, self.pipeline.group
            )
        elif self.dims.ep > 1:  # the experts' gradients live on their own mesh
            from hyper_parallel.parallel.expert_parallel import clip_grad_norm as clip_with_experts

            grad_norm = clip_with_experts(
                self.model.parameters(), max_norm if max_norm is not None else math.inf
            )
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.model.parameters() if p.grad is not None],
                max_norm if max_norm is not None else math.inf,
                foreach=True,
            )
        norm = _full(grad_norm).detach()  # every rank (a collective under FSDP), read on logged steps only
        if self.config.debug.check_nan_inf:
            self._watch_finite(step, loss_tensor, norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.lr_scheduler.step()
        clock.mark("optimizer")
        self.step = step
        tokens = int(sum(b["input_ids"].numel() for b in batches))
        self.train_state.tokens_seen += tokens
        figures: dict[str, SupportsFloat] = dict(moe.figures()) if moe is not None else {}
        figures.update(clock.figures(with_comm=self.dp_group is not None))
        if documents is not None and documents.rows:
            figures["documents_per_row"] = documents.segments / documents.rows
        if self.samples_per_epoch is not None:  # from the step alone: the same after a resume
            figures["epoch"] = self.config.training.epochs_at(step, self.samples_per_epoch)
        return StepResult(step, Deferred(loss_tensor, self.dims.dp_size), Deferred(norm), lr, tokens, figures)

    # -- finite or stop --------------------------------------------------------------------------------
    def _watch_finite(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Remember, on the device, the first step whose loss or gradient norm is not finite.

        No host sync: ``_first_nonfinite`` holds ``[step, 0 (the loss) or 1 (the gradient norm), value]``
        of the first such step, step 0 while every value was finite; :meth:`_check_finite` reads it on
        logged steps and before every save. Both values are global (identical on every rank), so every
        rank stops at the same step.
        """
        loss = loss.detach().to(torch.float64).reshape(())
        norm = grad_norm.detach().to(device=loss.device, dtype=torch.float64).reshape(())
        loss_bad = ~torch.isfinite(loss)
        bad = loss_bad | ~torch.isfinite(norm)
        found = torch.stack(
            (torch.full_like(loss, step), (~loss_bad).to(torch.float64), torch.where(loss_bad, loss, norm))
        )
        first = self._first_nonfinite
        if first is None:
            first = torch.zeros(3, dtype=torch.float64, device=loss.device)
        self._first_nonfinite = torch.where(bad & (first[0] == 0), found, first)

    def _check_finite(self) -> None:
        """Raise :class:`NonFiniteError` naming the first non-finite step seen (one read of the device)."""
        if self._first_nonfinite is None:
            return
        step, what, value = self._first_nonfinite.tolist()
        if step:
            raise NonFiniteError(int(step), "the loss" if what == 0 else "the gradient norm", value)

    def _must_check_finite(self, last_step: bool) -> bool:
        """Whether the loop reads the non-finite flag now: logged steps, the last step, before a save."""
        if not self.config.debug.check_nan_inf:
            return False
        return (
            last_step
            or self.step % self.config.metrics.log_freq == 0
            or self.checkpointer.should_save(self.step, last_step=last_step)
        )

    def _pipeline_steps(
        self, batches: list[Mapping[str, torch.Tensor]], token_weighted: bool, global_tokens: torch.Tensor
    ) -> torch.Tensor:
        """One pipeline step per micro-batch; the loss of the step, known on every pipeline rank.

        Each micro-batch's loss is weighted as in the unpipelined step: by ``dp / global tokens`` (sum)
        or ``1 / (its tokens x micro-batches)`` (mean), so gradients and the logged loss are the same. The
        weights stay on the device (no host sync).
        """
        assert self.pipeline is not None
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        for batch in batches:
            if token_weighted:
                weight = self.dims.dp_size / global_tokens
            else:
                count = self.loss_fn.count_tokens(batch["labels"]).to(torch.float32).clamp(min=1.0)
                weight = 1.0 / count / len(batches)
            with self.autocast():
                loss_sum += self.pipeline.step(batch, weight)
        return self.pipeline.sum_over_stages(loss_sum)

    # -- the loop --------------------------------------------------------------------------------------
    def train(self) -> list[StepResult]:
        """Train from the current step to ``max_steps``; returns this run's step results.

        SIGTERM or SIGINT finishes the current step (or the current batch of a validation pass, which
        then reports nothing), saves a checkpoint (when enabled) and returns early; ``stopped_by_signal``
        then names the signal. A second SIGINT exits the process at once with status 130. A collective
        cut short by another rank (a timeout, a lost connection) raises :class:`CollectiveError`. A run
        whose checkpoint is already at ``max_steps`` trains nothing. With ``debug.check_nan_inf``, a
        non-finite loss or gradient norm raises :class:`NonFiniteError` (naming its first step) on the next
        logged step (``metrics.log_freq``), the last step or before the next save, whichever comes first:
        nothing after it is saved.
        """
        cfg = self.config
        max_steps = self.max_steps
        results: list[StepResult] = []
        self._banner()
        self._collapse = _CollapseWatch()
        gc_freq = cfg.training.gc_freq
        if gc_freq is not None:
            gc.disable()
            gc.collect()
        previous = self._install_signal_handlers()
        first = True
        try:
            with self.profiler as profiler:
                while self.step < max_steps:
                    started = time.perf_counter()
                    self.phase = f"step {self.step + 1}"
                    result = self.train_step()
                    results.append(result)
                    if first:
                        set_collective_timeout(cfg.comm.train_timeout_seconds, self.mesh)
                        self._timeout_field = "train_timeout_seconds"
                        first = False
                    record = self.metrics.record(
                        result.step,
                        loss=result.loss_value,
                        lr=result.lr,
                        grad_norm=result.grad_norm_value,
                        num_tokens=result.tokens,
                        flops=self.flops_per_step,
                        step_time=time.perf_counter() - started,
                        data_tokens=self._data_tokens(result.step),
                        **result.extra,
                    )
                    if record is not None:
                        for line in self._collapse.warnings(record):
                            self._print(line)
                    profiler.step()
                    if self._must_check_finite(self.step == max_steps):
                        self._check_finite()  # never validate, save or prune after a non-finite step
                    # Before validation and between its batches: a stop signal saves within one step (or
                    # one validation batch) plus the save (a scheduler's grace period is often 30 s).
                    self.phase = f"the stop-signal check after step {self.step}"
                    if self._stop_check_due(self.step == max_steps) and self._should_stop():
                        self._save_on_signal()
                        break
                    if self.validator is not None and self.validator.should_validate(self.step):
                        self.phase = f"validation at step {self.step}"
                        with self.autocast():
                            report = self.validator.validate(self.model, self.step, stop=self._should_stop)
                        if report is None:  # cut short by a stop signal: nothing to log
                            self._save_on_signal()
                            break
                        self.metrics.log_validation(self.step, report)
                    if gc_freq is not None and self.step % gc_freq == 0:
                        gc.collect(1)
                    self.phase = f"the checkpoint save of step {self.step}"
                    self.checkpointer.maybe_save(self.step, last_step=self.step == max_steps)
            self.phase = "the last checkpoint save"
            self.checkpointer.close()
        except BaseException as exc:
            self._failed = True
            error = self._peer_error(exc)
            if error is None:
                raise
            raise error from exc
        finally:
            self._restore_signal_handlers(previous)
            if gc_freq is not None:
                gc.enable()
        self._farewell(results)
        return results

    @property
    def stopped_by_signal(self) -> str | None:
        """``SIGTERM``/``SIGINT`` when a signal stopped ``train()`` early, else None."""
        return None if self._stop_signal is None else signal.Signals(self._stop_signal).name

    def close(self, *, destroy_process_group: bool = True) -> None:
        """Finish checkpoint writes, close metric files and (by default) the process group.

        After ``train()`` raised, another rank may have stopped, so nothing here waits on a collective: a
        save in flight is abandoned (never published) and the group is destroyed without a barrier.
        """
        failed = self._failed
        if failed:
            self.checkpointer.close(abandon=True)
        else:
            self.phase = "the last checkpoint save"
            self.checkpointer.close()
        self.metrics.close()
        if destroy_process_group:
            self.phase = "the final barrier"
            try:
                shutdown(wait=not failed)
            except RuntimeError as exc:
                error = self._peer_error(exc)
                if error is None:
                    raise
                raise error from exc

    def _peer_error(self, exc: BaseException) -> CollectiveError | None:
        """``exc`` as a one-line :class:`CollectiveError` when another rank cut a collective short."""
        failure = None if isinstance(exc, TrainingError) else peer_failure(exc)
        if failure is None:
            return None
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0") or 0)
        field = self._timeout_field
        what = "timed out" if failure.timed_out else "lost its connection to another rank"
        return CollectiveError(
            f"rank {rank}: {self.phase}: {failure.collective} {what} "
            f"(comm.{field} = {getattr(self.config.comm, field)}): another rank stopped or is stalled"
        )

    # -- signals ---------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> dict[int, Any]:
        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT and self._stop_signal is not None:
                # A second Ctrl-C: the person wants out now, even mid-save. A save cut short is never
                # published (its partial folder is removed at the next start), so resuming stays safe.
                sys.stderr.write(
                    "SIGINT again: exiting now; a checkpoint being saved is incomplete and the next start "
                    "ignores it\n"
                )
                sys.stderr.flush()
                os._exit(130)
            self._stop_signal = signum

        previous: dict[int, Any] = {}
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, handler)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: Mapping[int, Any]) -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    def _stop_check_due(self, last_step: bool) -> bool:
        """Whether the ranks compare stop flags after this step (a host-side gloo collective).

        One process reads its own flag every step (free). Several ranks compare every
        ``training.signal_check_freq`` steps (default 1: a stop signal saves within one step) and on the
        logged, validation, checkpoint and last steps. The flags are host values compared over gloo, so a
        comparison waits for the slowest rank's host, never for a device's queue.
        """
        if not self._ranks_must_agree:
            return True
        step = self.step
        return (
            last_step
            or step % self.config.training.signal_check_freq == 0
            or step % self.config.metrics.log_freq == 0
            or self.checkpointer.should_save(step, last_step=last_step)
            or (self.validator is not None and self.validator.should_validate(step))
        )

    def _should_stop(self) -> bool:
        """Whether any rank received a stop signal (every rank must stop after the same step)."""
        if not self._ranks_must_agree:  # one process: its own flag, nothing to wait for
            return self._stop_signal is not None
        flag = torch.tensor([self._stop_signal or 0], dtype=torch.int64)  # on the host: no device sync
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._signal_group)
        if int(flag.item()) and self._stop_signal is None:
            self._stop_signal = int(flag.item())
        return bool(flag.item())

    def _save_on_signal(self) -> None:
        if self.config.debug.check_nan_inf:
            self._check_finite()
        saved = self.config.checkpoint.enable
        if saved:
            self.phase = f"the checkpoint save of step {self.step} ({self.stopped_by_signal})"
            self.checkpointer.save(self.step)
        self._print(
            f"{self.stopped_by_signal}: stopped after step {self.step}; "
            + ("checkpoint saved, relaunch the same command to resume" if saved else "checkpointing is off")
        )

    # -- what a person sees ----------------------------------------------------------------------------
    def _print(self, text: str) -> None:
        if self.env.is_main:
            metrics = getattr(self, "metrics", None)  # built last: earlier lines have no bar to clear
            if metrics is not None:
                metrics.clear_progress()
            print(text, file=self._stream, flush=True)

    def parameter_count(self) -> int:
        """Parameters of the whole (unsharded) model (every pipeline stage's, under pipelining)."""
        if self._parameter_count is not None:
            return self._parameter_count
        return sum(p.numel() for p in self.model.parameters())

    def _banner(self) -> None:
        cfg, training = self.config, self.config.training
        backend = self.env.backend or "no process group"
        resumed = f", resuming at step {self.step}" if self.step else ""
        self._print(
            f"hyper_parallel: {cfg.model.title()}, {self.parameter_count() / 1e6:.2f}M "
            f"parameters; {self.env.world_size} rank(s) [{self.dims.describe()}] on {self.device.type} "
            f"({backend}); global batch {training.global_batch_size} = micro {training.micro_batch_size} "
            f"x accumulation {self.accumulation_steps} x dp {self.dims.dp_size}; seq_len {training.seq_len}; "
            f"{counted(self.max_steps, 'step')}{self._length_note()}{resumed}"
        )
        peak = self.peak_flops
        mfu = (
            f"mfu against {peak / 1e12:.4g} TFLOP/s per device ({self._peak_source})"
            if peak is not None
            else f"mfu not computed ({self._peak_source})"
        )
        if self.flops_per_step is not None:
            from hyper_parallel.preflight.flops import CONVENTION

            mfu += f"; tflops and mfu count {CONVENTION}"
        self._print(
            f"hyper_parallel: {self.cpu_threads} cpu thread(s) per rank ({self._threads_reason}); {mfu}"
        )
        chunking = self.loss_chunking
        self._print(
            f"hyper_parallel: loss fused with the output projection, {chunking.tokens} tokens of logits at a "
            f"time ({chunking.reason})"
            if chunking.tokens
            else f"hyper_parallel: loss over the whole logits ({chunking.reason})"
        )
        loaded = getattr(self.checkpointer, "loaded", None)
        if loaded is not None:
            self._print(f"hyper_parallel: {loaded}")

    def _length_note(self) -> str:
        """How the step count and the epochs relate (`` (2 epochs of 300 samples)``), when the loader says."""
        training, per_epoch = self.config.training, self.samples_per_epoch
        if per_epoch is None:
            return ""
        if training.epochs is not None:
            return f" ({counted(training.epochs, 'epoch')} of {counted(per_epoch, 'sample')})"
        return (
            f" ({training.epochs_at(self.max_steps, per_epoch):.3g} epochs of {counted(per_epoch, 'sample')})"
        )

    def _farewell(self, results: list[StepResult]) -> None:
        if not results:
            self._print(f"nothing to train: already at step {self.step} of {self.max_steps}")
            return
        self._print(
            f"done: step {self.step}, final loss {results[-1].loss:.4f} (step {self.step}'s own; the logged "
            "loss is the mean over the steps since the previous log line)"
        )


class _MoEStep:
    """The load-balancing loss of each micro-batch of one step, and the step's figures for the log.

    After each forward the MoE layers hold their routing statistics; the loss of the micro-batch
    (``parallel.expert_parallel.load_balancing_loss``) is weighted by ``router_aux_loss_coef`` over the
    micro-batches of the step and, like the language-model loss, averaged over data-parallel ranks by FSDP.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.coef = float(getattr(trainer.config.model.args, "router_aux_loss_coef", 0.0))
        self.values: list[torch.Tensor] = []  # on the device: read on logged steps only
        self.counts: torch.Tensor | None = None

    def balance_loss(self, micro_batches: int) -> torch.Tensor:
        from hyper_parallel.parallel.expert_parallel import load_balancing_loss

        stats = [layer.stats for layer in self.trainer._moe_layers]
        for layer in self.trainer._moe_layers:
            layer.stats = None  # a later forward without statistics must not reuse these
        balance = load_balancing_loss(
            [s.counts for s in stats], [s.prob_sums for s in stats], stats[0].tokens, self.trainer.dp_group
        )
        self.values.append(balance.value.detach())
        self.counts = balance.counts if self.counts is None else self.counts + balance.counts
        weight = self.coef / micro_batches
        return balance.local * weight

    def figures(self) -> dict[str, torch.Tensor]:
        """``aux_loss`` (mean over micro-batches) and the tokens per expert of the step: the largest and
        the mean over every MoE layer's experts (all data-parallel ranks), and per layer ``L``
        ``expert_load/L/max``, ``/min``, ``/cv`` (the coefficient of variation: standard deviation over
        mean) and ``/top_share`` (the share of the layer's tokens its busiest expert received: 1 when every
        token goes there). Device values, so that the step waits for nothing; the metrics read them on
        logged steps."""
        if self.counts is None:
            return {}
        counts = self.counts.float()  # (layers, experts)
        figures = {
            "aux_loss": torch.stack(self.values).float().mean(),
            "expert_load_max": counts.max(),
            "expert_load_mean": counts.mean(),
        }
        top_k = int(getattr(self.trainer.config.model.args, "n_experts_per_token", 1))
        highest, lowest = counts.max(dim=1).values, counts.min(dim=1).values
        mean = counts.mean(dim=1).clamp(min=1e-12)
        cv = counts.std(dim=1, unbiased=False) / mean
        share = highest * top_k / counts.sum(dim=1).clamp(min=1e-12)
        for layer in range(counts.shape[0]):
            figures[f"expert_load/{layer}/max"] = highest[layer]
            figures[f"expert_load/{layer}/min"] = lowest[layer]
            figures[f"expert_load/{layer}/cv"] = cv[layer]
            figures[f"expert_load/{layer}/top_share"] = share[layer]
        return figures


#: A layer's routing has collapsed when its busiest expert receives at least this share of its tokens ...
COLLAPSE_SHARE = 0.9
#: ... on this many logged steps in a row.
COLLAPSE_LOGS = 3


class _CollapseWatch:
    """Warns, once per layer, when a mixture-of-experts layer sends (nearly) every token to one expert.

    Read from the logged records (``expert_load/L/top_share``), so it costs nothing on other steps: a
    layer whose busiest expert gets at least :data:`COLLAPSE_SHARE` of its tokens on :data:`COLLAPSE_LOGS`
    logged steps in a row is named with its counts, and the remedy.
    """

    def __init__(self) -> None:
        self.runs: dict[int, int] = {}
        self.warned: set[int] = set()

    def warnings(self, record: Mapping[str, Any]) -> list[str]:
        found = []
        for key, value in record.items():
            if not (key.startswith("expert_load/") and key.endswith("/top_share")):
                continue
            layer = int(key.split("/")[1])
            self.runs[layer] = self.runs.get(layer, 0) + 1 if float(value) >= COLLAPSE_SHARE else 0
            if self.runs[layer] >= COLLAPSE_LOGS and layer not in self.warned:
                self.warned.add(layer)
                found.append(
                    f"warning: step {record['step']}: MoE layer {layer}'s routing collapsed: its busiest "
                    f"expert received {float(value):.0%} of the layer's tokens on {COLLAPSE_LOGS} logged "
                    f"steps in a row (load max {float(record[f'expert_load/{layer}/max']):.0f}, min "
                    f"{float(record[f'expert_load/{layer}/min']):.0f}); raise "
                    "model.overrides.router_aux_loss_coef or lower optimizer.lr"
                )
        return found


def _refuse_disagreement(message: str | None) -> None:
    if message is not None:
        raise RanksDisagreeError(message)


def _refuse(issues: Iterator[tuple[str, str]]) -> None:
    """Raise a :class:`TrainingError` naming every issue, if there is any."""
    found = list(issues)
    if found:
        raise TrainingError("; ".join(f"{path}: {message}" for path, message in found))


def _wait_for_device(device: torch.device) -> None:
    """Block until ``device`` has run the work queued so far (a no-op on the CPU, which runs it inline)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


class _RowDocuments:
    """How many documents the rows of a logged step hold (``documents_per_row`` in its record).

    Counted from the ``document_ids`` the loader built on the host (so nothing waits for the device), on
    logged steps only, over this rank's rows: a row holds one document more than the places where its id
    changes (a document cut by the row's edge counts as one; a chat row's padding as one). Packing is what
    the figure measures: at 1 every row is one document (or a window of one), and document masking
    changes nothing but the attention kernel. Batches without ids (masking off) count nothing.
    """

    __slots__ = ("rows", "segments")

    def __init__(self) -> None:
        self.rows = self.segments = 0

    def add(self, ids: torch.Tensor | None) -> None:
        if ids is None or ids.dim() != 2 or ids.device.type != "cpu":
            return
        host = ids.numpy()  # the loader's own array: counting it reads nothing from a device
        self.rows += host.shape[0]
        self.segments += host.shape[0] + int(np.count_nonzero(host[:, 1:] != host[:, :-1]))


class _StepClock:
    """Where one step's time goes: data wait, forward and backward, optimizer, exposed communication.

    Timed on logged steps only: each mark waits for the device there (so a phase holds its device work,
    not only the launches), and on every other step a mark does nothing at all, so unlogged steps never
    wait for the device. The time between two marks goes to the phase the second one names. ``comm`` is
    the time the step spends blocked in the trainer's own collectives (the token and loss all-reduces):
    communication nothing overlaps; FSDP's gathers and reductions run inside forward and backward and
    count there, the gradient-norm reduction inside ``optimizer``.
    """

    __slots__ = ("_device", "_last", "_start", "on", "times")

    def __init__(self, device: torch.device, on: bool) -> None:
        self.on, self._device = on, device
        self.times: dict[str, float] = {}
        self._start = self._last = time.perf_counter() if on else 0.0

    def mark(self, phase: str) -> None:
        if not self.on:
            return
        _wait_for_device(self._device)
        now = time.perf_counter()
        self.times[phase] = self.times.get(phase, 0.0) + now - self._last
        self._last = now

    def figures(self, with_comm: bool) -> dict[str, float]:
        """``time_data``, ``time_fwd_bwd``, ``time_optimizer`` (and ``time_comm`` under a process group),
        and ``time_step``, the whole step from its start to the last mark; empty when not timed."""
        if not self.on:
            return {}
        phases = ("data", "fwd_bwd", "optimizer", *(("comm",) if with_comm else ()))
        figures = {f"time_{phase}": self.times.get(phase, 0.0) for phase in phases}
        figures["time_step"] = self._last - self._start
        return figures


def _full(value: torch.Tensor) -> torch.Tensor:
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


def model_device(model: torch.nn.Module) -> torch.device:
    """Device of the model's first parameter (CPU for a model without parameters)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")
