"""A write the disk has no room for is one line and exit 2, whatever the errno: no space (ENOSPC, see
``test_input_errors.py``), a quota (EDQUOT) or a file-size limit (EFBIG, ``ulimit -f``), in checkpoint
saves and in both kinds of export; the partial folder is removed and nothing is published."""

from __future__ import annotations

import errno
import io
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from hyper_parallel.launch import main
from tests.support.processes import clean_env
from tests.support.trainer import checkpointed_run_argv

#: Every step logged: the tiny run's log_freq of 1000 would log none and warn so on stderr, which is asserted.
LOGGED = {"metrics.log_freq": "1"}
PHRASES = {errno.EDQUOT: "disk quota exceeded (EDQUOT)", errno.EFBIG: "file too large (EFBIG)"}


def _refusal(folder: Path, phrase: str, step: int, kept: str) -> str:
    return (
        f"{folder}: {phrase} while saving step {step}: its partial folder was removed and {kept}; free "
        "space, lower checkpoint.keep_latest_k or move checkpoint.folder, then relaunch to resume\n"
    )


@pytest.mark.parametrize("code", list(PHRASES))
def test_a_save_over_a_quota_or_a_file_size_limit_exits_2_and_keeps_the_previous_checkpoint(
    code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint import filesystem

    write_item = filesystem._write_item

    def fail_at_step_2(transforms: Any, stream: Any, *args: Any) -> Any:
        if ".step-2.partial" in str(getattr(stream, "name", "")):
            raise OSError(code, os.strerror(code))
        return write_item(transforms, stream, *args)

    monkeypatch.setattr(filesystem, "_write_item", fail_at_step_2)
    folder = tmp_path / "ckpt"
    err = io.StringIO()
    status = main(checkpointed_run_argv(folder, 2, **LOGGED), out=io.StringIO(), err=err)
    kept = "the newest complete checkpoint, step 1, is kept"
    assert (status, err.getvalue()) == (2, _refusal(folder, PHRASES[code], 2, kept))
    assert sorted(p.name for p in folder.iterdir()) == ["step-1"]


def _limit_file_size() -> None:
    """In the child: files of at most 64 KiB (Python ignores SIGXFSZ, so a longer write fails with EFBIG)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


@pytest.mark.multiprocess
def test_a_real_file_size_limit_during_a_save_is_one_line(tmp_path: Path) -> None:
    """``ulimit -f`` for real: the first checkpoint's shard is larger than the limit."""
    folder = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-m", "hyper_parallel.train_lm", *checkpointed_run_argv(folder, 1, **LOGGED)],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        preexec_fn=_limit_file_size,
    )
    assert (done.returncode, done.stderr) == (
        2,
        _refusal(folder, PHRASES[errno.EFBIG], 1, "no checkpoint is kept"),
    ), done.stderr[-2000:]
    assert [p.name for p in folder.iterdir()] == []


@pytest.mark.parametrize("code", [errno.ENOSPC, *PHRASES])
@pytest.mark.parametrize("adapter_only", [False, True])
def test_an_export_over_the_disks_limits_is_one_line_and_publishes_nothing(
    code: int, adapter_only: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merged model and the adapter-only folder are written alike: the partial folder removed, one
    ``ExportError`` naming the output and the errno."""
    import safetensors.torch
    import torch

    from hyper_parallel import export

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "out"
    tensors = {"w": torch.zeros(2)}
    if adapter_only:
        write = lambda: export._write_adapter(out, tensors, {"peft_type": "LORA"})  # noqa: E731
    else:
        write = lambda: export._write(out, tensors, {"model_type": "llama"}, 1 << 30, {})  # noqa: E731
    with pytest.raises(export.ExportError) as caught:
        write()
    phrase = PHRASES.get(code, "no space left on device (ENOSPC)")
    assert str(caught.value) == (
        f"{str(out)!r}: {phrase}; nothing was published: free space or choose another output folder"
    )
    assert list(tmp_path.iterdir()) == []
