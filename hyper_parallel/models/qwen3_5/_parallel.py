"""Tensor-parallel plan of the Qwen 3.5 modules and their parallelize pipelines (imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hyper_parallel.models.qwen3_5._modules import Qwen3_5Model
from hyper_parallel.models.qwen3_5._vl import Qwen3_5VLModel
from hyper_parallel.parallel.parallelize import parallelize_model

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["apply_tp", "parallelize_qwen3_5", "parallelize_qwen3_5_vl"]

#: Gated DeltaNet parameters used directly (not through a submodule), split by channel/head along dim 0.
_DELTANET_SHARDED_PARAMS = ("conv_q", "conv_k", "conv_v", "dt_bias", "A_log")


class _HeadShardedNorm(SequenceParallel):
    """``SequenceParallel`` over the head dimension for a norm taking several inputs (value, gate).

    The (replicated) weight sees every input as a ``DTensor`` sharded along ``sequence_dim``, so its
    gradient is summed over the heads of all ranks; the output goes back to a local tensor.
    """

    @staticmethod
    def _prepare_input_fn(  # type: ignore[override]
        sequence_sharding: tuple[Shard], mod: nn.Module, inputs: tuple[object, ...], device_mesh: DeviceMesh
    ) -> tuple[object, ...]:
        return tuple(
            DTensor.from_local(x, device_mesh, sequence_sharding, run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )


def _shard_deltanet_params(mixer: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard the convolution weights, ``dt_bias`` and ``A_log`` by channel; the forward uses local shards."""
    for name in _DELTANET_SHARDED_PARAMS:
        param = getattr(mixer, name)
        sharded = distribute_tensor(param.data, tp_mesh, [Shard(0)])
        mixer.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))


