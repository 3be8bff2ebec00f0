"""Defaults that never waste a run (issue 35): data is named, and every sink's options do something.

Torch-free: each case runs the launch command in process (``--dry-run``), as a user meets it, and asserts
the exit status and the exact line printed.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hyper_parallel.launch import main
from hyper_parallel.trainer import machine
from hyper_parallel.trainer.rules import NO_DATA

LLAMA = "hyper_parallel.models.llama3.create_model_spec"
BYTES = "hyper_parallel.components.tokenizer.ByteTokenizer.Config"
TEXT = "hyper_parallel.components.dataloader.TextDataLoader.Config"


def launch(*argv: str, prog: str = "train_lm") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(list(argv), prog=prog, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def write(folder: Path, data: str | None) -> Path:
    """A Llama 3 debug config with the byte tokenizer, and ``data`` as its dataset section (None: none)."""
    text = f"model:\n  _target_: {LLAMA}\n  flavor: debugmodel\n  overrides:\n    vocab_size: 512\n"
    text += f"tokenizer:\n  _target_: {BYTES}\n"
    if data is not None:
        text += f"dataloader:\n  _target_: {TEXT}\n  dataset:\n{data}"
    path = folder / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("prog", ["train_lm", "train_vl"])
def test_a_run_without_a_data_source_is_refused_at_dry_run_naming_the_dataset(
    tmp_path: Path, prog: str
) -> None:
    path = write(tmp_path, None)
    status, _, err = launch("--config-file", str(path), "--dry-run", prog=prog)
    assert status == 2
    assert f"{path}:1:1: dataloader.dataset: {NO_DATA}\n" in err
    assert NO_DATA.endswith("random tokens only by name: source: synthetic")


def test_a_dataset_section_without_source_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "    seed: 3\n")
    status, _, err = launch("--config-file", str(path), "--dry-run")
    assert (status, err.splitlines()[0]) == (2, f"{path}:11:5: dataloader.dataset: {NO_DATA}")


def test_synthetic_tokens_train_when_named(tmp_path: Path) -> None:
    path = write(tmp_path, "    source: synthetic\n")
    status, out, err = launch("--config-file", str(path), "--dry-run")
    assert (status, err) == (0, "")
    assert "synthetic" in out


def test_paths_without_a_source_ask_for_the_format(tmp_path: Path) -> None:
    path = write(tmp_path, "    paths: [a.jsonl]\n")
    status, _, err = launch("--config-file", str(path), "--dry-run")
    assert status == 2
    assert "dataloader.dataset.source: must name the format of paths ['a.jsonl']: 'jsonl', 'text' or " in err


def test_an_enabled_validator_without_data_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "    source: python_docs\n")
    status, _, err = launch("--config-file", str(path), "--dry-run", "--validator.enable", "true")
    assert status == 2
    assert (
        "validator.dataset: names no validation data: set validator.dataset.source (and its paths), or set "
        "validator.enable to false" in err
    )


@pytest.mark.parametrize(
    ("flags", "path", "switch", "condition"),
    [
        (["--metrics.jsonl_path", "m.jsonl"], "metrics.jsonl_path", "enable_jsonl", "enable_jsonl is true"),
        (["--metrics.tensorboard_folder", "tb2"], "metrics.tensorboard_folder", "enable_tensorboard", None),
        (["--metrics.wandb_project", "p"], "metrics.wandb_project", "enable_wandb", None),
        (["--metrics.wandb_folder", "w"], "metrics.wandb_folder", "enable_wandb", None),
        (["--profiler.save_traces_folder", "t"], "profiler.save_traces_folder", "enable", None),
        (["--profiler.record_shapes", "true"], "profiler.record_shapes", "enable", None),
        (["--checkpoint.folder", "ck"], "checkpoint.folder", "enable", None),
        (["--checkpoint.interval", "5"], "checkpoint.interval", "enable", None),
        (["--checkpoint.async_mode", "async"], "checkpoint.async_mode", "enable", None),
        (
            ["--checkpoint.initial_load_model_only", "false"],
            "checkpoint.initial_load_model_only",
            "initial_load_path",
            "initial_load_path is set",
        ),
        (
            ["--comm.trace_buf_size", "0", "--comm.save_traces_folder", "x"],
            "comm.save_traces_folder",
            "trace_buf_size",
            "trace_buf_size > 0",
        ),
    ],
)
def test_an_option_of_a_sink_that_is_off_is_refused(
    tmp_path: Path, flags: list[str], path: str, switch: str, condition: str | None
) -> None:
    config = write(tmp_path, "    source: python_docs\n")
    status, _, err = launch("--config-file", str(config), "--dry-run", *flags)
    assert flags[-2] == f"--{path}"  # the flag that set it is where the problem is
    field = path.rsplit(".", 1)[1]
    expected = (
        f"{flags[-2]}: is only read when {condition or switch + ' is true'} (it is not): set {switch} "
        f"too, or leave {field} out"
    )
    assert (status, err.splitlines()[0]) == (2, expected)


def test_a_sink_turned_on_takes_its_options(tmp_path: Path) -> None:
    config = write(tmp_path, "    source: python_docs\n")
    flags = ["--metrics.enable_jsonl", "true", "--metrics.jsonl_path", str(tmp_path / "m.jsonl")]
    status, _, err = launch("--config-file", str(config), "--dry-run", *flags)
    assert (status, err) == (0, "")


def test_a_shipped_config_turns_its_jsonl_sink_off_with_its_path() -> None:
    config = "configs/llama3_debug.yaml"
    status, _, err = launch("--config-file", config, "--dry-run", "--metrics.enable_jsonl", "false")
    assert status == 2
    assert "metrics.jsonl_path: is only read when enable_jsonl is true (it is not)" in err
    flags = ["--metrics.enable_jsonl", "false", "--~metrics.jsonl_path"]
    assert launch("--config-file", config, "--dry-run", *flags)[0] == 0


X86_FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\n"
BF16_COST = (
    "training.mixed_precision_param: 'bfloat16' on this CPU, which has no bfloat16 instructions, is "
    "emulated: about 15x slower than 'float32' (measured on configs/llama3_debug.yaml); set it to "
    "'float32' to train on the CPU"
)


@pytest.mark.parametrize(
    ("dtype", "cpuinfo", "native"),
    [
        ("bfloat16", X86_FLAGS.format(extra=""), False),
        ("bfloat16", X86_FLAGS.format(extra="avx512_bf16"), True),
        ("bfloat16", X86_FLAGS.format(extra="amx_bf16 amx_tile"), True),
        ("bfloat16", "processor\t: 0\nFeatures\t: fp asimd bf16\n", True),
        ("float16", X86_FLAGS.format(extra="avx512_bf16"), False),
        ("bfloat16", "", None),
    ],
)
def test_cpu_instructions_for_a_dtype_are_read_from_cpuinfo(
    dtype: str, cpuinfo: str, native: bool | None
) -> None:
    assert machine.cpu_has_instructions_for(dtype, cpuinfo) is native


def test_bfloat16_on_a_cpu_without_its_instructions_is_a_warning_with_the_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(machine, "accelerator", lambda: "cpu")
    monkeypatch.setattr(machine, "cpu_has_instructions_for", lambda dtype, cpuinfo=None: False)
    config = "configs/llama3_debug.yaml"
    flags = ["--training.mixed_precision_param", "bfloat16"]
    status, _, err = launch("--config-file", config, "--dry-run", *flags)
    assert status == 0
    assert err == f"{config}: warning: {BF16_COST}\n1 warning (--strict refuses them)\n"
    status, _, err = launch("--config-file", config, "--dry-run", "--strict", *flags)
    assert (status, err.splitlines()[0]) == (2, f"{config}: {BF16_COST}")
    # float32 (the debug configs' choice) costs nothing to say
    assert launch("--config-file", config, "--dry-run", "--strict") == (
        0,
        launch("--config-file", config, "--dry-run")[1],
        "",
    )
