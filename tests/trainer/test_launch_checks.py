"""What the launch checks before building anything: this machine's devices, the files a config names, comm,
and what the trainer it feeds needs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

import pytest

from hyper_parallel.config import ConfigError, load_config
from hyper_parallel.launch import main
from hyper_parallel.trainer import machine
from hyper_parallel.trainer.machine import machine_issues
from tests.support.trainer import as_flags, debug_config_path, tiny_config, tiny_overrides


@pytest.mark.parametrize(
    ("overrides", "path", "message"),
    [
        (
            {"training.init_device": "cuda"},
            "training.init_device",
            "'cuda' needs an NVIDIA GPU, and this machine has none; use 'meta' (allocates on the training "
            "device after sharding) or 'cpu'",
        ),
        (
            {"training.init_device": "npu"},
            "training.init_device",
            "'npu' needs an Ascend NPU, and this machine has none; use 'meta' (allocates on the training "
            "device after sharding) or 'cpu'",
        ),
        (
            {"comm.backend": "nccl"},
            "comm.backend",
            "'nccl' needs an NVIDIA GPU, and this machine has none; use null to pick gloo automatically",
        ),
        (
            {"comm.backend": "hccl"},
            "comm.backend",
            "'hccl' needs an Ascend NPU, and this machine has none; use null to pick gloo automatically",
        ),
    ],
)
def test_devices_and_backends_this_machine_lacks_are_refused(
    overrides: dict[str, str], path: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "accelerator", lambda: "cpu")
    assert machine_issues(tiny_config("llama3", overrides), training=False) == [(path, message)]


def test_gloo_and_cpu_run_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "accelerator", lambda: "cpu")
    monkeypatch.setattr(machine, "_torch_installed", lambda: True)
    cfg = tiny_config("llama3", {"comm.backend": "gloo", "training.init_device": "cpu"})
    assert machine_issues(cfg, training=True) == []


def test_files_the_run_reads_must_exist_when_training_not_when_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(machine, "_torch_installed", lambda: True)
    cfg = tiny_config(
        "llama3",
        {
            "model.weights_path": str(tmp_path / "weights"),
            "dataloader.dataset.source": "jsonl",
            "dataloader.dataset.paths": f"[{tmp_path / 'train.jsonl'}]",
            "checkpoint.enable": "true",
            "checkpoint.initial_load_path": str(tmp_path / "ckpt"),
        },
    )
    assert machine_issues(cfg, training=False) == []
    assert machine_issues(cfg, training=True) == [
        ("model.weights_path", f"{str(tmp_path / 'weights')!r} is not a directory on this machine"),
        ("dataloader.dataset.paths[0]", f"{str(tmp_path / 'train.jsonl')!r} does not exist on this machine"),
        ("checkpoint.initial_load_path", f"{str(tmp_path / 'ckpt')!r} is not a directory on this machine"),
    ]


def test_training_without_torch_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "_torch_installed", lambda: False)
    assert machine_issues(tiny_config("llama3"), training=True) == [
        ("", "training needs PyTorch, which is not installed: python -m pip install -e '.[torch]'")
    ]
    assert machine_issues(tiny_config("llama3"), training=False) == []


def test_nccl_flight_recorder_follows_comm_and_other_backends_have_none() -> None:
    pytest.importorskip("torch")
    from hyper_parallel.parallel.process_group import flight_recorder_env

    comm = tiny_config("llama3", {"comm.trace_buf_size": "500", "comm.save_traces_folder": "fr"}).comm
    assert flight_recorder_env(comm, "nccl") == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "500",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "fr/rank_",
    }
    off = tiny_config("llama3", {"comm.trace_buf_size": "0"}).comm
    assert flight_recorder_env(off, "nccl") == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert flight_recorder_env(comm, "gloo") == {}


# -- the trainer a config feeds: one rule, checked by the resolver and by the trainer ---------------------

VL_DEBUG = "configs/qwen3_5_vl_debug.yaml"
NO_VISION = (
    "needs a vision-language model, but 'qwen3_5' has no vision tower; use a VL factory such as "
    "hyper_parallel.models.qwen3_5.create_vl_model_spec, or"
)


@pytest.mark.parametrize(
    ("path", "trainer", "issue"),
    [
        (
            "configs/qwen3_5.yaml",
            "vl",
            ("configs/qwen3_5.yaml:2:3", "model", f"VLTrainer {NO_VISION} LLMTrainer"),
        ),
        (
            VL_DEBUG,
            "lm",
            (
                f"{VL_DEBUG}:21:13",
                "dataloader.dataset.source",
                "'shapes' is image-caption data, which LLMTrainer cannot feed; use VLTrainer",
            ),
        ),
    ],
)
def test_load_config_checks_the_rules_of_the_trainer_it_feeds(
    path: str, trainer: Literal["lm", "vl"], issue: tuple[str, str, str]
) -> None:
    assert load_config(path)  # any trainer: nothing to refuse
    with pytest.raises(ConfigError) as info:
        load_config(path, trainer=trainer)
    assert [(i.location, i.path, i.message) for i in info.value.issues] == [issue]


@pytest.mark.parametrize(
    ("prog", "path", "line"),
    [
        (
            "train_vl",
            "configs/qwen3_5.yaml",
            f"configs/qwen3_5.yaml:2:3: model: train_vl {NO_VISION} train_lm",
        ),
        (
            "train_lm",
            VL_DEBUG,
            f"{VL_DEBUG}:21:13: dataloader.dataset.source: 'shapes' is image-caption data, which train_lm "
            "cannot feed; use train_vl",
        ),
    ],
)
def test_the_launch_commands_name_themselves_in_the_same_rule(prog: str, path: str, line: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["--config-file", path, "--dry-run"], prog=prog, out=out, err=err) == 2
    assert err.getvalue().splitlines()[0] == line


def test_a_trainer_refuses_a_config_built_in_python_by_the_same_rule() -> None:
    from hyper_parallel.trainer import LLMTrainer, TrainingError, VLTrainer

    text_model = load_config("configs/qwen3_5.yaml")
    with pytest.raises(TrainingError) as refused:
        VLTrainer(text_model)  # refused before anything is built
    assert str(refused.value) == f"model: VLTrainer {NO_VISION} LLMTrainer"
    images = load_config(VL_DEBUG)
    with pytest.raises(TrainingError) as refused:
        LLMTrainer(images)
    assert str(refused.value) == (
        "dataloader.dataset.source: 'shapes' is image-caption data, which LLMTrainer cannot feed; "
        "use VLTrainer"
    )


def test_the_trainer_validates_a_config_built_in_python_before_building_anything() -> None:
    from hyper_parallel.components.dataloader import SyntheticSource, TextDataLoader
    from hyper_parallel.components.tokenizer import ByteTokenizer
    from hyper_parallel.config import ConfigError
    from hyper_parallel.models.qwen3_5 import create_model_spec
    from hyper_parallel.trainer import LLMTrainer
    from hyper_parallel.trainer.config import ParallelismConfig, TrainerConfig

    cfg = TrainerConfig(
        model=create_model_spec(flavor="debugmodel"),
        tokenizer=ByteTokenizer.Config(),
        dataloader=TextDataLoader.Config(dataset=SyntheticSource()),
        parallelism=ParallelismConfig(cp=2),
    )
    with pytest.raises(ConfigError) as info:
        LLMTrainer(cfg)
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "parallelism.cp",
            "context parallelism is not supported yet: PyTorch's ring attention covers only "
            "the CUDA flash, memory-efficient and cuDNN attention kernels, not CPU attention with gloo, so "
            "this release cannot test it; use 1, and for long sequences use tp with sequence_parallel and "
            "activation_checkpoint, got 2",
        )
    ]


def test_threads_follow_the_field_then_omp_num_threads_then_the_cores_per_local_rank() -> None:
    intra_op_threads = machine.intra_op_threads
    assert intra_op_threads(3, {"OMP_NUM_THREADS": "1"}, cores=8) == (3, "training.cpu_threads")
    assert intra_op_threads(None, {"OMP_NUM_THREADS": "2"}, cores=8) == (2, "OMP_NUM_THREADS")
    assert intra_op_threads(None, {"LOCAL_WORLD_SIZE": "4"}, cores=8, load=0.3) == (
        2,
        "8 cores available to this process / 4 local rank(s)",
    )
    assert intra_op_threads(None, {"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": ""}, cores=2, load=0)[0] == 1


@pytest.mark.parametrize(
    ("cores", "load", "ranks", "threads", "reason"),
    [
        (2, 0.2, "1", 2, "2 cores available to this process / 1 local rank(s)"),
        (2, 1.16, "1", 1, "2 cores available to this process, 1 busy (load 1.16) / 1 local rank(s)"),
        (2, 5.0, "1", 1, "2 cores available to this process, 2 busy (load 5.00) / 1 local rank(s)"),
        (16, 4.0, "2", 6, "16 cores available to this process, 4 busy (load 4.00) / 2 local rank(s)"),
    ],
)
def test_threads_leave_the_cores_other_work_keeps_busy(
    cores: int, load: float, ranks: str, threads: int, reason: str
) -> None:
    # A shared machine is not oversubscribed (issue 35): the 1-minute load takes its cores first.
    assert machine.intra_op_threads(None, {"LOCAL_WORLD_SIZE": ranks}, cores=cores, load=load) == (
        threads,
        reason,
    )


@pytest.mark.parametrize(
    ("switch", "package", "message"),
    [
        (
            "enable_tensorboard",
            "tensorboard",
            "TensorBoard is not installed: python -m pip install -e '.[tensorboard]', or set it to false",
        ),
        (
            "enable_wandb",
            "wandb",
            "Weights & Biases is not installed: python -m pip install -e '.[wandb]', or set it to false",
        ),
    ],
)
def test_a_logger_without_its_package_is_refused_at_dry_run_naming_the_extra(
    switch: str, package: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[str] = []

    def installed(name: str) -> bool:
        looked_up.append(name)
        return name != package

    monkeypatch.setattr(machine, "_installed", installed)
    out, err = io.StringIO(), io.StringIO()
    config = str(debug_config_path("llama3"))
    assert main(["--config-file", config, f"--metrics.{switch}", "true", "--dry-run"], out=out, err=err) == 2
    assert f"metrics.{switch}: {message}" in err.getvalue()
    assert package in looked_up
    monkeypatch.undo()
    assert machine_issues(tiny_config("llama3"), training=False) == []  # off: nothing is looked up


@pytest.mark.parametrize(
    ("version", "issue", "warning"),
    [
        ("2.10.0+cu128", "PyTorch 2.10.0+cu128 is older than 2.11 to 2.13, the range this project supports "
                         "(FlexAttention, FSDP2 and DCP APIs it calls)", None),
        ("2.11.0+cu130", None, None),
        ("2.13.0", None, None),
        ("2.14.1", None, "PyTorch 2.14.1 is newer than 2.11 to 2.13, the range this project is tested on"),
        ("2.15.0.dev20270101", None,
         "PyTorch 2.15.0.dev20270101 is newer than 2.11 to 2.13, the range this project is tested on"),
    ],
)  # fmt: skip
def test_a_torch_outside_the_supported_range_is_refused_or_said_at_dry_run(
    monkeypatch: pytest.MonkeyPatch, version: str, issue: str | None, warning: str | None
) -> None:
    monkeypatch.setattr(machine, "_torch_version_text", lambda: version)
    cfg = load_config(debug_config_path("llama3"))
    issues = [m for p, m in machine_issues(cfg, training=False) if "PyTorch" in m]
    warnings = [m for p, m in machine.machine_warnings(cfg) if "PyTorch" in m]
    assert issues == ([issue] if issue else [])
    assert warnings == ([warning] if warning else [])


def test_the_supported_torch_range_is_the_one_pyproject_installs() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    (low_major, low_minor), (high_major, high_minor) = machine.SUPPORTED_TORCH
    assert f'"torch>={low_major}.{low_minor},<{high_major}.{high_minor}"' in text


_LORA = ["--peft._target_", "hyper_parallel.components.peft.LoRA.Config"]
_UNSAVED = (
    "checkpoint.enable: is false by default, so this run, which fine-tunes ({}), would save nothing it "
    "trains; set checkpoint.enable: true (and checkpoint.folder) to keep the result, or write "
    "checkpoint.enable: false to train without saving\n1 problem found; nothing was started.\n"
)


def _launch(config: Path, *flags: str) -> tuple[int, str, str]:
    quiet = ["--training.max_steps", "1", "--metrics.log_freq", "1"]
    out, err = io.StringIO(), io.StringIO()
    status = main(
        ["--config-file", str(config), *as_flags(tiny_overrides("llama3")), *quiet, *flags], out=out, err=err
    )
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_fine_tune_that_saves_nothing_by_default_is_refused(dry_run: bool) -> None:
    config = debug_config_path("llama3")
    mode = ["--dry-run"] if dry_run else []
    assert _launch(config, *mode, *_LORA) == (2, "", f"{config}:6:1: " + _UNSAVED.format("peft is LoRA"))
    weights = ["--model.weights_path", "/nowhere", "--no-file-checks"]
    both = _UNSAVED.format("peft is LoRA and model.weights_path is set")
    assert _launch(config, "--dry-run", *weights, *_LORA) == (2, "", f"{config}:6:1: {both}")
    assert _launch(config, "--dry-run", *weights, "--checkpoint.enable", "true")[0] == 0
    assert _launch(config, "--dry-run")[0] == 0  # full training from the seed is no fine-tune
    assert _launch(config, "--print-config", *_LORA)[0] == 0  # printing or dumping it trains nothing


def test_a_fine_tune_that_says_checkpoint_enable_false_runs_and_is_warned(tmp_path: Path) -> None:
    said = "is false: this run fine-tunes (peft is LoRA) and saves nothing it trains"
    flag = f"--checkpoint.enable: warning: {said}"
    status, out, err = _launch(debug_config_path("llama3"), *_LORA, "--checkpoint.enable", "false")
    assert (status, err.splitlines()[0]) == (0, flag)
    assert "done: step 1" in out
    # Written in the file, the choice is located at its line.
    written = tmp_path / "run.yaml"
    text = debug_config_path("llama3").read_text()
    written.write_text(
        text + "checkpoint:\n  _target_: hyper_parallel.components.checkpoint.DCPCheckpoint.Config\n"
        "  enable: false\n"
    )
    line = len(text.splitlines()) + 3
    status, _, err = _launch(written, "--dry-run", *_LORA)
    assert (status, err.splitlines()[0]) == (
        0,
        f"{written}:{line}:11: warning: checkpoint.enable: {said}",
    )
