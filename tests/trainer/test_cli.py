"""``python -m hyper_parallel.train_lm``: the shipped debug configs learn, signals stop cleanly and resume."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.processes import clean_env
from tests.support.trainer import ROOT, as_flags, debug_config_path, tiny_overrides

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def launch(*args: str, prog: str = "train_lm", timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"hyper_parallel.{prog}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("prog", "model", "steps"),
    # README's Quickstart trains 60 steps; the configs show the fall well before that (Llama 3 to about 0.41x
    # of the first loss in 30 steps, Qwen 3.5 to 0.48x in 15, the VL config to 0.05x in 30), which keeps the
    # suite inside its time budget.
    [("train_lm", "llama3", 30), ("train_lm", "qwen3_5", 15), ("train_vl", "qwen3_5_vl", 30)],
)
def test_shipped_debug_config_learns_on_the_cpu(prog: str, model: str, steps: int, tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    shortened = ["--training.max_steps", str(steps)]
    done = launch(
        "--config-file",
        str(debug_config_path(model)),
        *shortened,
        "--metrics.log_freq",
        "1",
        "--metrics.jsonl_path",
        str(jsonl),
        prog=prog,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    losses = [json.loads(line)["loss"] for line in jsonl.read_text().splitlines()]
    assert len(losses) == steps
    last_quarter = losses[-(steps // 4) :]
    assert sum(last_quarter) / len(last_quarter) <= 0.8 * losses[0], losses
    assert re.search(rf"\[{model}_debug\] step {steps}/{steps}  loss \d+\.\d+", done.stdout)
    assert f"done: step {steps}, final loss" in done.stdout

    png = tmp_path / "curves.png"
    plotted = subprocess.run(
        [sys.executable, "-m", "hyper_parallel.plot", str(jsonl), "-o", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert plotted.returncode == 0, plotted.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_saves_and_the_next_launch_resumes(
    sig: signal.Signals, status: int, tmp_path: Path
) -> None:
    folder = tmp_path / "ckpt"
    overrides = tiny_overrides(
        "llama3",
        **{
            "training.max_steps": "200",  # ends by itself if the signal is lost
            "metrics.log_freq": "1",
            "checkpoint.enable": "true",
            "checkpoint.folder": str(folder),
            "checkpoint.interval": "100000",
        },
    )
    command = [
        sys.executable,
        "-m",
        "hyper_parallel.train_lm",
        "--config-file",
        str(debug_config_path("llama3")),
    ]
    with subprocess.Popen(
        [*command, *as_flags(overrides)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        cwd=ROOT,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if re.search(r"step +3/200 ", line):
                process.send_signal(sig)
                break
        out, err = process.communicate(timeout=120)
    assert process.returncode == status, err[-3000:]
    match = re.search(rf"{sig.name}: stopped after step (\d+); checkpoint saved, relaunch", out)
    assert match, out[-2000:]
    stopped = int(match.group(1))
    assert stopped >= 3
    assert (folder / f"step-{stopped}" / ".metadata").is_file()

    resumed = launch(*command[3:], *as_flags({**overrides, "training.max_steps": str(stopped + 2)}))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming at step {stopped}" in resumed.stdout
    assert re.search(rf"step +{stopped + 2}/{stopped + 2} ", resumed.stdout)


def test_a_training_error_exits_1_with_the_message(tmp_path: Path) -> None:
    overrides = tiny_overrides(
        "llama3",
        **{
            "debug.check_nan_inf": "true",
            "optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config",
            "optimizer.lr": "1e30",
            "training.max_grad_norm": "null",
            "training.max_steps": "10",
        },
    )
    done = launch("--config-file", str(debug_config_path("llama3")), *as_flags(overrides))
    assert done.returncode == 1
    assert re.search(r"training stopped: step \d+: the (loss|gradient norm) is (nan|inf)", done.stderr)
