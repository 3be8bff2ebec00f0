"""Nothing waits forever: a rank stopped (SIGSTOP) mid-step or mid-save ends the job within comm's timeout.

Two CPU ranks under torchrun, the tiny debug model; ``tests/support/fault_worker.py`` stops rank 1 at a known
point. The other rank must give up within ``comm.train_timeout_seconds`` (every group bounded, the checkpoint
manager's included), say so in one line (phase, collective, the ``comm`` field, no traceback) and leave
without waiting on a collective; the job then ends non-zero and no process of it is left.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import as_flags, debug_config_path, tiny_overrides  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

FAULT_WORKER = str(Path(__file__).parents[1] / "support" / "fault_worker.py")
#: comm.train_timeout_seconds in these runs.
TRAIN_TIMEOUT = 5
#: Seconds past the timeout the job may take to end: the timed-out collective's error, the failing
#: rank's exit (no barrier), torchrun noticing it and the stopped rank being killed. Measured ~1-2 s
#: on an idle 2-core machine; the rest is headroom for a loaded one.
MARGIN = 10


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _run_stopped(tmp_path: Path, stop_at: str, message: str, **extra: str) -> None:
    report = tmp_path / "report"
    overrides = tiny_overrides(
        "llama3",
        **{
            "training.max_steps": "3",
            "comm.init_timeout_seconds": "60",  # start-up on a loaded machine: ranks may be seconds apart
            "comm.train_timeout_seconds": str(TRAIN_TIMEOUT),
            **extra,
        },
    )
    train_args = ["--config-file", str(debug_config_path("llama3")), *as_flags(overrides)]
    command = [FAULT_WORKER, str(report), "--stop-rank", "1", "--stop-at", stop_at, "--", *train_args]
    done = torchrun(2, *command, timeout=120)
    ended = time.time()
    stopped = float(Path(f"{report}.stopped").read_text())
    print(f"{stop_at}: the job ended {ended - stopped:.1f} s after the stop")
    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-4000:]
    # The surviving rank says in one line where it stopped and why; no traceback of a worker (the one
    # traceback left is torchrun's own ChildFailedError, which names no RuntimeError).
    assert f"training stopped: rank 0: {message}\n" in done.stderr, done.stderr[-4000:]
    assert "RuntimeError" not in done.stderr
    assert "[rank0]: Traceback" not in done.stderr
    assert ended - stopped < TRAIN_TIMEOUT + MARGIN, (ended - stopped, done.stderr[-4000:])
    pids = [int(p.read_text()) for p in tmp_path.glob("report.pid*")]
    assert len(pids) == 3  # both ranks and the stopped rank's watcher
    assert [pid for pid in pids if _alive(pid)] == []


def test_a_rank_stopped_mid_step_ends_the_job_within_the_train_timeout(tmp_path: Path) -> None:
    _run_stopped(
        tmp_path,
        "step:2",
        f"step 2: all_reduce timed out (comm.train_timeout_seconds = {TRAIN_TIMEOUT}): another rank "
        "stopped or is stalled",
    )


def test_a_rank_stopped_mid_save_ends_the_job_within_the_train_timeout(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    _run_stopped(
        tmp_path,
        "save:1",
        f"the checkpoint save of step 1: gather_object timed out (comm.train_timeout_seconds = "
        f"{TRAIN_TIMEOUT}): another rank stopped or is stalled",
        **{"checkpoint.enable": "true", "checkpoint.folder": str(folder), "checkpoint.interval": "1"},
    )
    assert not (folder / "step-1").exists()  # the save never finished: nothing is published


def test_gloo_honours_a_shortened_group_timeout_in_barrier_and_all_reduce() -> None:
    """The mechanism the bound relies on: ``set_collective_timeout`` reaches every group and gloo obeys it."""
    from tests.support.processes import spawn

    spawn(_shortened_timeouts, nprocs=2)


def _shortened_timeouts(rank: int) -> None:
    import torch.distributed as dist

    from hyper_parallel.parallel.process_group import new_group, set_collective_timeout

    group = new_group(backend="gloo")
    set_collective_timeout(2)
    dist.barrier()
    if rank == 1:
        time.sleep(5)  # rank 0 meanwhile waits 2 s in each collective, then gives up
    else:
        for collective in (
            lambda: dist.barrier(group=group),
            lambda: dist.all_reduce(torch.ones(1)),
        ):
            started = time.monotonic()
            with pytest.raises(RuntimeError, match="Timed out waiting 2000ms"):
                collective()
            assert time.monotonic() - started < 4
    os._exit(0)  # the groups are broken now: a clean barrier and destroy would fail
