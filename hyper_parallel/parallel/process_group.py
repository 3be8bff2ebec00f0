"""Process-group start-up from torchrun's environment, honouring the ``comm`` section.

torchrun (``--nproc-per-node``, ``--nnodes``, rendezvous) is the launcher; this module only reads what it
exports (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and starts the default
process group. A plain ``python -m hyper_parallel.train_lm`` is one rank and starts no process group.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hyper_parallel.trainer.config import CommConfig

__all__ = [
    "DistributedEnv",
    "default_backend",
    "flight_recorder_env",
    "init_distributed",
    "set_collective_timeout",
    "shutdown",
]

#: Backend picked for each device type when ``comm.backend`` is null.
_DEFAULT_BACKEND = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


@attrs.frozen(kw_only=True)
class DistributedEnv:
    """This process's place in the job and the device it trains on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints and writes shared files."""
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def _device_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def default_backend(device_type: str) -> str:
    """The collective backend for ``device_type``: nccl on CUDA, hccl on NPU, gloo on the CPU."""
    return _DEFAULT_BACKEND[device_type]


def init_distributed(comm: CommConfig) -> DistributedEnv:
    """Start the default process group when torchrun launched more than one rank.

    ``comm.init_timeout_seconds`` bounds every collective until the first step finishes (model set-up can
    be slow); ``set_collective_timeout`` switches to ``comm.train_timeout_seconds`` after it. The NCCL
    flight recorder (``trace_buf_size``, ``save_traces_folder``) is configured through the environment
    variables NCCL reads; other backends have no flight recorder.
    """
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    device_type = _device_type()
    device = torch.device(device_type, local_rank) if device_type != "cpu" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    if world_size == 1:
        return DistributedEnv(rank=0, local_rank=0, world_size=1, device=device, backend=None)
    backend = comm.backend or default_backend(device_type)
    for name, value in flight_recorder_env(comm, backend).items():
        os.environ.setdefault(name, value)  # a value the user exported wins
    if backend == "nccl" and comm.trace_buf_size:
        os.makedirs(comm.save_traces_folder, exist_ok=True)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(seconds=comm.init_timeout_seconds),
            device_id=device if device_type != "cpu" else None,
        )
    return DistributedEnv(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=dist.get_world_size(),
        device=device,
        backend=backend,
    )


def flight_recorder_env(comm: CommConfig, backend: str) -> dict[str, str]:
    """Environment variables configuring NCCL's flight recorder from ``comm`` (none for other backends).

    The recorder keeps the last ``trace_buf_size`` collectives per rank and, on a timeout, dumps them to
    ``save_traces_folder/rank_<r>``: the record that tells which rank stopped calling which collective.
    """
    if backend != "nccl":
        return {}
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(comm.trace_buf_size)}
    if comm.trace_buf_size:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = os.path.join(comm.save_traces_folder, "rank_")
    return env


def set_collective_timeout(seconds: int, mesh: DeviceMesh | None = None) -> None:
    """Bound later collectives of the default group and of ``mesh``'s groups by ``seconds``.

    No-op without a process group. PyTorch has no public setter; TorchTitan uses this same hook to
    shorten the timeouts once start-up is over.
    """
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    timeout = timedelta(seconds=seconds)
    _set_pg_timeout(timeout, None)
    if mesh is not None:
        for name in mesh.mesh_dim_names or ():
            _set_pg_timeout(timeout, mesh.get_group(name))


def shutdown() -> None:
    """Destroy the default process group, waiting for every rank (clean exit, no aborted gloo threads)."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
