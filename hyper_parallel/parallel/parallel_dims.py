"""Where a rank sits in the parallel layout, and the one builder of the device mesh that realises it.

``ParallelDims`` is plain arithmetic over ``ParallelismConfig`` and the world size (no torch at import),
so the launch script, the trainer and tests agree on one answer to "which data-parallel shard does rank r
read?". Ranks are laid out row-major over the mesh dimensions ``pp, dp_replicate, dp_shard, cp, tp``
(outermost first, the order TorchTitan uses): tensor-parallel peers are neighbouring ranks, so they share
a node. ``ParallelDims.build_mesh`` is the only function of the project that creates a device mesh: the
trainer, the models' tests and the layout checks all run on the same mesh (with the same flattened
dimensions); ``mesh_degrees`` reads a mesh back and checks it against a ``ParallelismConfig``.

Expert parallelism takes its ranks from ``dp_shard`` (TorchTitan's rule): with ``ep`` > 1 the mesh has
``dp_shard_mod_ep`` x ``ep`` in place of ``dp_shard`` (the ``ep`` ranks of a group are neighbours), and
the two are flattened back into ``dp_shard``, which FSDP2 and the data-parallel group use as before.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from hyper_parallel.sections import ParallelismConfig

__all__ = ["EP_DIM_NAMES", "MESH_DIM_NAMES", "ParallelDims", "mesh_degrees"]

#: Mesh dimension names, outermost first.
MESH_DIM_NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
#: What ``dp_shard`` is split into under expert parallelism, outermost first.
EP_DIM_NAMES: tuple[str, str] = ("dp_shard_mod_ep", "ep")


@attrs.frozen(kw_only=True)
class ParallelDims:
    """The resolved degree of every parallel dimension for one world size (no ``-1`` left)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    @classmethod
    def from_config(cls, parallelism: ParallelismConfig, world_size: int) -> ParallelDims:
        """Infer the ``-1`` degree of ``parallelism`` for ``world_size``; ``ValueError`` if none fits."""
        return cls(**parallelism.resolved_degrees(world_size))

    @property
    def world_size(self) -> int:
        """Number of ranks the layout needs."""
        return math.prod(self.degrees().values())

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: each reads a different share of every global batch."""
        return self.dp_replicate * self.dp_shard

    def degrees(self) -> dict[str, int]:
        """Degree per mesh dimension, outermost first."""
        return {name: getattr(self, name) for name in MESH_DIM_NAMES}

    def coordinates(self, rank: int) -> dict[str, int]:
        """Index of global ``rank`` along every mesh dimension."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size} ranks")
        coords: dict[str, int] = {}
        for name in reversed(MESH_DIM_NAMES):
            size = getattr(self, name)
            coords[name] = rank % size
            rank //= size
        return {name: coords[name] for name in MESH_DIM_NAMES}

    def dp_rank(self, rank: int) -> int:
        """Data-parallel index of global ``rank``: which share of the global batch it trains on."""
        coords = self.coordinates(rank)
        return coords["dp_replicate"] * self.dp_shard + coords["dp_shard"]

    def mesh_dim_names(self) -> tuple[str, ...]:
        """Dimensions with a degree above 1 (``dp_shard`` alone for a single rank); under expert
        parallelism ``dp_shard`` is ``dp_shard_mod_ep`` x ``ep`` (the first possibly of size 1)."""
        names = tuple(name for name in MESH_DIM_NAMES if getattr(self, name) > 1) or ("dp_shard",)
        if self.ep > 1:
            at = names.index("dp_shard")
            names = (*names[:at], *EP_DIM_NAMES, *names[at + 1 :])
        return names

    def mesh_dim_size(self, name: str) -> int:
        """Size of mesh dimension ``name`` (one of ``mesh_dim_names``)."""
        if name == "dp_shard_mod_ep":
            return self.dp_shard // self.ep
        return getattr(self, name)  # type: ignore[no-any-return]

    def describe(self) -> str:
        """``dp_shard=2 x tp=2`` style summary of the layout, or ``single process``."""
        parts = [f"{name}={getattr(self, name)}" for name in MESH_DIM_NAMES if getattr(self, name) > 1]
        return " x ".join(parts) if parts else "single process"

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The device mesh of this layout on an initialised process group; None for a single rank.

        One named dimension per degree above 1 (``dp_shard`` alone when there is none), outermost first;
        the dimensions a parameter can be split on (``dp_shard``, ``cp``, ``tp``) are also flattened into
        one when more than one of them is used.
        """
        if self.world_size == 1:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        names = self.mesh_dim_names()
        mesh = init_device_mesh(
            device_type, tuple(self.mesh_dim_size(name) for name in names), mesh_dim_names=names
        )
        if self.ep > 1:
            mesh[EP_DIM_NAMES]._flatten("dp_shard")
        # Reductions over every dimension a parameter is split on (the global gradient norm under
        # dp_shard x tp) then run as one collective: DTensor uses a flattened mesh when one exists, and
        # otherwise all-reduces dimension by dimension, in an order that may round differently per rank.
        split = tuple(name for name in ("dp_shard", "cp", "tp") if getattr(self, name) > 1)
        if len(split) > 1:
            mesh[split]._flatten("_".join(split))
        return mesh

    def dp_group(self, mesh: DeviceMesh | None) -> ProcessGroup | None:
        """Process group of this rank's data-parallel peers (None when there is one DP rank)."""
        if mesh is None or self.dp_size == 1:
            return None
        names = tuple(name for name in ("dp_replicate", "dp_shard") if getattr(self, name) > 1)
        if len(names) == 1:
            return mesh[names[0]].get_group()
        return mesh[names]._flatten("dp").get_group()


def mesh_degrees(parallelism: ParallelismConfig, device_mesh: DeviceMesh | None) -> dict[str, int]:
    """Degrees per mesh dimension name (1 where the mesh lacks it), checked against ``parallelism``.

    ``None`` is the mesh of one process. ``ValueError`` when the mesh has a dimension of another name or
    does not realise ``parallelism``; ``NotImplementedError`` for context parallelism (not supported yet).
    """
    names = tuple(device_mesh.mesh_dim_names or ()) if device_mesh is not None else ()
    unknown = [name for name in names if name not in (*MESH_DIM_NAMES, *EP_DIM_NAMES)]
    if unknown:
        raise ValueError(f"device mesh dimension(s) {unknown} are not among {list(MESH_DIM_NAMES)}")
    sizes = {name: device_mesh.size(i) for i, name in enumerate(names)} if device_mesh else {}
    if "ep" in sizes:  # dp_shard split for expert parallelism (``ParallelDims.build_mesh``)
        sizes["dp_shard"] = sizes.pop("dp_shard_mod_ep", 1) * sizes["ep"]
    ep = sizes.pop("ep", 1)
    if ep != parallelism.ep:
        raise ValueError(f"device mesh does not match parallelism degrees: ep={parallelism.ep} (mesh: {ep})")
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
    if degrees["cp"] > 1:
        raise NotImplementedError("parallelism.cp > 1 is not supported by the built-in models yet")
    return {**degrees, "ep": ep}
