"""A step you can see inside: each logged record splits the step's time into its phases (issue 35).

``time_data`` (waiting for the batches), ``time_fwd_bwd``, ``time_optimizer`` (clipping, the optimizer and
the schedule) and, under a process group, ``time_comm`` (the trainer's own blocking collectives), with
``time_step`` the whole step: in the JSON lines and on the console line of every logged step, and taken
on those steps only (each phase boundary waits for the device there, which unlogged steps never do).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

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
    monkeypatch.setattr(trainer_module, "_wait_for_device", lambda device: waits.append(built[0].step))
    built: list[LLMTrainer] = []
    jsonl = tmp_path / "metrics.jsonl"
    overrides = {
        "metrics.log_freq": "2",
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(jsonl),
        "training.max_steps": "4",
    }
    out = io.StringIO()
    trainer = LLMTrainer(tiny_config("llama3", overrides), stream=out)
    built.append(trainer)
    walls: dict[int, float] = {}  # each step's own wall time, measured around the whole step
    step_once = trainer.train_step

    def timed_step() -> Any:
        started = time.perf_counter()
        result = step_once()
        walls[result.step] = time.perf_counter() - started
        return result

    monkeypatch.setattr(trainer, "train_step", timed_step)
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
        assert abs(sum(parts) - walls[record["step"]]) <= 0.05 * walls[record["step"]], (record, walls)
        assert record["time_step"] <= walls[record["step"]]
    line = next(text for text in out.getvalue().splitlines() if "step 4/4" in text)
    for key in (*PHASES, "time_step"):
        assert f"  {key} " in line


# -- mixture of experts you can watch ---------------------------------------------------------------------


def test_moe_records_carry_each_layers_expert_load_and_the_console_leaves_it_out(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    overrides = {
        "metrics.log_freq": "1",
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(jsonl),
        "training.max_steps": "1",
    }
    out = io.StringIO()
    trainer = LLMTrainer(tiny_config("qwen3_5_moe", overrides), stream=out)
    try:
        (result,) = trainer.train()
        layers = len(trainer._moe_layers)
    finally:
        trainer.close()
    (record,) = [r for r in map(json.loads, jsonl.read_text().splitlines()) if "loss" in r]
    assert layers == 2
    for layer in range(layers):
        low, high = record[f"expert_load/{layer}/min"], record[f"expert_load/{layer}/max"]
        assert 0 <= low <= record["expert_load_mean"] <= high
        assert record[f"expert_load/{layer}/cv"] > 0  # 4 experts never share 128 tokens x 2 exactly evenly
        assert record[f"expert_load/{layer}/top_share"] == pytest.approx(high / result.tokens)
    assert record["expert_load_max"] == max(record[f"expert_load/{n}/max"] for n in range(layers))
    line = next(text for text in out.getvalue().splitlines() if "step 1/1" in text)
    assert "expert_load_max" in line
    assert "expert_load/" not in line


def collapsed(step: int, share: float) -> dict[str, float]:
    return {
        "step": step,
        "expert_load/0/top_share": 0.5,
        "expert_load/0/max": 40,
        "expert_load/0/min": 20,
        "expert_load/1/top_share": share,
        "expert_load/1/max": 2048 * share,
        "expert_load/1/min": 0,
    }


def test_a_layer_whose_routing_collapses_is_named_once_after_three_logged_steps() -> None:
    watch = trainer_module._CollapseWatch()
    assert watch.warnings(collapsed(5, 1.0)) == []
    assert watch.warnings(collapsed(10, 0.5)) == []  # a balanced log starts the count again
    assert watch.warnings(collapsed(15, 1.0)) == []
    assert watch.warnings(collapsed(20, 0.95)) == []
    assert watch.warnings(collapsed(25, 1.0)) == [
        "warning: step 25: MoE layer 1's routing collapsed: its busiest expert received 100% of the layer's "
        "tokens on 3 logged steps in a row (load max 2048, min 0); raise "
        "model.overrides.router_aux_loss_coef or lower optimizer.lr"
    ]
    assert watch.warnings(collapsed(30, 1.0)) == []  # said once
