"""Tensor-parallel plan of the Llama 3 module and its parallelize pipeline (imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hyper_parallel.models.llama3._modules import Llama3Model
from hyper_parallel.parallel.parallelize import parallelize_model

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["apply_tp", "parallelize_llama3"]


def apply_tp(model: Llama3Model, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP: column-parallel q/k/v and w1/w3, row-parallel wo and w2 (heads split).

    With ``sequence_parallel`` the residual stream between blocks and the norms are sharded along the
    sequence; the output projection gathers full logits on every rank.
    """
    if model.args.n_heads % tp_mesh.size() or (model.args.n_kv_heads or model.args.n_heads) % tp_mesh.size():
        raise ValueError(f"tp={tp_mesh.size()} must divide n_heads and n_kv_heads")
    residual = Shard(1) if sequence_parallel else Replicate()
    root_plan: dict[str, ParallelStyle] = {}
    if model.args.tie_word_embeddings:
        # One matrix is the embeddings and the output projection: left whole (``parallelize_model``
        # replicates it, tie kept); with sequence parallelism the first block takes its slice of the
        # embeddings and the output projection the gathered sequence.
        if sequence_parallel:
            root_plan["layers.0"] = PrepareModuleInput(
                input_layouts=(Replicate(), None),
                desired_input_layouts=(residual, None),
                use_local_output=True,
            )
            root_plan["output"] = PrepareModuleInput(
                input_layouts=(residual,), desired_input_layouts=(Replicate(),)
            )
    else:
        if model.tok_embeddings is not None:  # a pipeline stage holds only what it owns
            root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
        if model.output is not None:
            root_plan["output"] = ColwiseParallel(
                input_layouts=residual, output_layouts=Replicate(), use_local_output=True
            )
    if sequence_parallel and model.norm is not None:
        root_plan["norm"] = SequenceParallel()
    if root_plan:
        parallelize_module(model, tp_mesh, root_plan)
    if sequence_parallel:
        model.residual_sequence_shards = tp_mesh.size()
    for block in model.layers.values():
        plan: dict[str, ParallelStyle] = {
            "attention": PrepareModuleInput(
                input_layouts=(residual, None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=residual),
            "feed_forward": PrepareModuleInput(
                input_layouts=(residual,), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=residual),
            "feed_forward.w3": ColwiseParallel(),
        }
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)


def parallelize_llama3(
    model: nn.Module,
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh | None,
    *,
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> nn.Module:
    """TP (+SP) -> activation checkpointing -> compile -> FSDP2 over the transformer blocks, in place."""
    if not isinstance(model, Llama3Model):
        raise TypeError(f"expected a Llama3Model, got {type(model).__name__}")
    return parallelize_model(
        model,
        parallelism,
        device_mesh,
        blocks=list(model.layers.values()),
        apply_tp=lambda tp_mesh: apply_tp(model, tp_mesh, parallelism.sequence_parallel),
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )
