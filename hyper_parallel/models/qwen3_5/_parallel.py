"""Tensor parallelism and FSDP2 for the Qwen 3.5 module (imported lazily by ``runtime.parallelize``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hyper_parallel.models._torch_runtime import apply_fsdp, mesh_degrees
from hyper_parallel.models.qwen3_5._modules import Qwen3_5Model
from hyper_parallel.models.qwen3_5._vl import Qwen3_5VLModel

if TYPE_CHECKING:  # annotations only: models sit below the trainer layer and never import it
    from hyper_parallel.trainer.config import ParallelismConfig

__all__ = ["apply_tp", "parallelize_qwen3_5", "parallelize_qwen3_5_vl"]


def apply_tp(model: Qwen3_5Model, tp_mesh: DeviceMesh) -> None:
    """Split the heads of the full-attention blocks and the feed-forward hidden size over ``tp_mesh``.

    Queries/gates, keys and values are column-parallel and the output projection row-parallel; the
    per-head q/k norms see their input as sharded along the head dimension so that their (replicated)
    weights receive gradients summed over all heads. Gated DeltaNet mixers, embeddings, norms and the
    output projection stay replicated: every tp rank computes them on the same replicated activations.
    """
    args = model.args
    size = tp_mesh.size()
    if args.n_heads % size or args.n_kv_heads % size or args.ffn_hidden_dim % size:
        raise ValueError(f"tp={size} must divide n_heads, n_kv_heads and ffn_hidden_dim")
    for block in model.layers:
        plan: dict[str, ParallelStyle] = {
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
        }
        if block.attention is not None:
            plan.update(
                {
                    "attention.wq": ColwiseParallel(),
                    "attention.wk": ColwiseParallel(),
                    "attention.wv": ColwiseParallel(),
                    "attention.wo": RowwiseParallel(),
                    "attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                    "attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                }
            )
        parallelize_module(block, tp_mesh, plan)


def parallelize_qwen3_5(
    model: nn.Module, parallelism: ParallelismConfig, device_mesh: DeviceMesh
) -> nn.Module:
    """Apply TP (``tp`` mesh dimension) then FSDP2 (``dp_shard``, ``dp_replicate``) in place."""
    if not isinstance(model, Qwen3_5Model):
        raise TypeError(f"expected a Qwen3_5Model, got {type(model).__name__}")
    degrees = mesh_degrees(parallelism, device_mesh)
    if degrees["tp"] > 1:
        apply_tp(model, device_mesh["tp"])
    apply_fsdp(model, model.layers, parallelism, device_mesh, degrees)
    return model


def parallelize_qwen3_5_vl(
    model: nn.Module, parallelism: ParallelismConfig, device_mesh: DeviceMesh
) -> nn.Module:
    """TP on the language model; FSDP2 over its blocks, the vision blocks, then the whole model."""
    if not isinstance(model, Qwen3_5VLModel):
        raise TypeError(f"expected a Qwen3_5VLModel, got {type(model).__name__}")
    degrees = mesh_degrees(parallelism, device_mesh)
    if degrees["tp"] > 1:
        apply_tp(model.language_model, device_mesh["tp"])
    blocks = [*model.visual.blocks, *model.language_model.layers]
    apply_fsdp(model, blocks, parallelism, device_mesh, degrees)
    return model
