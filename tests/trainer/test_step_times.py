"""A step you can see inside: each logged record splits the step's time into its phases (issue 35).

``time_data`` (waiting for the batches), ``time_fwd_bwd``, ``time_optimizer`` (clipping, the optimizer and
the schedule) and, under a process group, ``time_comm`` (the trainer's own blocking collectives), with
``time_step`` the whole step: in the JSON lines and on the console line of every logged step, and taken
on those steps only (each phase boundary waits for the device there, which unlogged steps never do).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hyper_parallel.trainer import LLMTrainer
from hyper_parallel.trainer import _trainer as trainer_module
from tests.support.trainer import tiny_config

PHASES = ("time_data", "time_fwd_bwd", "time_optimizer")


def test_logged_steps_split_their_time_into_phases_that_add_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[int] = []
    monkeypatch.setattr(trainer_module, "_wait_for_device", lambda device: waits.append(trainer.step))
    jsonl = tmp_path / "metrics.jsonl"
    overrides = {
        "metrics.log_freq": "2",
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(jsonl),
        "training.max_steps": "4",
    }
    out = io.StringIO()
    trainer = LLMTrainer(tiny_config("llama3", overrides), stream=out)
    try:
        trainer.train()
    finally:
        trainer.close()
    # Only the logged steps (2 and 4) waited for the device: six phase boundaries each.
    assert waits == [1] * 6 + [3] * 6, waits  # (trainer.step is the previous step while the step runs)
    records = [r for r in map(json.loads, jsonl.read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        assert "time_comm" not in record  # one process: no collective
        parts = [record[key] for key in PHASES]
        assert all(part >= 0 for part in parts)
        assert record["time_fwd_bwd"] > 0
        assert abs(sum(parts) - record["time_step"]) <= 0.05 * record["time_step"], record
    line = next(text for text in out.getvalue().splitlines() if "step 4/4" in text)
    for key in (*PHASES, "time_step"):
        assert f"  {key} " in line
