"""Runs ``train_lm`` launches as forked children of one process that has imported the project: the kill loop.

``relauncher.py`` reads requests on stdin, one JSON object a line: ``{"args": [TRAIN_LM ARGS], "out": PATH,
"err": PATH, "fault": null | "sigint-twice-in-save"}``. For each it forks a child that is exactly ``python -m
hyper_parallel.train_lm ARGS`` (its stdout and stderr written to ``out`` and ``err``, its exit status the
launch's), and prints on stdout, one line each:

- ``started PID`` once the child runs;
- ``save-begins STEP`` and ``save-ends STEP SECONDS`` around each checkpoint save of the child (the
  checkpoint manager's ``save``, publishing and pruning included), so a test can kill it at a chosen point;
- ``exited STATUS`` when the child has ended (``-N``: killed by signal ``N``).

Why a fork: a fresh interpreter spends ~3 s importing torch and the project on a small machine, which a
kill loop would pay at every relaunch. A fork of a process that has imported them and run nothing else
starts a launch at once; the launch itself (config, build, resume, train) is the real one in a process
of its own, and what a ``kill -9`` leaves on disk, and what the next launch resumes from, do not depend on
how the interpreter started. ``fault: sigint-twice-in-save`` sends the child two SIGINTs from inside DCP's
write of its first save (after the partial folder exists), the second of which must end it at once.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from importlib import import_module

from hyper_parallel.components.checkpoint import _manager
from hyper_parallel.launch import main as launch_main

#: What a launch of the tiny debug model imports (found by comparing ``sys.modules`` before and after
#: one): imported here once, before any fork, so a child spends its time on the launch itself.
_LAUNCH_IMPORTS = (
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "hyper_parallel.config.overrides",
    "hyper_parallel.models.llama3",
    "hyper_parallel.models._weights",
    "hyper_parallel.parallel.parallelize",
    "hyper_parallel.trainer._llm",
)
for _module in _LAUNCH_IMPORTS:
    import_module(_module)

_REPORT = os.dup(1)  # the relauncher's stdout, for the children's markers


def _say(line: str) -> None:
    os.write(_REPORT, f"{line}\n".encode())  # one write: lines of parent and child never interleave


def _announce_saves() -> None:
    save = _manager.CheckpointManager.save

    def announced(self: Any, step: int, **kwargs: Any) -> Any:
        _say(f"save-begins {step}")
        started = time.perf_counter()
        result = save(self, step, **kwargs)
        _say(f"save-ends {step} {time.perf_counter() - started:.4f}")
        return result

    _manager.CheckpointManager.save = announced  # type: ignore[method-assign]


def _sigint_twice_in_save() -> None:
    dcp_save = _manager.dcp_save

    def interrupted(state: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # the first asks to stop after the step (handled at once)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # the second must exit now, mid-save
        time.sleep(5)
        return dcp_save(state, **kwargs)

    _manager.dcp_save = interrupted  # type: ignore[assignment]


def _child(request: dict[str, Any]) -> None:
    try:
        os.dup2(os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        os.close(0)
        if request.get("fault") == "sigint-twice-in-save":
            _sigint_twice_in_save()
        status = launch_main(request["args"], prog="train_lm")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a traceback, as the command line would print it
        import traceback

        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main() -> None:
    _announce_saves()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _say(f"started {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"exited {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    main()