def apply_tp(model: Qwen3_5Model, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Split the heads of both kinds of token mixer and the feed-forward hidden size over ``tp_mesh``.

    Full attention: queries/gates, keys and values are column-parallel and the output projection
    row-parallel; the per-head q/k norms see their input as sharded along the head dimension so that
    their (replicated) weights receive gradients summed over all heads. The sigmoid output gate comes out
    of ``wq`` with its query head, so each rank gates its own heads before ``wo``.

    Gated DeltaNet: the q, k, v, z, b and a projections are column-parallel, so each rank holds a
    contiguous block of key heads and the value heads that use them (value head ``j`` reads key head
    ``j // (n_v_heads / n_k_heads)``); the depthwise convolution weights, ``dt_bias`` and ``A_log``
    are sharded by the same channels and used as local shards, so the convolution and the per-head
    recurrence run locally; the gated RMSNorm over ``head_dim`` is replicated (like the q/k norms) and
    the output projection row-parallel.

    Embeddings and the output projection are not split (the embedding matrix may be tied to the output):
    ``parallelize_model`` makes them replicated ``DTensor``s computed on the full sequence. Without
    ``sequence_parallel`` the residual stream and its norms are replicated too. With it, the residual
    stream between blocks is sharded along the sequence (``Shard(1)``): the first block takes its slice
    of the embeddings (no communication), the residual norms run on the local slice (their zero-centred
    weights are replicated ``DTensor``s whose gradients sum over the slices), the attention, Gated
    DeltaNet and feed-forward inputs are all-gathered to the full sequence (the short convolution and the
    gated delta rule run along the whole of it), their output projections reduce-scatter back to the
    slices, and the final norm's output is all-gathered before the output projection.
    """
    args = model.args
    size = tp_mesh.size()
    if args.n_heads % size or args.n_kv_heads % size or args.ffn_hidden_dim % size:
        raise ValueError(f"tp={size} must divide n_heads, n_kv_heads and ffn_hidden_dim")
    if args.linear_num_key_heads % size:  # it divides linear_num_value_heads (checked by the arguments)
        raise ValueError(f"tp={size} must divide linear_num_key_heads ({args.linear_num_key_heads})")
    residual = Shard(1) if sequence_parallel else Replicate()
    if sequence_parallel:
        parallelize_module(
            model,
            tp_mesh,
            {
                # (hidden, rope): the full embeddings enter the first block as this rank's slice
                "layers.0": PrepareModuleInput(
                    input_layouts=(Replicate(), None),
                    desired_input_layouts=(residual, None),
                    use_local_output=True,
                ),
                "norm": SequenceParallel(),
                "output": PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
            },
        )
    for block in model.layers:
        plan: dict[str, ParallelStyle] = {
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=residual),
            "feed_forward.w3": ColwiseParallel(),
        }
        if sequence_parallel:
            plan.update(
                {
                    "attention_norm": SequenceParallel(),
                    "ffn_norm": SequenceParallel(),
                    "feed_forward": _gather_sequence(1),
                }
            )
        if block.attention is not None:
            plan.update(
                {
                    "attention.wq": ColwiseParallel(),
                    "attention.wk": ColwiseParallel(),
                    "attention.wv": ColwiseParallel(),
                    "attention.wo": RowwiseParallel(output_layouts=residual),
                    "attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                    "attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                }
            )
            if sequence_parallel:
                plan["attention"] = _gather_sequence(2)  # (hidden, rope)
        if block.linear_attn is not None:
            plan.update(
                {
                    "linear_attn.in_proj_q": ColwiseParallel(),
                    "linear_attn.in_proj_k": ColwiseParallel(),
                    "linear_attn.in_proj_v": ColwiseParallel(),
                    "linear_attn.in_proj_z": ColwiseParallel(),
                    "linear_attn.in_proj_b": ColwiseParallel(),
                    "linear_attn.in_proj_a": ColwiseParallel(),
                    "linear_attn.norm": _HeadShardedNorm(sequence_dim=2, use_local_output=True),
                    "linear_attn.out_proj": RowwiseParallel(output_layouts=residual),
                }
            )
            if sequence_parallel:
                plan["linear_attn"] = _gather_sequence(1)
            _shard_deltanet_params(block.get_submodule("linear_attn"), tp_mesh)
        parallelize_module(block, tp_mesh, plan)


def _gather_sequence(n_inputs: int) -> PrepareModuleInput:
    """All-gather the first (sequence-sharded) positional input; the other ``n_inputs - 1`` pass through.

    The gathered input stays a replicated ``DTensor``, so the gradients of the column-parallel
    projections reading it add up as partial sums and leave through one reduce-scatter.
    """
    rest: tuple[None, ...] = (None,) * (n_inputs - 1)
    return PrepareModuleInput(input_layouts=(Shard(1), *rest), desired_input_layouts=(Replicate(), *rest))


def parallelize_qwen3_5(
    model: nn.Module,
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh | None,
    *,
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> nn.Module:
    """TP (+SP) -> activation checkpointing -> compile -> FSDP2 over the hybrid blocks, in place."""
    if not isinstance(model, Qwen3_5Model):
        raise TypeError(f"expected a Qwen3_5Model, got {type(model).__name__}")
    return parallelize_model(
        model,
        parallelism,
        device_mesh,
        blocks=list(model.layers),
        apply_tp=lambda tp_mesh: apply_tp(model, tp_mesh, parallelism.sequence_parallel),
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


def parallelize_qwen3_5_vl(
    model: nn.Module,
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh | None,
    *,
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> nn.Module:
    """TP on the language model (vision tower replicated); AC, compile, FSDP2 over both towers' blocks."""
    if not isinstance(model, Qwen3_5VLModel):
        raise TypeError(f"expected a Qwen3_5VLModel, got {type(model).__name__}")
    return parallelize_model(
        model,
        parallelism,
        device_mesh,
        blocks=[*model.visual.blocks, *model.language_model.layers],
        apply_tp=lambda tp_mesh: apply_tp(model.language_model, tp_mesh, parallelism.sequence_parallel),
        replicated_units=[model.visual],
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )
