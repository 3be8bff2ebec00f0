"""The one way tests start worker processes: torchrun, several torchrun "nodes", or an in-process spawn group.

Nothing here picks a port in advance. Binding port 0, closing the socket and handing the number to a child
is a race: another process may take the port in between. Instead the processes meet where no one else can:
- ``torchrun`` runs with ``--standalone``: the agent hosts its c10d rendezvous store on port 0 and shares it
  with the workers as their ``MASTER_PORT``, so the port is chosen and held by the store that uses it;
- ``torchrun_nodes`` starts several agents that meet in a c10d rendezvous kept in a file
  (``store_type=file``); the first agent again hosts the workers' store on a port it binds itself;
- ``spawn`` gives its processes a ``file://`` init method in a fresh temporary folder: no port at all.

Every runner bounds its wait and, on a timeout (its own or pytest-timeout's), stops the whole process tree
(torchrun's agent stops its workers on SIGTERM; anything left gets SIGKILL), so no test leaves ranks behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

__all__ = ["SpawnedCases", "clean_env", "spawn", "spawn_each", "torchrun", "torchrun_nodes"]

#: Seconds a stopped process tree gets between SIGTERM and SIGKILL.
_GRACE = 30.0


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without torchrun's variables (a test may run under one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _worker_env() -> dict[str, str]:
    """``clean_env`` with the repository first on ``PYTHONPATH``, so workers import ``tests.support``."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop ``proc`` and everything it started (it leads its own session): SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


class _Run:
    """One started process with its output in unnamed temporary files (no pipe to fill up and block on)."""

    def __init__(self, command: Sequence[str], cwd: Path | None) -> None:
        self.command = list(command)
        # closed by result(), once the process has ended and its output was read
        self.stdout = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command,
            stdout=self.stdout,
            stderr=self.stderr,
            text=True,
            env=_worker_env(),
            cwd=cwd or ROOT,
            start_new_session=True,  # its own process group: a timeout stops the agent and all its workers
        )

    def result(self) -> subprocess.CompletedProcess[str]:
        """What it printed (after it ended), and its exit status."""
        outputs = []
        for handle in (self.stdout, self.stderr):
            handle.seek(0)
            outputs.append(handle.read())
            handle.close()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, *outputs)


