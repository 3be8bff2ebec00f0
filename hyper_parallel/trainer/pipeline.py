"""Pipeline parallelism in the trainer (``parallelism.pp`` > 1) with ``torch.distributed.pipelining``.

Each pipeline rank builds the whole model (on meta by default), keeps the stages ``pp_schedule`` gives it
(``models._pipeline``: a pruned deep copy per stage, parameter names unchanged), parallelizes each stage
with the model's own ``parallelize_fn`` (TP, activation checkpointing, FSDP2 over ``dp_shard``) and fills
it with the same weights as one process would hold (initialisation from ``(seed, name)``, or the
Hugging Face files rank 0 reads). The schedule runs one pipeline step per training micro-batch, split into
``pp_microbatches`` pipeline micro-batches; the loss function it calls on the last stage returns the
micro-batch's summed token losses times the weight the trainer gives (so ``mean`` and token-weighted
``sum`` reductions are those of one process), and gradients are never rescaled by the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from hyper_parallel.models._pipeline import merge_stages, split_stage, stage_indices, stage_layers

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["Pipeline", "build_pipeline", "clip_grad_norm"]

#: Schedules that place two stages per rank in a V (rank r holds stages r and 2 pp - 1 - r).
_V_SHAPED = ("ZBVZeroBubble",)


class Pipeline:
    """This rank's stages, the schedule that runs them, and the weight of the loss being computed.

    ``model`` holds every stage module of this rank under the whole model's parameter names (for the
    optimizer, clipping and checkpoints); ``parts`` are the stage modules themselves, in stage order.
    """

    def __init__(
        self,
        parts: list[nn.Module],
        stage_ids: list[int],
        num_stages: int,
        group: dist.ProcessGroup,
        schedule_factory: Callable[[Pipeline], Any],
    ) -> None:
        self.parts, self.stage_ids, self.num_stages, self.group = parts, stage_ids, num_stages, group
        self.model = merge_stages(parts)
        self.has_first = 0 in stage_ids
        self.has_last = num_stages - 1 in stage_ids
        self.loss_weight = 1.0
        self.sum_and_count: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None
        self.sum_and_count = None
        self.schedule = schedule_factory(self)

    @property
    def fsdp(self) -> bool:
        """Whether the stages are sharded by FSDP2 (which then owns mixed precision)."""
        return any(isinstance(part, FSDPModule) for part in self.parts)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The schedule's loss of one pipeline micro-batch: its summed token losses times ``loss_weight``."""
        assert self.sum_and_count is not None, "Pipeline.sum_and_count is set by the trainer"
        total, _ = self.sum_and_count(logits, labels)
        return total * self.loss_weight

    def step(self, batch: Mapping[str, torch.Tensor], loss_weight: float) -> torch.Tensor:
        """One pipeline step (forward and backward) over training micro-batch ``batch``.

        Returns the weighted loss of the batch on the rank holding the last stage, zero elsewhere.
        """
        self.loss_weight = loss_weight
        kwargs = {"document_ids": batch["document_ids"]} if "document_ids" in batch else {}
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        target = batch["labels"] if self.has_last else None
        inputs = (batch["input_ids"],) if self.has_first else ()
        self.schedule.step(*inputs, target=target, losses=losses, **kwargs)
        if not losses:
            return torch.zeros((), dtype=torch.float32, device=batch["labels"].device)
        return torch.stack([loss.detach().float() for loss in losses]).sum()

    def sum_over_stages(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the pipeline ranks (in place): a last-stage loss reaches every rank."""
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.group)
        return value


def clip_grad_norm(
    parameters: Iterable[nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Clip to the global L2 norm of the gradients of the whole model, over every pipeline stage.

    The norm of this rank's gradients (full over its FSDP/TP shards) is squared, summed over the pipeline
    ranks and rooted, so every stage scales its gradients by the same factor one process would.
    """
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    full = getattr(norm, "full_tensor", None)
    total = (full() if callable(full) else norm).to(torch.float32)
    if pp_group is not None:
        total = total.square()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_group)
        total = total.sqrt()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def build_pipeline(
    config: TrainerConfig,
    mesh: DeviceMesh,
    device: torch.device,
    seed: int,
) -> tuple[Pipeline, int]:
    """This rank's pipeline (stages parallelized and filled with weights) and the whole model's size.

    The parameter count is of the whole model, before the stages are cut from it.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    from hyper_parallel.models.loading import initialize, load_pretrained, materialize

    spec, training, par = config.model, config.training, config.parallelism
    on_meta = training.init_device == "meta"
    whole: nn.Module = spec.build_model_fn(spec.args, device="meta" if on_meta else str(device))
    parameter_count = sum(p.numel() for p in whole.parameters())
    dtypes = {name: p.dtype for name, p in whole.named_parameters(remove_duplicate=False)}
    pp_mesh = mesh["pp"]
    pp, per_rank = pp_mesh.size(), par.pipeline_stages_per_rank()
    num_stages = pp * per_rank
    ranges = stage_layers(len(getattr(whole, "layers")), num_stages)  # noqa: B009 (any block dict)
    stage_ids = stage_indices(pp_mesh.get_local_rank(), pp, per_rank, v_shape=par.pp_schedule in _V_SHAPED)
    parts: list[nn.Module] = []
    for stage_id in stage_ids:
        last = stage_id == num_stages - 1
        part = split_stage(whole, ranges[stage_id], first=stage_id == 0, last=last)
        reshard = par
        if last and par.fsdp_reshard_after_forward == "default":
            # The last stage runs its backward right after its forward: keep the gathered weights.
            reshard = attrs.evolve(par, fsdp_reshard_after_forward="never")
        part = spec.parallelize_fn(
            part,
            reshard,
            mesh,
            training=training,
            activation_checkpoint=config.activation_checkpoint,
            compile=config.compile,
        )
        if spec.weights_path is not None:
            load_pretrained(part, spec, device=device, expected=dtypes)
        elif on_meta:
            materialize(part, spec, device=device, seed=seed)
        else:
            initialize(part, spec, seed=seed)
        part.to(device)
        part.train()
        parts.append(part)
    del whole
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(part, stage_id, num_stages, device, group=group)
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    schedule_class = get_schedule_class(par.pp_schedule)
    microbatches = par.pipeline_microbatches(pp)

    def schedule(pipeline: Pipeline) -> Any:
        target = stages[0] if issubclass(schedule_class, PipelineScheduleSingle) else stages
        return schedule_class(target, microbatches, loss_fn=pipeline.loss, scale_grads=False)

    return Pipeline(parts, stage_ids, num_stages, group, schedule), parameter_count
