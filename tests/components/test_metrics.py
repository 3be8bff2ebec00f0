"""Metrics.Config.build(rank): console and JSONL records every log_freq steps; rank-0 only by default.

The console and JSONL sinks need no torch, so this module runs in the plain environment too.
"""

import errno
import io
import json
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.components.metrics import Metrics, MetricsLogger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def processor(cfg: MetricsLogger.Config, rank: int = 0) -> tuple[Any, io.StringIO, Clock]:
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

    out, clock = io.StringIO(), Clock()
    return MetricsProcessor(cfg, rank=rank, stream=out, clock=clock), out, clock


def test_records_every_log_freq_steps_to_console_and_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "m.jsonl"
    cfg = MetricsLogger.Config(log_freq=2, enable_jsonl=True, jsonl_path=str(path), run_name="r1")
    proc, out, clock = processor(cfg)
    records = []
    for step, loss in enumerate([4.0, 2.0, 3.0, 1.0], start=1):
        clock.now += 0.5
        records.append(proc.record(step, loss=loss, lr=1e-3 * step, grad_norm=0.5, num_tokens=100))
    proc.close()
    assert records[0] is None
    assert records[2] is None
    assert records[1]["step"] == 2
    assert records[1]["loss"] == 3.0  # mean since the last record
    assert records[1]["tokens_per_second"] == pytest.approx(200 / 1.0)
    assert records[3]["loss"] == 2.0
    assert records[3]["lr"] == pytest.approx(4e-3)
    assert records[3]["grad_norm"] == 0.5
    assert records[3]["memory_gib"] > 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [records[1], records[3]]
    console = out.getvalue().splitlines()
    assert len(console) == 2
    assert console[1].startswith("[r1] step      4  loss 2.0000  lr 4.000e-03  grad_norm 0.5000  tok/s 200")


def test_jsonl_appends_across_runs(tmp_path: Path) -> None:
    cfg = MetricsLogger.Config(log_freq=1, enable_jsonl=True, jsonl_path=str(tmp_path / "m.jsonl"))
    for step in (1, 2):
        proc, _, _ = processor(cfg)
        proc.record(step, loss=1.0, lr=0.1)
        proc.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2]


def test_every_record_names_its_launch_and_a_resumed_launch_marks_the_step(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    cfg = MetricsLogger.Config(log_freq=1, enable_jsonl=True, jsonl_path=str(path), run_name="r")
    first, _, _ = processor(cfg)
    first.record(1, loss=1.0, lr=0.1)
    first.record(2, loss=1.0, lr=0.1)
    first.close()
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

    second = MetricsProcessor(cfg, stream=io.StringIO(), resumed_from=1)
    second.record(2, loss=0.5, lr=0.1)
    second.log_validation(2, {"loss": 0.7})
    second.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert first.run_id != second.run_id
    assert first.run_id.startswith("r-")
    assert [(r["run_id"], r["step"], r.get("event")) for r in records] == [
        (first.run_id, 1, None),
        (first.run_id, 2, None),
        (second.run_id, 1, "resumed"),
        (second.run_id, 2, None),
        (second.run_id, 2, None),
    ]
    assert records[-1]["validation/loss"] == 0.7


def test_tflops_and_mfu_from_the_model_flops_of_each_step() -> None:
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

    clock = Clock()
    out = io.StringIO()
    cfg = MetricsLogger.Config(log_freq=2, run_name="r")
    proc = MetricsProcessor(cfg, stream=out, clock=clock, peak_flops=100e12)
    clock.now += 2.0
    proc.record(1, loss=1.0, lr=0.1, flops=30e12)
    record = proc.record(2, loss=1.0, lr=0.1, flops=50e12)
    assert record is not None
    assert (record["tflops"], record["mfu"]) == (pytest.approx(40.0), pytest.approx(40.0))
    assert "tflops 40  mfu 40.0%" in out.getvalue()
    unknown, _, _ = processor(MetricsLogger.Config(log_freq=1))
    record = unknown.record(1, loss=1.0, lr=0.1)
    assert record is not None
    assert (record["tflops"], record["mfu"]) == (None, None)


def test_peaks_come_from_the_name_the_driver_reports_and_the_compute_dtype() -> None:
    from hyper_parallel.preflight.devices import peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "float32") == 51.2e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "float16") == 312e12
    assert peak_flops("NVIDIA H200", "bfloat16") == 989.4e12
    # NVL parts have their own (lower) peaks: NVIDIA's 1,671 sparse = 835.5 dense TFLOPS, 60 fp32
    assert peak_flops("NVIDIA H200 NVL", "bfloat16") == 835.5e12
    assert peak_flops("NVIDIA H100 NVL", "bfloat16") == 835.5e12
    assert peak_flops("NVIDIA H100 NVL", "float32") == 60e12
    assert peak_flops("NVIDIA B200", "bfloat16") == 2250e12
    assert peak_flops("NVIDIA B200", "float32") is None  # no published figure in the table
    assert peak_flops("AMD Instinct MI300X", "bfloat16") == 1307.4e12
    assert peak_flops("Ascend910B3", "bfloat16") == 313e12
    assert peak_flops("NVIDIA GeForce RTX 4090", "bfloat16") is None


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_step_loss_and_eta_and_is_erased_before_a_line() -> None:
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

    out, clock = Terminal(), Clock()
    proc = MetricsProcessor(
        MetricsLogger.Config(log_freq=2, run_name="r"), stream=out, clock=clock, max_steps=4
    )
    for step in (1, 2, 3):
        clock.now += 10.0
        proc.record(step, loss=float(step), lr=0.1)
    proc.log_validation(3, {"loss": 1.0})
    bar, logged, bar_with_loss, validation = out.getvalue().split("\r")[1:]
    assert bar == "[#######.......................] 1/4  eta 0:00:30\x1b[K"
    assert logged.startswith("\x1b[2K[r] step 2/4  loss 1.5000")
    assert bar_with_loss == "[######################........] 3/4  loss 1.5000  eta 0:00:10\x1b[K"
    assert validation.startswith("\x1b[2K[r] step      3  validation/loss 1.0000")


def test_only_rank_zero_writes_by_default(tmp_path: Path) -> None:
    cfg = MetricsLogger.Config(log_freq=1, enable_jsonl=True, jsonl_path=str(tmp_path / "m.jsonl"))
    proc, out, _ = processor(cfg, rank=1)
    assert proc.record(1, loss=1.0, lr=0.1) is None
    proc.log_validation(1, {"loss": 1.0})
    proc.close()
    assert out.getvalue() == ""
    assert not (tmp_path / "m.jsonl").exists()


def test_every_rank_writes_its_own_file_when_configured(tmp_path: Path) -> None:
    cfg = MetricsLogger.Config(
        log_freq=1, rank0_only=False, enable_jsonl=True, jsonl_path=str(tmp_path / "m.jsonl")
    )
    for rank in (0, 1):
        proc, out, _ = processor(cfg, rank=rank)
        proc.record(1, loss=float(rank), lr=0.1)
        proc.close()
        assert out.getvalue()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.rank0.jsonl", "m.rank1.jsonl"]
    assert json.loads((tmp_path / "m.rank1.jsonl").read_text())["loss"] == 1.0


def test_validation_results(tmp_path: Path) -> None:
    cfg = MetricsLogger.Config(enable_jsonl=True, jsonl_path=str(tmp_path / "m.jsonl"))
    proc, out, _ = processor(cfg)
    proc.log_validation(10, {"loss": 2.0, "perplexity": 7.389})
    proc.close()
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {
        "run_id": proc.run_id,
        "step": 10,
        "validation/loss": 2.0,
        "validation/perplexity": 7.389,
    }
    assert "validation/perplexity 7.3890" in out.getvalue()


def test_build_writes_to_stdout_and_derives_a_run_name(capsys: pytest.CaptureFixture[str]) -> None:
    proc = MetricsLogger.Config(log_freq=1).build()
    assert proc.run_name
    proc.record(1, loss=1.5, lr=0.1)
    proc.close()
    assert f"[{proc.run_name}] step      1  loss 1.5000" in capsys.readouterr().out


def tensorboard_with(monkeypatch: pytest.MonkeyPatch, writer: type, tmp_path: Path) -> MetricsLogger.Config:
    """Installs ``writer`` as tensorboard's ``SummaryWriter``; the config of a TensorBoard sink under
    ``tmp_path/tb``, run ``r``, logging every step."""
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    return MetricsLogger.Config(
        log_freq=1, enable_tensorboard=True, tensorboard_folder=str(tmp_path / "tb"), run_name="r"
    )


def test_tensorboard_scalars_when_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    written: list[tuple[str, float, int]] = []

    class FakeWriter:
        def __init__(self, log_dir: str) -> None:
            written.append(("log_dir", 0.0, 0))
            self.log_dir = log_dir
            Path(log_dir).mkdir(parents=True)

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            written.append((tag, value, step))

        def close(self) -> None:
            written.append(("closed", 0.0, 0))

    cfg = tensorboard_with(monkeypatch, FakeWriter, tmp_path)
    proc, _, _ = processor(cfg)
    proc.record(3, loss=2.5, lr=0.1, grad_norm=None)
    proc.close()
    assert (tmp_path / "tb" / "r").is_dir()
    tags = {tag: (value, step) for tag, value, step in written}
    assert tags["loss"] == (2.5, 3)
    assert tags["lr"] == (0.1, 3)
    assert "grad_norm" not in tags
    assert "closed" in tags


def test_missing_tensorboard_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    proc, out, _ = processor(MetricsLogger.Config(log_freq=1, enable_tensorboard=True))
    proc.record(1, loss=1.0, lr=0.1)
    proc.close()
    assert "TensorBoard is not installed" in caplog.text
    assert out.getvalue()


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Metrics\.Config"):
        Metrics.Config().build()


@pytest.mark.multiprocess  # wandb starts its service process
@pytest.mark.timeout(120)
def test_wandb_offline_keeps_the_logged_scalars_in_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    from tests.support.wandb_records import logged_history, run_names

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = MetricsLogger.Config(
        log_freq=2, enable_wandb=True, wandb_project="p", wandb_folder=str(tmp_path / "w"), run_name="r"
    )
    proc, _, _ = processor(cfg)
    for step in (1, 2, 3, 4):
        proc.record(step, loss=float(step), lr=0.5, grad_norm=0.25)
    proc.log_validation(4, {"loss": 9.0})
    proc.close()
    wandb.teardown()  # its service writes the run's file behind finish(): wait for it, as at process exit
    rows = logged_history(tmp_path / "w")
    assert [(row["_step"], row.get("loss"), row.get("lr"), row.get("grad_norm")) for row in rows] == [
        (2, 1.5, 0.5, 0.25),
        (4, 3.5, 0.5, 0.25),
    ]
    assert rows[-1]["validation/loss"] == 9.0
    assert run_names(tmp_path / "w") == [("p", "r")]


# -- a full disk under a sink (issue 36, N10) ----------------------------------------------------------------
FULL = "no space left on device (ENOSPC)"


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _Disk:
    """The disk under the metrics files: once ``full``, every write, flush and close fails with ENOSPC, as
    a full disk makes them fail (the error is injected at the write call itself)."""

    def __init__(self) -> None:
        self.full = False

    def path_class(self) -> type[Path]:
        disk = self

        class OnThisDisk(type(Path())):  # type: ignore[misc]
            def open(self, *args: Any, **kwargs: Any) -> Any:
                if disk.full:
                    raise _enospc()
                return disk.File(super().open(*args, **kwargs), disk)

        return OnThisDisk

    class File:
        def __init__(self, real: Any, disk: "_Disk") -> None:
            self.real, self.disk = real, disk

        def write(self, text: str) -> int:
            if self.disk.full:
                raise _enospc()
            return int(self.real.write(text))

        def flush(self) -> None:
            if self.disk.full:
                raise _enospc()
            self.real.flush()

        def close(self) -> None:
            self.real.close()
            if self.disk.full:
                raise _enospc()


def _our_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_full_disk_mid_run_turns_the_jsonl_sink_off_with_one_warning_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from hyper_parallel.components.metrics import _runtime

    disk = _Disk()
    monkeypatch.setattr(_runtime, "Path", disk.path_class())
    path = tmp_path / "m.jsonl"
    proc, out, _ = processor(MetricsLogger.Config(log_freq=1, enable_jsonl=True, jsonl_path=str(path)))
    first = proc.record(1, loss=3.0, lr=0.1)
    disk.full = True
    with caplog.at_level(logging.WARNING):
        later = [proc.record(step, loss=2.0, lr=0.1) for step in (2, 3)]
        proc.log_validation(3, {"loss": 2.5})
        proc.close()
    assert [r["step"] for r in later] == [2, 3]  # the records are still made and shown
    assert len(out.getvalue().splitlines()) == 4
    assert _our_warnings(caplog) == [
        f"{path}: {FULL}; metrics.enable_jsonl turned off for the rest of the run (training goes on, the "
        "console line shows every record)"
    ]
    assert [json.loads(line) for line in path.read_text().splitlines()] == [first]


def test_a_full_disk_under_tensorboard_turns_it_off_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scalars: list[str] = []
    disk = _Disk()

    class Writer:  # SummaryWriter's surface; its writer thread re-raises a failed write on a later call
        def __init__(self, log_dir: str) -> None:
            self.closed = 0

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            if disk.full:
                raise _enospc()
            scalars.append(f"{tag}@{step}")

        def close(self) -> None:
            self.closed += 1

    cfg = tensorboard_with(monkeypatch, Writer, tmp_path)
    proc, out, _ = processor(cfg)
    writer = proc._tb
    proc.record(1, loss=3.0, lr=0.1)
    disk.full = True
    with caplog.at_level(logging.WARNING):
        proc.record(2, loss=2.0, lr=0.1)
        proc.record(3, loss=2.0, lr=0.1)
        proc.close()
    assert _our_warnings(caplog) == [
        f"{tmp_path / 'tb' / 'r'}: {FULL}; metrics.enable_tensorboard turned off for the rest of the run "
        "(training goes on, the console line shows every record)"
    ]
    assert "loss@1" in scalars
    assert not any(s.endswith(("@2", "@3")) for s in scalars)
    assert writer.closed == 1
    assert len(out.getvalue().splitlines()) == 3


def test_a_full_disk_when_the_jsonl_file_is_opened_stops_the_launch_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from hyper_parallel.components.metrics import _runtime
    from hyper_parallel.launch import main
    from tests.support.trainer import as_flags, debug_config_path, tiny_overrides

    disk = _Disk()
    disk.full = True
    monkeypatch.setattr(_runtime, "Path", disk.path_class())
    path = tmp_path / "m.jsonl"
    run = {"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(path), "metrics.log_freq": "1"}
    flags = as_flags(tiny_overrides("llama3", **run))
    out, err = io.StringIO(), io.StringIO()
    assert main(["--config-file", str(debug_config_path("llama3")), *flags], out=out, err=err) == 2
    assert err.getvalue() == f"{path}: {FULL}; free space or set metrics.jsonl_path elsewhere\n", (
        err.getvalue()
    )
    assert "Traceback" not in err.getvalue()
