"""What the launch checks before building anything: this machine's devices, the files a config names, comm."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyper_parallel.trainer import machine
from hyper_parallel.trainer.machine import machine_issues
from tests.trainer_support import tiny_config


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
