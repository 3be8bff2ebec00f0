"""Ranks agree or stop: different resolved configs or checkpoint views stop every rank at once, exit 2.

Two CPU ranks under torchrun. ``${env:RANK}`` in an override gives each rank another value; a relative
``checkpoint.folder`` run from a folder per rank (``tests/support/fault_worker.py --cwd-per-rank``) is the
same config value with different contents, as on node-local disks. Without the check these runs hung until
killed (ranks waiting in different collectives) or diverged silently (another seed).
"""

from __future__ import annotations

import re
import subprocess
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.config import ConfigWarning  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import as_flags, debug_config_path, tiny_config, tiny_overrides  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]

FAULT_WORKER = str(Path(__file__).parents[1] / "support" / "fault_worker.py")
TRAIN_LM = ["-m", "hyper_parallel.train_lm", "--config-file", str(debug_config_path("llama3"))]
#: Seconds a refused two-rank launch may take (start-up included); a hang would last the timeouts.
FAST = 60


def _exit_statuses(done: subprocess.CompletedProcess[str]) -> list[int]:
    """Every rank's exit status as torchrun's failure summary reports it (torchrun itself exits 1)."""
    return [int(code) for code in re.findall(r"exitcode\s*: (-?\d+)", done.stderr)]


def _refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode != 0, done.stdout[-2000:]
    assert 2 in _exit_statuses(done), done.stderr[-4000:]
    assert set(_exit_statuses(done)) <= {2, -15}, done.stderr[-4000:]  # -15: torchrun stopped it first
    assert f"training stopped: {message}\n" in done.stderr
    assert done.stderr.count("training stopped:") == 1  # rank 0 prints it, once
    assert "]: Traceback" not in done.stderr  # no rank's (torchrun prints its own ChildFailedError)


def _timeouts(**extra: str) -> dict[str, str]:
    """Timeouts that would make a hang last: the refusal must come from the check, not from them."""
    return {"comm.init_timeout_seconds": "120", "comm.train_timeout_seconds": "120", **extra}


def test_ranks_with_different_max_steps_stop_at_once_naming_the_field_and_ranks() -> None:
    overrides = tiny_overrides("llama3", **_timeouts(**{"training.max_steps": "1${env:RANK}"}))
    done = torchrun(2, *TRAIN_LM, *as_flags(overrides), timeout=FAST)
    _refused(
        done,
        "the ranks resolved different configs: training.max_steps (rank 0: 10, rank 1: 11); every rank "
        "must resolve the same config (check ${env:...} interpolations and files that differ between nodes)",
    )


def test_ranks_with_different_seeds_are_refused_like_any_config_difference() -> None:
    overrides = tiny_overrides("llama3", **_timeouts(**{"training.seed": "${env:RANK}"}))
    done = torchrun(2, *TRAIN_LM, *as_flags(overrides), timeout=FAST)
    _refused(
        done,
        "the ranks resolved different configs: training.seed (rank 0: 0, rank 1: 1); every rank must "
        "resolve the same config (check ${env:...} interpolations and files that differ between nodes)",
    )


def test_ranks_seeing_different_checkpoints_stop_naming_the_step_each_rank_sees(tmp_path: Path) -> None:
    checkpointing = {
        "checkpoint.enable": "true",
        "checkpoint.interval": "2",
        "checkpoint.last_save_model_only": "false",
        "training.max_steps": "2",
    }
    # rank 1's node-local disk holds a checkpoint of step 2; rank 0's is empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        single = {**checkpointing, "checkpoint.folder": str(tmp_path / "rank1" / "ckpt")}
        trainer = LLMTrainer(tiny_config("llama3", single))
    trainer.train()
    trainer.close()
    assert (tmp_path / "rank1" / "ckpt" / "step-2").is_dir()
    overrides = tiny_overrides(
        "llama3", **_timeouts(**{**checkpointing, "checkpoint.folder": "ckpt", "training.max_steps": "4"})
    )
    command = [FAULT_WORKER, str(tmp_path / "report"), "--cwd-per-rank", str(tmp_path), "--"]
    done = torchrun(2, *command, *TRAIN_LM[2:], *as_flags(overrides), timeout=FAST)
    _refused(
        done,
        "checkpoint.folder 'ckpt': the ranks see different newest checkpoints (rank 0: no checkpoint, "
        "rank 1: step 2); every rank must see the same folder (a shared file system, not node-local disks)",
    )
