"""Process-group start-up from torchrun's environment, honouring the ``comm`` section.

torchrun (``--nproc-per-node``, ``--nnodes``, rendezvous) is the launcher; this module only reads what it
exports (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``) and starts the default
process group. A plain ``python -m hyper_parallel.train_lm`` is one rank and starts no process group.

Nothing waits forever: every group the project creates (the default one, the mesh's, the checkpoint
manager's, any other made through ``new_group`` here) is bounded by ``comm.init_timeout_seconds`` until
the first step and by ``comm.train_timeout_seconds`` after it (``set_collective_timeout``); torch's own
default for a new group (30 minutes) never applies. ``shutdown(wait=False)`` is the error path: no
barrier, no collective, so a rank that failed never waits for one that stopped. ``peer_failure`` tells such
an ending (a collective timed out, or lost its connection to a rank that died) from any other error, so the
trainer can say so in one line instead of a backend traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
from datetime import timedelta
from typing import TYPE_CHECKING

import attrs
import torch
import torch.distributed as dist

from hyper_parallel._backends import DEFAULT_BACKEND

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from hyper_parallel.sections import CommConfig

__all__ = [
    "DistributedEnv",
    "PeerFailure",
    "all_gather_bytes",
    "collective_timeout",
    "default_backend",
    "flight_recorder_env",
    "init_distributed",
    "new_group",
    "peer_failure",
    "set_collective_timeout",
    "shutdown",
]

#: The bound of every collective now (``init_distributed``, then ``set_collective_timeout``); None: no group.
_timeout: timedelta | None = None


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
    return DEFAULT_BACKEND[device_type]


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
    global _timeout
    _timeout = timedelta(seconds=comm.init_timeout_seconds)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=_timeout,
            device_id=device if device_type != "cpu" else None,
        )
    else:  # started by the caller (a test, a notebook): bound it the same way
        set_collective_timeout(comm.init_timeout_seconds)
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


def collective_timeout() -> timedelta | None:
    """The bound of a collective started now (None before ``init_distributed`` started a group)."""
    return _timeout


def new_group(*, backend: str | None = None, ranks: list[int] | None = None) -> dist.ProcessGroup:
    """``torch.distributed.new_group`` bounded by the current ``collective_timeout`` (a collective itself).

    Torch gives a new group its backend's default (30 minutes for gloo), not the default group's timeout;
    every group made here follows ``comm`` instead, and ``set_collective_timeout`` shortens it later.
    """
    group: dist.ProcessGroup = dist.new_group(ranks=ranks, timeout=_timeout, backend=backend)
    return group


def set_collective_timeout(seconds: int, mesh: DeviceMesh | None = None) -> None:
    """Bound later collectives of every process group of this process (and later groups) by ``seconds``.

    That covers the default group, ``mesh``'s groups and every other group made since start-up (the
    checkpoint manager's). No-op without a process group. PyTorch has no public setter; TorchTitan uses
    this same hook to shorten the timeouts once start-up is over. ``mesh`` is accepted for its groups'
    sake; they are among every group already.
    """
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout, _world

    global _timeout
    _timeout = timedelta(seconds=seconds)
    groups = list(_world.pg_map)
    if mesh is not None:
        groups += [mesh.get_group(name) for name in mesh.mesh_dim_names or ()]
    seen: set[int] = set()
    for group in groups:
        if id(group) in seen or dist.get_rank(group) < 0:  # not a member: nothing of it runs here
            continue
        seen.add(id(group))
        _set_pg_timeout(_timeout, group)


def all_gather_bytes(data: bytes, group: dist.ProcessGroup | None = None) -> list[bytes]:
    """Every rank's ``data``, in rank order: the lengths, then the padded bytes, as ``uint8`` tensors.

    Nothing is unpickled (``all_gather_object`` would unpickle what any rank sends). Without a process
    group it is ``[data]``. Two collectives on ``group`` (the default group when None), on the CPU for
    gloo and on the current device otherwise.
    """
    if not dist.is_initialized():
        return [data]
    device = _collective_device(group)
    world = dist.get_world_size(group)
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(n.item()) for n in lengths]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    if data:
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    gathered = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    return [bytes(t[:n].cpu().numpy().tobytes()) for t, n in zip(gathered, sizes, strict=True)]


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "gloo":
        return torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    npu = getattr(torch, "npu", None)
    return torch.device("npu", npu.current_device()) if npu is not None else torch.device("cpu")


#: What the backends say when a collective ended because another rank stopped or stalled: gloo's and
#: NCCL's timeouts, then a peer's connection dropped (the rank died, or torchrun stopped it).
# The last two: the rendezvous of init_process_group when a rank never joins (a stall at start-up), on a
# store of its own (``MASTER_PORT``) and on torchrun's (gloo waiting for the peer's address in the store).
_TIMED_OUT = re.compile(
    r"Timed out waiting \d+ms|Watchdog caught collective operation timeout"
    r"|Timed out after \d+ seconds waiting for clients|wait timeout after \d+ms, keys: /default_pg/"
)
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|NCCL communicator was aborted"
    r"|remote process exited or there was a network error",
    re.I,
)
#: The module whose public functions are the collectives a traceback names.
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")


@attrs.frozen(kw_only=True)
class PeerFailure:
    """A collective that ended because another rank stopped or stalled (see :func:`peer_failure`)."""

    #: The ``torch.distributed`` function the project (or DCP, FSDP) called, e.g. ``all_reduce``;
    #: ``a collective`` when the traceback names none (an FSDP all-gather waited on in C++).
    collective: str
    #: True: it waited the whole timeout; False: the connection to another rank was lost first.
    timed_out: bool


def peer_failure(exc: BaseException) -> PeerFailure | None:
    """What ``exc`` says of a collective cut short by another rank, or None for any other error.

    Looks through ``exc``, its causes and contexts (DCP and FSDP re-raise): a gloo or NCCL timeout, or a
    connection to a peer that closed. The collective is the outermost ``torch.distributed`` call in the
    traceback (``gather_object``, not the ``all_gather`` it runs inside).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RuntimeError):
            text = str(current)
            timed_out = bool(_TIMED_OUT.search(text))
            if timed_out or _PEER_LOST.search(text):
                return PeerFailure(collective=_collective_name(exc, current), timed_out=timed_out)
        current = current.__cause__ or current.__context__
    return None


def _collective_name(*excs: BaseException) -> str:
    for exc in excs:
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename.endswith(_C10D) and not code.co_name.startswith("_"):
                return code.co_name
            tb = tb.tb_next
    return "a collective"


def shutdown(*, wait: bool = True) -> None:
    """Destroy the default process group and every other group.

    ``wait`` (a clean exit) first meets every rank in a barrier, so no rank tears gloo down while another
    still talks to it. ``wait=False`` (the error path) runs no collective: NCCL groups are aborted (their
    pending work is dropped), others destroyed at once; a failure to do so is ignored, the process is
    exiting anyway.
    """
    if not dist.is_initialized():
        return
    if wait:
        dist.barrier()
        dist.destroy_process_group()
        return
    with contextlib.suppress(Exception):
        if dist.get_backend() == "nccl":
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()
        else:
            dist.destroy_process_group()
