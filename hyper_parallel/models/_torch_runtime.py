"""torch helpers shared by the built-in models' runtimes: weight loading, device meshes and FSDP2.

Private and torch-importing: only the runtime hooks import this module, from inside their bodies, so
resolving a config never loads torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

if TYPE_CHECKING:  # annotations only: models sit below the trainer layer and never import it
    from hyper_parallel.trainer.config import ParallelismConfig


__all__ = [
    "MESH_DIM_NAMES",
    "StateDictAdapter",
    "apply_fsdp",
    "build_device_mesh",
    "load_weights",
    "mesh_degrees",
    "read_safetensors_folder",
]

#: Mesh dimension names, outermost first, for the degrees of ``ParallelismConfig``.
MESH_DIM_NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class StateDictAdapter(Protocol):
    """What ``load_weights`` needs from a model's state-dict adapter."""

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...


def read_safetensors_folder(weights_path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in a local folder (sharded or not), on the CPU."""
    from safetensors.torch import load_file

    folder = Path(weights_path)
    if not folder.is_dir():
        raise FileNotFoundError(f"weights_path {str(folder)!r} is not a directory")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: Mapping[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / name for name in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in weights_path {str(folder)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file), device="cpu"))
    return tensors


def _has_dtensor(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def load_weights(model: nn.Module, weights_path: str | Path, adapter: StateDictAdapter) -> nn.Module:
    """Load a Hugging Face safetensors checkpoint from ``weights_path`` into ``model`` via ``adapter``.

    Works on a plain module (CPU, or meta: parameters are then assigned) and on a parallelized one
    (DTensor parameters receive their shard of the full tensors). Missing or unexpected names raise.
    """
    state_dict = adapter.from_hf(read_safetensors_folder(weights_path))
    if _has_dtensor(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=True))
        return model
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta:
        dtypes = {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
        state_dict = {k: v.to(dtypes[k]) if k in dtypes else v for k, v in state_dict.items()}
    model.load_state_dict(state_dict, strict=True, assign=on_meta)
    if on_meta:
        tie = getattr(model, "tie_weights", None)
        if callable(tie):
            tie()
    return model


def build_device_mesh(
    parallelism: ParallelismConfig, world_size: int, device_type: str = "cpu"
) -> DeviceMesh:
    """A device mesh with one named dimension per degree > 1 of ``parallelism`` (``dp_shard`` if none)."""
    degrees = parallelism.resolved_degrees(world_size)
    names = [name for name in MESH_DIM_NAMES if degrees[name] > 1] or ["dp_shard"]
    shape = tuple(degrees[name] for name in names)
    return init_device_mesh(device_type, shape, mesh_dim_names=tuple(names))


def mesh_degrees(parallelism: ParallelismConfig, device_mesh: DeviceMesh | None) -> dict[str, int]:
    """Degrees per mesh dimension name (1 where the mesh lacks it), checked against ``parallelism``."""
    names = tuple(device_mesh.mesh_dim_names or ()) if device_mesh is not None else ()
    unknown = [name for name in names if name not in MESH_DIM_NAMES]
    if unknown:
        raise ValueError(f"device mesh dimension(s) {unknown} are not among {list(MESH_DIM_NAMES)}")
    sizes = {name: device_mesh.size(i) for i, name in enumerate(names)} if device_mesh else {}
    degrees = {name: sizes.get(name, 1) for name in MESH_DIM_NAMES}
    world = math.prod(degrees.values())
    issues = parallelism.world_size_issues(world)
    if issues:
        details = "; ".join(f"parallelism.{path}: {message}" for path, message in issues)
        raise ValueError(f"device mesh {sizes or '(none)'} does not match parallelism: {details}")
    expected = parallelism.resolved_degrees(world)
    wrong = [f"{n}={expected[n]} (mesh: {degrees[n]})" for n in MESH_DIM_NAMES if expected[n] != degrees[n]]
    if wrong:
        raise ValueError("device mesh does not match parallelism degrees: " + ", ".join(wrong))
    for name in ("pp", "cp"):
        if degrees[name] > 1:
            raise NotImplementedError(f"parallelism.{name} > 1 is not supported by the built-in models yet")
    return degrees


def apply_fsdp(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh,
    degrees: Mapping[str, int],
) -> None:
    """``fully_shard`` each block, then the root, over the data-parallel mesh dimensions (HSDP if both)."""
    from torch.distributed.fsdp import fully_shard

    dp_names = tuple(name for name in ("dp_replicate", "dp_shard") if degrees[name] > 1)
    if not dp_names:
        return
    dp_mesh = device_mesh[dp_names]
    if dp_names == ("dp_replicate",):
        # Pure replication: FSDP2 over a 1-D mesh would shard, so use HSDP with a shard degree of 1.
        raise NotImplementedError("dp_replicate without dp_shard (DDP) is not supported yet; use dp_shard")
    reshard: bool = parallelism.fsdp_reshard_after_forward != "never"
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard)
