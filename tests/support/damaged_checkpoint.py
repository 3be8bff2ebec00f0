"""What the tests of damaged checkpoint folders share: a tiny run's folder (full checkpoints of steps 1 and
2) to copy and damage, a ``.metadata`` rewritten with its manifest forged to match (as a hostile folder
would), and a resume of such a folder for one more step that returns the checkpoint manager's warnings."""

from __future__ import annotations

import io
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.trainer import checkpointed_run_argv

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

__all__ = ["MANAGER_LOG", "resume_warnings", "rewrite", "save_two_steps"]

MANAGER_LOG = "hyper_parallel.components.checkpoint._manager"


def save_two_steps(folder: Path) -> Path:
    """``folder`` holding the full checkpoints of steps 1 and 2 of a tiny Llama 3 run."""
    from hyper_parallel.launch import main

    assert main(checkpointed_run_argv(folder, 2), out=io.StringIO(), err=io.StringIO()) == 0
    return folder


def rewrite(step: Path, change: Callable[[Metadata], None]) -> None:
    """Change ``step``'s ``.metadata`` (only DCP's classes: the restricted unpickler admits it) and forge
    the checksum manifest to match, as a hostile folder would."""
    from hyper_parallel.components.checkpoint._manifest import write_manifest
    from hyper_parallel.components.checkpoint._safe_read import read_metadata

    metadata = read_metadata(step / ".metadata")
    change(metadata)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    write_manifest(step)


def resume_warnings(ckpt: Path, caplog: pytest.LogCaptureFixture) -> str:
    """Resume ``ckpt`` for one more step (it must end well, without a traceback, saving step 3); the
    checkpoint manager's warnings."""
    from hyper_parallel.launch import main

    err = io.StringIO()
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOG):
        assert main(checkpointed_run_argv(ckpt, 3), out=io.StringIO(), err=err) == 0, err.getvalue()
    assert "Traceback" not in err.getvalue()
    assert (ckpt / "step-3").is_dir()
    return caplog.text
