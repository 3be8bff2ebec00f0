"""The order the techniques are applied in: TP -> EP -> activation checkpointing -> compile -> FSDP2
(TorchTitan's).

A model's ``parallelize`` hook calls ``parallelize_model`` with its blocks and its own tensor-parallel plan;
this module is the one place that says in which order the techniques of ``hyper_parallel.parallel`` run
and what each one is given. Pipeline parallelism wraps the whole: each stage is parallelized by the same
call (``hyper_parallel.parallel.pipeline``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel.parallel.activation_checkpoint import apply_activation_checkpointing
from hyper_parallel.parallel.compile import apply_compile
from hyper_parallel.parallel.data_parallel import apply_fsdp
from hyper_parallel.parallel.parallel_dims import mesh_degrees
from hyper_parallel.parallel.tensor_parallel import replicate_remaining_params
from hyper_parallel.parallel.ties import restore_ties, tie_groups

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["parallelize_model"]


def parallelize_model(
    model: nn.Module,
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh | None,
    *,
    blocks: Sequence[nn.Module],
    apply_tp: Callable[[DeviceMesh], None],
    replicated_units: Sequence[nn.Module] = (),
    moe_layers: Sequence[nn.Module] = (),
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> nn.Module:
    """TP (``apply_tp`` on the ``tp`` mesh, then the rest replicated) -> AC -> compile -> FSDP2, in place.

    The order is TorchTitan's: tensor parallelism (every parameter then is a ``DTensor``, replicated where
    not split) -> activation checkpointing per block (``activation_checkpoint``) -> ``torch.compile`` per
    block (``compile``, when enabled with ``"model"`` among its components) -> FSDP2 data parallelism (FSDP
    over ``dp_shard``, HSDP over ``dp_replicate`` x ``dp_shard``, DDP over ``dp_replicate``) with the
    ``MixedPrecisionPolicy`` and CPU offload of ``training``. ``None`` for a section means its defaults-off
    behaviour (full precision, no checkpointing, no compile). ``device_mesh`` names its dimensions after
    the degrees of ``parallelism`` above 1 (``ParallelDims.build_mesh``); ``None`` means one process.
    Parameter names (state-dict keys) are never changed.

    ``blocks`` are the units checkpointed, compiled and sharded one by one; ``replicated_units`` are
    submodules tensor parallelism leaves whole (see ``replicate_remaining_params``); ``moe_layers`` are
    the mixture-of-experts modules whose experts expert parallelism shards over ``ep``
    (``expert_parallel.apply_ep``) and FSDP2 over ``dp_shard_mod_ep``.
    """
    degrees = mesh_degrees(parallelism, device_mesh)
    aliases = tie_groups(model)
    if degrees["tp"] > 1:
        assert device_mesh is not None
        apply_tp(device_mesh["tp"])
        replicate_remaining_params(model, device_mesh["tp"], replicated_units)
    experts: list[nn.Module] = []
    if degrees["ep"] > 1:
        from hyper_parallel.parallel.expert_parallel import apply_ep

        assert device_mesh is not None
        if not moe_layers:
            raise ValueError(
                f"parallelism.ep = {degrees['ep']} needs a model with experts; this one has none"
            )
        apply_ep(moe_layers, device_mesh["ep"])
        experts = [moe.get_submodule("experts") for moe in moe_layers]
    if activation_checkpoint is not None:
        apply_activation_checkpointing(blocks, activation_checkpoint)
    if compile is not None and compile.enable and "model" in compile.components:
        apply_compile(blocks, compile)
    if device_mesh is not None:
        apply_fsdp(model, blocks, parallelism, device_mesh, degrees, training, experts=experts)
    restore_ties(model, aliases)
    return model
