"""The same text means the same number in every command: byte sizes and world sizes have one reader."""

import io
from pathlib import Path

import pytest

from hyper_parallel._numbers import read_size, read_world_size
from hyper_parallel.config.__main__ import main as config_main
from hyper_parallel.export import ExportError, parse_size
from hyper_parallel.launch import main as launch_main
from hyper_parallel.preflight.devices import parse_device

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "llama3_debug.yaml")


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("1.5 MiB", 3 * 2**19), ("2tb", 2 * 10**12), ("7KB", 7000)],
)
def test_a_size_reads_alike_as_device_memory_and_as_a_shard_size(text: str, nbytes: int) -> None:
    assert read_size(text) == (nbytes, text.lower().lstrip("0123456789. "))
    assert parse_device(text).memory == nbytes
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["80 parsecs", "GiB", "-1GB", "1e3"])
def test_what_is_not_a_size_is_refused_by_both(text: str) -> None:
    assert read_size(text) is None
    with pytest.raises(ExportError, match="cannot read"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "-2", "²", "1.5", "1" * 12, "two", ""])
def test_a_world_size_that_is_no_positive_integer_is_refused_by_every_command(text: str) -> None:
    assert read_world_size(text) is None
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", CONFIG, "--dry-run", "--world-size", text]
    code = launch_main(argv, out=out, err=err)
    assert code == 2
    assert f"--world-size: world size must be a positive integer, got {text!r}" in err.getvalue()
    assert config_main(["check", "--world-size", text, CONFIG]) == 2


def test_a_world_size_reads_alike_everywhere() -> None:
    assert [read_world_size(t) for t in ("1", " 8 ", "0064")] == [1, 8, 64]


@pytest.mark.parametrize("text", ["²", "0", "x"])
def test_evaluate_reads_world_size_alike(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyper_parallel.evaluate import main as evaluate_main

    monkeypatch.setenv("WORLD_SIZE", text)
    out, err = io.StringIO(), io.StringIO()
    assert evaluate_main(["--config-file", CONFIG], out=out, err=err) == 2
    assert f"$WORLD_SIZE: world size must be a positive integer, got {text!r}" in err.getvalue()


def test_a_thread_count_is_read_as_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyper_parallel.trainer.machine import intra_op_threads

    assert (
        intra_op_threads(None, {"OMP_NUM_THREADS": "²", "LOCAL_WORLD_SIZE": "²"}, cores=2, load=0.0)[0] == 2
    )
    assert intra_op_threads(None, {"OMP_NUM_THREADS": " 3 "}, cores=2, load=0.0)[0] == 3
