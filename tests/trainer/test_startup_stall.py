"""A rank that never joins the process group at start-up: the others stop with one line (N13).

Rank 0 of a two-rank job starts alone (its peer stalled before ``init_process_group``): the rendezvous
times out after ``comm.init_timeout_seconds`` and the launch prints the usual collective line and exits
1, where it printed a ``DistStoreError`` traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.trainer import ROOT, as_flags, debug_config_path, tiny_overrides


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_peer_that_never_joins_ends_start_up_with_one_line() -> None:
    pytest.importorskip("torch")
    flags = as_flags(
        tiny_overrides("llama3", **{"comm.init_timeout_seconds": "2", "training.max_steps": "1"})
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "0",  # the store picks a free port: no other rank will find it
    }
    argv = [
        sys.executable,
        "-m",
        "hyper_parallel.train_lm",
        "--config-file",
        str(debug_config_path("llama3")),
    ]
    done = subprocess.run([*argv, *flags], capture_output=True, text=True, env=env, timeout=110)
    assert done.returncode == 1, done.stderr
    assert done.stderr.endswith(
        "training stopped: rank 0: start-up: init_process_group timed out (comm.init_timeout_seconds = 2): "
        "another rank stopped or is stalled\n"
    )
    assert "Traceback" not in done.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_peer_that_never_joins_under_torchrun_ends_start_up_with_one_line() -> None:
    """Under torchrun the store is the agent's: gloo waits in it for the stalled peer's address and torch
    raises ``DistStoreError: wait timeout after ...ms`` (a traceback before); rank 0 prints the same line."""
    pytest.importorskip("torch")
    from tests.support.processes import torchrun

    flags = as_flags(
        tiny_overrides("llama3", **{"comm.init_timeout_seconds": "3", "training.max_steps": "1"})
    )
    config = str(debug_config_path("llama3"))
    done = torchrun(2, "-m", "tests.support.stalled_peer", "--config-file", config, *flags, timeout=150)
    assert done.returncode != 0
    ours = [
        line for line in done.stderr.splitlines() if "training stopped" in line or "DistStoreError" in line
    ]
    assert ours == [
        "training stopped: rank 0: start-up: init_process_group timed out (comm.init_timeout_seconds = 3): "
        "another rank stopped or is stalled"
    ], done.stderr[-3000:]
    # no traceback through our code (torchrun's own remains; its frames may lie under ROOT in a venv there)
    assert 'File "' + str(ROOT / "hyper_parallel") not in done.stderr
