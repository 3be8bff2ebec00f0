"""Data parallelism with FSDP2: FSDP over ``dp_shard``, HSDP over ``dp_replicate`` x ``dp_shard``, DDP.

Every data-parallel layout goes through FSDP2 (``fully_shard``, or its ``replicate`` for DDP), so they
share one module type, one gradient-sync switch and ``DTensor`` parameters; ``training`` gives the
``MixedPrecisionPolicy`` and CPU offload. Blocks are wrapped one by one, then the root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel._dtypes import torch_dtype

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import ParallelismConfig, TrainingConfig

__all__ = ["apply_fsdp"]


def apply_fsdp(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh,
    degrees: Mapping[str, int],
    training: TrainingConfig | None = None,
    *,
    experts: Iterable[nn.Module] = (),
) -> None:
    """Data parallelism with FSDP2, each block then the root, over the data-parallel mesh dimensions.

    ``dp_shard`` alone is FSDP (``fully_shard`` on the 1-D ``dp_shard`` mesh, placements ``(Shard(0),)``);
    ``dp_replicate`` x ``dp_shard`` is HSDP (``fully_shard`` on the 2-D mesh, which FSDP2 reads as
    replicate x shard: ``(Replicate(), Shard(0))``); ``dp_replicate`` alone is DDP through FSDP2's
    ``replicate`` (parameters ``(Replicate(),)``, gradients all-reduced). ``degrees`` are the mesh's
    (``mesh_degrees``). ``training`` sets the ``MixedPrecisionPolicy`` (``mixed_precision_param``/
    ``_reduce``) and CPU offload (``enable_cpu_offload``); ``None`` keeps full precision on the device.
    ``experts`` (under expert parallelism: modules whose weights are already split over ``ep``) are wrapped
    first, on ``dp_shard_mod_ep``, the data-parallel ranks left to them.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    replicas, shards = degrees["dp_replicate"], degrees["dp_shard"]
    if replicas == 1 and shards == 1:
        return
    mp_policy = MixedPrecisionPolicy()
    offload: OffloadPolicy = OffloadPolicy()
    if training is not None:
        mp_policy = MixedPrecisionPolicy(
            param_dtype=torch_dtype(training.mixed_precision_param),
            reduce_dtype=torch_dtype(training.mixed_precision_reduce),
        )
        if training.enable_cpu_offload:
            # Pinned host memory needs an accelerator; on a CPU-only machine offloading is a no-op anyway.
            offload = CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
    if shards == 1:  # DDP: replicate every block, then the root (gradients all-reduced per block)
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in blocks:
            replicate(block, mesh=device_mesh["dp_replicate"], mp_policy=mp_policy, offload_policy=offload)
        replicate(model, mesh=device_mesh["dp_replicate"], mp_policy=mp_policy, offload_policy=offload)
        return
    dp_mesh = device_mesh["dp_replicate", "dp_shard"] if replicas > 1 else device_mesh["dp_shard"]
    options: dict[str, Any] = {
        "mesh": dp_mesh,
        "reshard_after_forward": parallelism.fsdp_reshard_after_forward != "never",
        "mp_policy": mp_policy,
        "offload_policy": offload,
    }
    for module in experts:
        fully_shard(module, **{**options, "mesh": device_mesh["dp_shard_mod_ep"]})
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)
