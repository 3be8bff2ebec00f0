"""Pipeline parallelism (``parallelism.pp`` > 1) with ``torch.distributed.pipelining``.

Splitting is TorchTitan's: every stage is a deep copy of the whole (usually meta) model from which the
blocks, embeddings, final norm and output projection the stage does not own are removed. The model keeps
its blocks in an ``nn.ModuleDict`` keyed by index and tolerates ``None`` for the removed top-level modules,
so a stage's parameter names (``layers.3.attention.wq.weight``) are those of the whole model: weight
initialisation from ``(seed, name)``, Hugging Face loading and DCP checkpoints work unchanged.

``build_pipeline`` keeps the stages ``pp_schedule`` gives this rank, has the caller prepare each one (the
trainer parallelizes it with the model's own ``parallelize_fn`` and fills it with the same weights one
process would hold) and builds the schedule. The schedule runs one pipeline step per training micro-batch,
split into ``pp_microbatches`` pipeline micro-batches; the loss function it calls on the last stage returns
the micro-batch's summed token losses times the weight the trainer gives (so ``mean`` and token-weighted
``sum`` reductions are those of one process), and gradients are never rescaled by the schedule.
``clip_grad_norm`` clips to the norm of the whole model, over every stage.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hyper_parallel.sections import ParallelismConfig

__all__ = [
    "Pipeline",
    "build_pipeline",
    "clip_grad_norm",
    "merge_stages",
    "split_stage",
    "stage_indices",
    "stage_layers",
]

#: Schedules that place two stages per rank in a V (rank r holds stages r and 2 pp - 1 - r).
_V_SHAPED = ("ZBVZeroBubble",)


def stage_layers(n_layers: int, num_stages: int) -> list[range]:
    """The block indices of each of ``num_stages`` stages: contiguous, as even as possible, none empty.

    When the blocks do not divide evenly, stages 1, 2 ... get one extra block each: the first stage, which
    also embeds the tokens, and the last, which also projects to the vocabulary, get one last.
    """
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} blocks into {num_stages} non-empty pipeline stages")
    base, extra = divmod(n_layers, num_stages)
    sizes = [base + (1 if 1 <= stage <= extra else 0) for stage in range(num_stages)]
    starts = [sum(sizes[:stage]) for stage in range(num_stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def stage_indices(pp_rank: int, pp: int, stages_per_rank: int, *, v_shape: bool = False) -> list[int]:
    """The stages pipeline rank ``pp_rank`` of ``pp`` holds, in order.

    Looped placement (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble): rank ``r`` holds ``r``,
    ``r + pp``, ``r + 2 pp`` ... V placement (ZBVZeroBubble, two stages per rank): rank ``r`` holds ``r`` and
    ``2 pp - 1 - r``, so the first and last stages share rank 0.
    """
    if v_shape:
        if stages_per_rank != 2:
            raise ValueError(f"a V-shaped schedule holds 2 stages per rank, got {stages_per_rank}")
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + round_ * pp for round_ in range(stages_per_rank)]


def split_stage(
    model: nn.Module,
    layers: range,
    *,
    first: bool,
    last: bool,
    first_modules: Sequence[str] = ("tok_embeddings",),
    last_modules: Sequence[str] = ("norm", "output"),
    blocks: str = "layers",
) -> nn.Module:
    """A deep copy of ``model`` keeping only blocks ``layers`` (of the ``ModuleDict`` ``blocks``), the
    ``first_modules`` when ``first`` and the ``last_modules`` when ``last``; the others become ``None``.

    ``model`` itself is untouched. Parameter names of what is kept are unchanged.
    """
    stage = copy.deepcopy(model)
    held = getattr(stage, blocks)
    if not isinstance(held, nn.ModuleDict):
        raise TypeError(f"{type(model).__name__}.{blocks} must be an nn.ModuleDict keyed by block index")
    keep = {str(index) for index in layers}
    unknown = keep - set(held.keys())
    if unknown:
        raise KeyError(f"{type(model).__name__}.{blocks} has no block(s) {sorted(unknown, key=int)}")
    for key in [key for key in held if key not in keep]:
        del held[key]
    for names, kept in ((first_modules, first), (last_modules, last)):
        if not kept:
            for name in names:
                setattr(stage, name, None)
    return stage


def merge_stages(stages: Sequence[nn.Module], blocks: str = "layers") -> nn.Module:
    """One module holding (not copying) every submodule of ``stages``: this rank's share of the model.

    Its parameter names are those of the whole model (blocks of every stage under one ``ModuleDict``
    ``blocks``), so the optimizer, gradient clipping and DCP checkpoints see one model per rank.
    It has no ``forward``: the pipeline schedule runs the stages.
    """
    children: dict[str, nn.Module] = {}  # in the order the stages name them: the whole model's order
    held: dict[str, nn.Module] = {}
    for stage in stages:
        for name, child in stage.named_children():
            if name == blocks:
                assert isinstance(child, nn.ModuleDict)
                held.update(child.items())
                children.setdefault(name, child)
            elif child is not None:
                children[name] = child
    merged = nn.Module()
    for name, child in children.items():
        if name == blocks:
            child = nn.ModuleDict(dict(sorted(held.items(), key=lambda item: int(item[0]))))
        merged.add_module(name, child)
    return merged


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
        self.loss_weight: float | torch.Tensor = 1.0
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

    def step(self, batch: Mapping[str, torch.Tensor], loss_weight: float | torch.Tensor) -> torch.Tensor:
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


#: Turns one stage (a pruned copy of the whole model) into a trained-ready module: ``(stage, parallelism)``
#: -> the stage parallelized and filled with weights. ``parallelism`` is the run's, adjusted for the stage.
PrepareStage = Callable[[nn.Module, "ParallelismConfig"], nn.Module]


def build_pipeline(
    whole: nn.Module,
    parallelism: ParallelismConfig,
    mesh: DeviceMesh,
    device: torch.device,
    prepare_stage: PrepareStage,
) -> Pipeline:
    """This rank's pipeline: the stages of ``whole`` it holds, each prepared by ``prepare_stage``.

    ``whole`` (usually on meta) is only copied from, never changed; its blocks are split as evenly as
    possible into ``pp x pipeline_stages_per_rank()`` stages (``stage_layers``), placed looped or in a V
    (``stage_indices``). The last stage keeps its gathered FSDP weights between forward and backward when
    ``fsdp_reshard_after_forward`` is ``default`` (it runs its backward right after its forward).
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    pp_mesh = mesh["pp"]
    pp, per_rank = pp_mesh.size(), parallelism.pipeline_stages_per_rank()
    num_stages = pp * per_rank
    ranges = stage_layers(len(getattr(whole, "layers")), num_stages)  # noqa: B009 (any block dict)
    v_shape = parallelism.pp_schedule in _V_SHAPED
    stage_ids = stage_indices(pp_mesh.get_local_rank(), pp, per_rank, v_shape=v_shape)
    parts: list[nn.Module] = []
    for stage_id in stage_ids:
        last = stage_id == num_stages - 1
        part = split_stage(whole, ranges[stage_id], first=stage_id == 0, last=last)
        stage_parallelism = parallelism
        if last and parallelism.fsdp_reshard_after_forward == "default":
            stage_parallelism = attrs.evolve(parallelism, fsdp_reshard_after_forward="never")
        part = prepare_stage(part, stage_parallelism)
        part.to(device)
        part.train()
        parts.append(part)
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(part, stage_id, num_stages, device, group=group)
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    schedule_class = get_schedule_class(parallelism.pp_schedule)
    microbatches = parallelism.pipeline_microbatches(pp)

    def schedule(pipeline: Pipeline) -> Any:
        target = stages[0] if issubclass(schedule_class, PipelineScheduleSingle) else stages
        return schedule_class(target, microbatches, loss_fn=pipeline.loss, scale_grads=False)

    return Pipeline(parts, stage_ids, num_stages, group, schedule)
