"""How every command of ours ends: with its ``main``'s status, quietly when the reader went away.

Python ignores SIGPIPE, so a command whose output is piped into a reader that stops early (``| head``)
gets ``BrokenPipeError`` on its next write, or on the final flush, and ends with a traceback that says
nothing about the user's input. A C program would be killed by the signal; we end the same way a shell
reports that (status 141, ``128 + SIGPIPE``), without a word, having pointed the standard streams at
``/dev/null`` so the interpreter's own last flush cannot fail again.

After a multi-process run (``WORLD_SIZE`` > 1, which torchrun exports), the process group is destroyed
by then, but gloo's worker threads can outlive it in C++; tearing them down while Python finalises
aborts the process now and then ("terminate called without an active exception"), turning a finished run
into a crash. Such a process flushes its output and leaves without finalising: nothing else remains to
run.

While a command starts (its modules load, its config is read) the cyclic collector is paused
(:func:`collection_paused`): what is made then lives as long as the process, and a collection finds
nothing to free however often it runs (Mercurial pauses it the same way while it builds large structures).

Any process first takes every object out of the collector's sight (``gc.freeze()``): finalising runs a
full collection over everything the process ever made (every imported module, class and compiled
function), which is most of the time a short command such as ``--dry-run`` spends leaving, and gives back
memory the process is about to give back whole. What must be written is written before (files are
closed by their owners; a finaliser is not a place to write data, and Python does not promise to run the
finalisers of objects still alive at exit). This module imports the standard library only.
"""

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

__all__ = ["EXIT_BROKEN_PIPE", "collection_paused", "finish", "run"]

EXIT_BROKEN_PIPE = 141
"""The status of a command whose reader stopped reading: a shell's status for a process killed by SIGPIPE."""


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block, as it was after it (see the module's docstring)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run(main: Callable[[], int]) -> NoReturn:
    """Run a command's ``main`` and exit with its status (see the module's docstring)."""
    try:
        status = main()
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        _silence()
        status = EXIT_BROKEN_PIPE
    finish(status)


def finish(status: int) -> NoReturn:
    """Exit with ``status``; after a multi-process run, without finalising the interpreter."""
    gc.freeze()
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "0", "1"):
        sys.exit(status)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        status = EXIT_BROKEN_PIPE
    os._exit(status)


def _silence() -> None:
    """Point stdout and stderr at ``/dev/null``: whatever is still buffered goes nowhere, without an error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a stream replaced by one without a descriptor
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
