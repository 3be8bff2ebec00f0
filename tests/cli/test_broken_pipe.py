"""A command whose reader stopped reading (``| head``) ends quietly with 141, as a shell shows SIGPIPE.

The reader is gone before the command starts (the read end of its stdout pipe is closed), so every write
meets a broken pipe deterministically, whatever the size of the output and the pipe's buffer.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_parallel._cli import EXIT_BROKEN_PIPE

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("command", "status"),
    [
        (
            [
                "hyper_parallel.train_lm",
                "--config-file",
                "configs/qwen3_5.yaml",
                "--dry-run",
                "--no-file-checks",
            ],
            EXIT_BROKEN_PIPE,
        ),
        (["hyper_parallel.train_vl", "--help"], EXIT_BROKEN_PIPE),
        (["hyper_parallel.config", "schema"], EXIT_BROKEN_PIPE),
        (["hyper_parallel.evaluate", "--help"], EXIT_BROKEN_PIPE),
        # argparse prints their help and drops a write error itself (``ArgumentParser._print_message``)
        (["hyper_parallel.data", "--help"], 0),
        (["hyper_parallel.generate", "--help"], 0),
        (["hyper_parallel.export", "--help"], 0),
    ],
    ids=lambda value: value[0].removeprefix("hyper_parallel.") if isinstance(value, list) else str(value),
)
def test_a_closed_stdout_ends_the_command_quietly(command: list[str], status: int) -> None:
    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", *command],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (status, "")