def _finish(runs: list[_Run], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Wait for every run within ``timeout`` seconds in all; stop them all if one is late."""
    deadline = time.monotonic() + timeout
    try:
        for run in runs:
            try:
                run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in runs:
                    _stop(other.proc)
                late = run.result()
                pytest.fail(
                    f"{' '.join(run.command)} did not finish within {timeout} s:\n"
                    f"{late.stdout[-3000:]}\n{late.stderr[-6000:]}"
                )
    finally:
        for run in runs:
            _stop(run.proc)
    return [run.result() for run in runs]


def _torchrun_command(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *args]


def torchrun(
    nproc: int, *args: str, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node N ARGS`` from the repository root; output captured.

    ``ARGS`` is what follows the options: a script and its arguments, or ``-m MODULE ...``.
    A run still going after ``timeout`` seconds is stopped with its workers and fails the test.
    """
    command = _torchrun_command(nproc, "--standalone", *args)
    (done,) = _finish([_Run(command, cwd)], timeout)
    return done


def torchrun_nodes(
    nnodes: int, nproc: int, *args: str, timeout: float = 300, cwd: Path | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """``nnodes`` torchrun agents of ``nproc`` workers each, meeting as separate machines would.

    They rendezvous through c10d on a file store in a fresh folder (no port to agree on beforehand), each
    with its own ``--node-rank``; one CompletedProcess per agent, in node order.
    """
    with tempfile.TemporaryDirectory(prefix="rdzv-") as folder:
        rendezvous = [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={Path(folder) / 'store'}",
            f"--rdzv-id={uuid.uuid4().hex[:8]}",
            "--rdzv-conf=store_type=file,join_timeout=120",
        ]
        runs = [
            _Run(_torchrun_command(nproc, *rendezvous, f"--node-rank={node}", *args), cwd)
            for node in range(nnodes)
        ]
        return _finish(runs, timeout)


def _run_in_group(rank: int, init_method: str, world: int, body: Callable[..., None], *args: Any) -> None:
    """Run ``body(rank, *args)`` in a fresh gloo group of ``world`` processes, then leave at once.

    DTensor's process-wide state keeps a gloo process group (and its worker threads) alive after
    ``destroy_process_group``; letting the interpreter finalise with those threads running aborts the
    process now and then ("terminate called without an active exception", SIGABRT). After a clean
    barrier and destroy there is nothing left to do, so a successful worker ends with ``os._exit(0)``.
    A failing one raises as usual, so ``spawn`` reports its traceback.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # several processes on a small machine: avoid oversubscription
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        body(rank, *args)
        dist.barrier()  # no rank tears down gloo while another still talks to it
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(body: Callable[..., None], *args: Any, nprocs: int) -> None:
    """Run ``body(rank, *args)`` on ``nprocs`` spawned processes that form one gloo group.

    ``body`` must be a module-level function (it is pickled by name). The group meets through a file in a
    fresh temporary folder. A failing rank raises here with its traceback and the others are stopped; so
    are all of them if the wait is interrupted (by pytest-timeout, say).
    """
    from torch.multiprocessing.spawn import start_processes

    with tempfile.TemporaryDirectory(prefix="gloo-") as folder:
        init_method = (Path(folder) / "store").as_uri()
        context = start_processes(  # type: ignore[no-untyped-call]
            _run_in_group,
            args=(init_method, nprocs, body, *args),
            nprocs=nprocs,
            join=False,
            start_method="spawn",
        )
        try:
            while not context.join():
                pass
        finally:
            for proc in context.processes:
                if proc.is_alive():
                    proc.terminate()
            for proc in context.processes:
                proc.join(_GRACE)
                if proc.is_alive():
                    proc.kill()
                    proc.join()


#: A case of :func:`spawn_each`: a module-level function run as ``body(rank, *args)``, and its arguments.
Case = tuple[Callable[..., None], tuple[Any, ...]]


class SpawnedCases:
    """What :func:`spawn_each` saw: the cases that passed on every rank, and the first failure's report."""

    def __init__(self, passed: set[str], failure: str | None) -> None:
        self.passed = passed
        self.failure = failure

    def check(self, name: str) -> None:
        """Pass if case ``name`` passed on every rank; else fail with the failing case's traceback."""
        if name not in self.passed:
            pytest.fail(f"case {name!r} did not pass; the first failure:\n{self.failure}", pytrace=False)


def spawn_each(cases: Mapping[str, Case], *, nprocs: int) -> SpawnedCases:
    """Run every case ``name -> (body, args)`` as ``body(rank, *args)``, one after the other, in one group of
    ``nprocs`` spawned processes: a module's cases pay the processes' start-up (importing torch) once.

    Ranks meet at a barrier after each case; the cases that passed are recorded as they pass. The first
    case to fail on any rank ends the group as :func:`spawn` does, and it and the cases after it report
    that failure (the cases before it still pass).
    """
    with tempfile.TemporaryDirectory(prefix="cases-") as folder:
        record = Path(folder) / "passed"
        record.touch()
        try:
            spawn(_run_cases, list(cases.items()), str(record), nprocs=nprocs)
            failure = None
        except Exception as exc:  # the case's own traceback; else (a rank died) what torch's spawn saw
            failed = sorted(Path(folder).glob("failed.rank*"))
            failure = "\n".join(f.read_text() for f in failed) if failed else str(exc)
        return SpawnedCases(set(record.read_text().splitlines()), failure)


def _run_cases(rank: int, cases: list[tuple[str, Case]], record: str) -> None:
    import traceback

    import torch.distributed as dist

    for name, (body, args) in cases:
        try:
            body(rank, *args)
        except BaseException:  # kept for the report: the other ranks only see the group break
            Path(record).with_name(f"failed.rank{rank}").write_text(
                f"{name}, rank {rank}:\n{traceback.format_exc()}"
            )
            raise
        dist.barrier()
        if rank == 0:
            with open(record, "a", encoding="utf-8") as handle:
                handle.write(name + "\n")
