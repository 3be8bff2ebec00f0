"""The ``train_lm`` command line under torchrun with a fault on one rank: the hang and rank-agreement tests.

``fault_worker.py REPORT [--stop-rank R --stop-at step:N|save:N] [--cwd-per-rank DIR] -- TRAIN_LM ARGS``

- every rank writes ``REPORT.pid<rank>`` (its PID) at start, so a test can check none is left alive;
- ``--stop-at step:N`` stops rank ``R`` with SIGSTOP as step ``N`` begins (before its collectives),
  ``save:N`` inside the save of step ``N`` (before DCP's collectives); the rank first writes
  ``REPORT.stopped`` (the wall-clock time it stops at, for the test to time the job's end from) and starts
  a watcher process that SIGKILLs it once rank 0 has ended. That stands in for torchrun's own SIGKILL,
  which comes 30 s after its SIGTERM (a stopped process cannot act on SIGTERM): torch 2.13's agent stops
  failed workers with a fixed 30 s grace, whatever ``--shutdown-timeout`` says. What the test times is
  then what this project controls: how soon the ranks still running give up on the stopped one;
- ``--cwd-per-rank DIR`` runs each rank in ``DIR/rank<r>``: a relative ``checkpoint.folder`` is then the
  same config value on every rank with different contents, as on node-local disks.

The rest is ``python -m hyper_parallel.train_lm TRAIN_LM ARGS``, exit status included.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


_WATCHER = """
import os, signal, sys, time
stopped, watched = int(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun's SIGTERM to the stopped rank reaches it too
def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
deadline = time.monotonic() + 150
while alive(watched) and time.monotonic() < deadline:
    time.sleep(0.1)
os.kill(stopped, signal.SIGKILL)
"""


def _stop_here(report: str) -> None:
    rank0 = int(Path(f"{report}.pid0").read_text())
    watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid()), str(rank0)])
    Path(f"{report}.pid-watcher").write_text(str(watcher.pid))
    Path(f"{report}.stopped").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)


def _install_stop(report: str, stop_at: str) -> None:
    what, _, number = stop_at.partition(":")
    step = int(number)
    if what == "step":
        from hyper_parallel.trainer._trainer import Trainer

        train_step = Trainer.train_step

        def stopping_step(self: Any) -> Any:
            if self.step + 1 == step:
                _stop_here(report)
            return train_step(self)

        Trainer.train_step = stopping_step  # type: ignore[method-assign]
    elif what == "save":
        from hyper_parallel.components.checkpoint import _manager

        dcp_save = _manager.dcp_save

        def stopping_save(state: Any, **kwargs: Any) -> Any:
            if Path(str(kwargs["checkpoint_id"])).name.endswith(f"step-{step}.partial"):
                _stop_here(report)
            return dcp_save(state, **kwargs)

        _manager.dcp_save = stopping_save  # type: ignore[assignment]
    else:
        raise SystemExit(f"--stop-at: step:N or save:N, got {stop_at!r}")


def main(argv: list[str]) -> None:
    split = argv.index("--")
    own, train_args = argv[:split], argv[split + 1 :]
    report, options = own[0], dict(zip(own[1::2], own[2::2], strict=True))
    rank = int(os.environ["RANK"])
    Path(f"{report}.pid{rank}").write_text(str(os.getpid()))
    if "--cwd-per-rank" in options:
        here = Path(options["--cwd-per-rank"]) / f"rank{rank}"
        here.mkdir(parents=True, exist_ok=True)
        os.chdir(here)
    if "--stop-at" in options and int(options["--stop-rank"]) == rank:
        _install_stop(report, options["--stop-at"])
    from hyper_parallel._cli import finish
    from hyper_parallel.launch import main as launch_main

    finish(launch_main(train_args, prog="train_lm"))


if __name__ == "__main__":
    main(sys.argv[1:])
