"""A command's ``main(argv)`` run in a child process, with the child's own peak resident memory.

The memory bounds of the readers (SECURITY.md) are asserted as the issue's audit measured them: the peak
RSS of a child process, read inside it. Linux's ``ru_maxrss`` of a process keeps the high-water mark of the
memory it held before ``exec`` (the forked copy of the test process, gigabytes late in a suite run), so the
child reads its own address space's high-water mark instead, ``VmHWM`` of ``/proc/self/status``
(:data:`OWN_PEAK_KIB`, also used by ``tests.support.prepared``): nothing the test process or an earlier
child held is counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["OWN_PEAK_KIB", "RSS_BOUND", "run_with_peak_rss"]

#: Peak resident memory a reader may reach on inputs of a few MB (issue 46: 1.5 GB).
RSS_BOUND = 1536 << 20
_MARK = "peak_rss_kib "
#: Source of ``own_peak_kib()`` for a child: its address space's peak resident KiB since ``exec``.
OWN_PEAK_KIB = """
def own_peak_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")
"""
_CHILD = (
    OWN_PEAK_KIB
    + """
import sys
from hyper_parallel.{module} import main
try:
    status = main(sys.argv[1:])
finally:  # a traceback too: its peak is what a test reports
    print({mark!r}, own_peak_kib(), file=sys.stderr, flush=True)
sys.exit(status or 0)
"""
)


def run_with_peak_rss(module: str, argv: list[str], *, timeout: float = 300) -> tuple[int, str, int]:
    """``hyper_parallel.MODULE.main(argv)`` in a child process: its exit status, its stderr (without the
    measurement) and its peak RSS in bytes."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code = _CHILD.format(module=module, mark=_MARK.strip())
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=timeout, env=env
    )
    lines = done.stderr.splitlines(keepends=True)
    peaks = [int(line.split()[1]) for line in lines if line.startswith(_MARK)]
    if not peaks:
        raise AssertionError(
            f"the child printed no peak RSS (status {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.returncode, "".join(line for line in lines if not line.startswith(_MARK)), peaks[0] << 10
