"""Every path we read or write is a regular file (or a folder where one is named), told without waiting: a
FIFO, a socket or a device as the metrics file, as ``plot``'s input, as data, tokenizer or weights, or inside
a folder the config names, is refused at once with one line and exit 2.

``os.mkfifo`` makes each FIFO (no process ever opens its other end, so opening it to read or write would
wait forever). Commands that used to wait run in a child process whose timeout only guards against a hang.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hyper_parallel._paths import NotRegularFileError, open_regular
from hyper_parallel.launch import main as launch_main
from tests.support.processes import clean_env
from tests.support.trainer import as_flags, debug_config_path, tiny_overrides

FIFO = "is a FIFO, not a regular file: give a file (it would be waited on or read forever)"
#: Seconds a child gets: only a guard against a hang (each takes about a second).
HANG_GUARD = 120


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _child(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=HANG_GUARD, env=clean_env()
    )


@pytest.mark.multiprocess
def test_a_fifo_as_plots_input_is_refused_at_once(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "metrics.jsonl")
    done = _child("-m", "hyper_parallel.plot", str(fifo), "-o", str(tmp_path / "curves.png"))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{fifo}: {FIFO}\n")


@pytest.mark.multiprocess
def test_a_fifo_as_the_metrics_file_is_refused_at_dry_run_and_at_launch(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "metrics.jsonl")
    overrides = tiny_overrides(
        "llama3",
        **{"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(fifo), "training.max_steps": "1"},
    )
    argv = ["-m", "hyper_parallel.train_lm", "--config-file", str(debug_config_path("llama3"))]
    message = f"--metrics.jsonl_path: {str(fifo)!r} {FIFO}\n1 problem found; nothing was started.\n"
    for extra in (["--dry-run"], []):
        done = _child(*argv, *as_flags(overrides), *extra)
        assert (done.returncode, done.stderr) == (2, message), done.stderr[-2000:]


def test_the_metrics_writer_refuses_a_fifo_or_a_device_without_waiting(tmp_path: Path) -> None:
    """The writer's own check (the launch's looked at the path before; a test may build the writer alone)."""
    from hyper_parallel.components.metrics import MetricsLogger
    from hyper_parallel.components.metrics._runtime import MetricsProcessor
    from hyper_parallel.errors import InputFileError

    fifo = _fifo(tmp_path / "metrics.jsonl")
    for path, kind in ((str(fifo), FIFO), ("/dev/null", FIFO.replace("a FIFO", "a device"))):
        cfg = MetricsLogger.Config(log_freq=1, enable_jsonl=True, jsonl_path=path)
        with pytest.raises(InputFileError) as caught:
            MetricsProcessor(cfg, rank=0, stream=io.StringIO())
        assert str(caught.value.issues[0]) == f"{path}: {kind}; set metrics.jsonl_path to a file"


def test_readers_refuse_a_fifo_or_a_device_without_waiting(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError, match=f"^{re.escape(FIFO)}$"):
        open_regular(_fifo(tmp_path / "data.jsonl"))
    with pytest.raises(NotRegularFileError, match=r"^is a device, not a regular file"):
        open_regular("/dev/zero")  # read forever otherwise
    with pytest.raises(NotRegularFileError, match=r"^is a folder, not a file$"):
        open_regular(tmp_path)


def _launch_dry_run(overrides: dict[str, str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    flags = as_flags(tiny_overrides("llama3", **overrides))
    status = launch_main(
        ["--config-file", str(debug_config_path("llama3")), *flags, "--dry-run"], out=out, err=err
    )
    return status, err.getvalue()


@pytest.mark.parametrize(
    "named", ["data file", "data folder entry", "tokenizer folder entry", "weights entry"]
)
def test_a_fifo_among_the_files_a_config_names_is_refused_at_dry_run(tmp_path: Path, named: str) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    if named == "data file":
        fifo = _fifo(tmp_path / "data.jsonl")
        overrides = {"dataloader.dataset.source": "jsonl", "dataloader.dataset.paths": f"[{fifo}]"}
        field, shown = "dataloader.dataset.paths[0]", repr(str(fifo))
    else:
        fifo = _fifo(
            folder
            / {"data folder entry": "a.jsonl", "tokenizer folder entry": "tokenizer.json"}.get(
                named, "model.safetensors"
            )
        )
        shown = repr(str(fifo))
        if named == "data folder entry":
            overrides = {"dataloader.dataset.source": "jsonl", "dataloader.dataset.paths": f"[{folder}]"}
            field = "dataloader.dataset.paths[0]"
        elif named == "tokenizer folder entry":
            overrides = {
                "tokenizer._target_": "hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config",
                "tokenizer.path": str(folder),
            }
            field = "tokenizer.path"
        else:
            overrides = {"model.weights_path": str(folder)}
            field = "model.weights_path"
    status, err = _launch_dry_run(overrides)
    assert status == 2
    assert f"{field}: {shown} {FIFO}\n" in err  # located at the flag that set it


@pytest.mark.multiprocess
def test_a_fifo_safetensors_shard_is_refused_when_its_header_is_read(tmp_path: Path) -> None:
    """The weights reader itself (export, generate read an exported folder's shards through it)."""
    fifo = _fifo(tmp_path / "model-00001-of-00002.safetensors")
    code = (
        "import sys; from pathlib import Path; from hyper_parallel.errors import InputFileError\n"
        "from hyper_parallel.models._weights_check import read_header\n"
        "try:\n    read_header(Path(sys.argv[1]))\nexcept InputFileError as exc:\n    print(exc.issues[0])\n"
    )
    done = _child("-c", code, str(fifo))
    assert (done.returncode, done.stdout) == (0, f"{fifo}: cannot be read: {FIFO}\n"), done.stderr[-2000:]


def test_a_fifo_in_the_folder_generate_reads_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from hyper_parallel.generate import main as generate_main

    fifo = _fifo(tmp_path / "model.safetensors")
    assert generate_main([str(tmp_path), "--prompt", "hi"]) == 2
    assert capsys.readouterr().err == f"generate: {str(fifo)!r} {FIFO}\n"


def test_a_fifo_as_an_image_is_refused_from_the_record(tmp_path: Path) -> None:
    from hyper_parallel.errors import InputFileError
    from hyper_parallel.models.qwen3_5.images import image_size

    fifo = _fifo(tmp_path / "cat.png")
    with pytest.raises(InputFileError) as caught:
        image_size(fifo, "data.jsonl:1")
    assert str(caught.value.issues[0]) == f"data.jsonl:1: image {str(fifo)!r} {FIFO}"


def test_a_fifo_beside_a_tokenizer_file_is_refused_not_skipped(tmp_path: Path) -> None:
    """``tokenizer.path`` naming the file itself: the ``tokenizer_config.json`` beside it is read too."""
    from hyper_parallel.components.tokenizer._runtime import locate_tokenizer
    from hyper_parallel.errors import InputFileError

    (tmp_path / "tokenizer.json").write_text("{}")
    fifo = _fifo(tmp_path / "tokenizer_config.json")
    with pytest.raises(InputFileError) as caught:
        locate_tokenizer(str(tmp_path / "tokenizer.json"))
    assert str(caught.value.issues[0]) == f"{fifo}: {FIFO}"
