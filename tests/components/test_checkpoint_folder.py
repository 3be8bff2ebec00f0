"""One run per checkpoint folder: the lock, and entries that are symbolic links (never followed)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.checkpoint import DCPCheckpoint  # noqa: E402
from hyper_parallel.components.checkpoint._layout import (  # noqa: E402
    CheckpointFolderError,
    lock_folder,
)
from tests.support.processes import clean_env  # noqa: E402
from tests.support.trainer import ROOT, as_flags, debug_config_path, tiny_overrides  # noqa: E402

LINK_ADVICE = "a checkpoint folder holds only real files and folders, so it is never followed: remove it"


def manager(folder: Path) -> Any:
    return DCPCheckpoint.Config(enable=True, folder=str(folder)).build(torch.nn.Linear(2, 2))


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder outside the checkpoint folder holding a file a followed link would overwrite."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "config.yaml").write_text("mine: true\n")
    (target / ".metadata").write_bytes(b"not a checkpoint")
    return target


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_second_launch_on_a_locked_folder_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    jsonl = tmp_path / "metrics.jsonl"
    held = lock_folder(folder)  # this process is the first run
    try:
        assert (folder / ".lock").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        overrides = tiny_overrides(
            "llama3",
            **{
                "checkpoint.enable": "true",
                "checkpoint.folder": str(folder),
                "metrics.enable_jsonl": "true",
                "metrics.jsonl_path": str(jsonl),
            },
        )
        command = [
            sys.executable,
            "-m",
            "hyper_parallel.train_lm",
            "--config-file",
            str(debug_config_path("llama3")),
        ]
        second = subprocess.run(
            [*command, *as_flags(overrides)],
            capture_output=True,
            text=True,
            timeout=240,
            env=clean_env(),
            cwd=ROOT,
        )
    finally:
        held.release()
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.splitlines()[-1] == (
        f"{folder}: checkpoint.folder: in use by another run: PID {os.getpid()} on {socket.gethostname()} "
        f"holds '{folder / '.lock'}'; wait for it to end or use another checkpoint.folder"
    )
    assert "Traceback" not in second.stderr
    assert not jsonl.exists()  # refused before the metrics file is opened: two runs never interleave it
    assert sorted(p.name for p in folder.iterdir()) == []  # the lock file goes with its holder


def test_a_folder_is_locked_for_as_long_as_its_manager_is_open(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    first = manager(folder)
    assert (folder / ".lock").read_text().split()[0] == str(os.getpid())
    first.close()
    assert not (folder / ".lock").exists()
    manager(folder).close()


def test_a_planted_partial_symlink_is_refused_and_the_target_outside_is_untouched(
    tmp_path: Path, elsewhere: Path
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    before = snapshot(elsewhere)
    (folder / ".step-2.partial").symlink_to(elsewhere)
    with pytest.raises(CheckpointFolderError) as caught:
        manager(folder)
    assert str(caught.value) == (
        f"{folder / '.step-2.partial'}: checkpoint.folder: '.step-2.partial' is a symbolic link (to "
        f"'{elsewhere}'); {LINK_ADVICE}"
    )
    assert snapshot(elsewhere) == before
    assert (folder / ".step-2.partial").is_symlink()  # refused, never removed through


def test_a_partial_symlink_planted_during_the_run_is_refused_at_the_save_and_the_target_is_untouched(
    tmp_path: Path, elsewhere: Path
) -> None:
    folder = tmp_path / "ckpt"
    run = manager(folder)
    run.save(1)
    before = snapshot(elsewhere)
    (folder / ".step-2.partial").symlink_to(elsewhere)
    with pytest.raises(CheckpointFolderError, match=r"'\.step-2\.partial' is a symbolic link"):
        run.save(2)
    assert snapshot(elsewhere) == before
    assert sorted(p.name for p in folder.iterdir()) == [".lock", ".step-2.partial", "step-1"]
    run.close()


def test_a_step_folder_that_is_a_symlink_is_refused(tmp_path: Path, elsewhere: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "step-7").symlink_to(elsewhere)
    with pytest.raises(CheckpointFolderError) as caught:
        manager(folder)
    assert str(caught.value) == (
        f"{folder / 'step-7'}: checkpoint.folder: 'step-7' is a symbolic link (to '{elsewhere}'); "
        + LINK_ADVICE
    )


def test_a_lock_file_that_is_a_symlink_is_refused_and_the_target_is_untouched(
    tmp_path: Path, elsewhere: Path
) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    before = snapshot(elsewhere)
    (folder / ".lock").symlink_to(elsewhere / "config.yaml")
    with pytest.raises(CheckpointFolderError, match=r"'\.lock' is a symbolic link"):
        manager(folder)
    assert snapshot(elsewhere) == before


def test_a_checkpoint_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(CheckpointFolderError, match="exists and is not a directory"):
        manager(tmp_path / "ckpt")


def test_a_folder_refusal_survives_the_pickling_that_sends_it_to_every_rank(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("x")
    with pytest.raises(CheckpointFolderError) as caught:
        manager(tmp_path / "ckpt")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is CheckpointFolderError
    assert str(copy) == str(caught.value)
