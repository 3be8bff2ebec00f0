"""The distributed techniques, one per module, as ``torchtitan/distributed`` lays them out.

- ``process_group``: the default process group from torchrun's environment, backend, collective timeouts,
  NCCL flight recorder, shutdown;
- ``parallel_dims``: ``ParallelDims``, a rank's coordinates and THE device-mesh builder
  (``ParallelDims.build_mesh``; ``mesh_degrees`` reads a mesh back);
- ``tensor_parallel``: what every model's own plan needs beside it (``replicate_remaining_params``);
- ``data_parallel``: FSDP2, HSDP and DDP (``apply_fsdp``);
- ``expert_parallel``: experts split over ``ep`` ranks of ``dp_shard`` with all-to-all dispatch
  (``apply_ep``), the gradient norm over both meshes, the MoE load-balancing loss;
- ``activation_checkpoint``, ``compile``: per-block recomputation and ``torch.compile``;
- ``pipeline``: stage splitting, the schedule and the gradient clipping over stages;
- ``ties``: tied weights kept tied by the techniques that replace parameters;
- ``names``: a parameter's name without torch's module wrappers, as the distributed state dicts key it;
- ``parallelize``: the order the techniques apply in (``parallelize_model``).

The models compose these in their own plans (``models/<name>/_parallel.py``); the trainer starts the
process group, builds the mesh and the pipeline. Every module but ``parallel_dims`` imports torch, so this
package imports none of them: the names below are loaded on first access. The sections they read
(``ParallelismConfig`` ...) come from :mod:`hyper_parallel.sections`, below this package, as annotations
only; nothing of ``hyper_parallel.trainer`` is imported, at run time or for type checking.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyper_parallel.parallel.parallel_dims import MESH_DIM_NAMES, ParallelDims, mesh_degrees
    from hyper_parallel.parallel.parallelize import parallelize_model
    from hyper_parallel.parallel.pipeline import Pipeline, build_pipeline, clip_grad_norm
    from hyper_parallel.parallel.process_group import DistributedEnv, init_distributed, shutdown

__all__ = [
    "MESH_DIM_NAMES",
    "DistributedEnv",
    "ParallelDims",
    "Pipeline",
    "build_pipeline",
    "clip_grad_norm",
    "init_distributed",
    "mesh_degrees",
    "parallelize_model",
    "shutdown",
]

_HOMES = {
    "MESH_DIM_NAMES": "parallel_dims",
    "ParallelDims": "parallel_dims",
    "mesh_degrees": "parallel_dims",
    "parallelize_model": "parallelize",
    "Pipeline": "pipeline",
    "build_pipeline": "pipeline",
    "clip_grad_norm": "pipeline",
    "DistributedEnv": "process_group",
    "init_distributed": "process_group",
    "shutdown": "process_group",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
