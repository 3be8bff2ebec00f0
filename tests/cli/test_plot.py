"""``python -m hyper_parallel.plot``: one line per run, resumed steps drawn once, several files overlaid."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyper_parallel.plot import main, split_runs


def _train(run_id: str | None, steps: range, loss: float) -> list[dict[str, Any]]:
    head = {} if run_id is None else {"run_id": run_id}
    return [{**head, "step": s, "loss": loss, "lr": 0.1} for s in steps]


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_each_launch_is_its_own_run_and_a_resumed_launch_continues_the_one_before() -> None:
    killed = _train("a-1", range(10, 61, 10), 2.0)  # checkpoint at 40, killed after logging 60
    resumed = [{"run_id": "a-2", "step": 40, "event": "resumed"}, *_train("a-2", range(50, 81, 10), 1.0)]
    fresh = _train("b-1", range(10, 31, 10), 3.0)
    runs = split_runs([*killed, *resumed, *fresh])
    assert [run.label for run in runs] == ["a-1 + a-2", "b-1"]
    merged = [(r["step"], r["loss"]) for r in runs[0].records if "loss" in r]
    assert merged == [(10, 2.0), (20, 2.0), (30, 2.0), (40, 2.0), (50, 1.0), (60, 1.0), (70, 1.0), (80, 1.0)]
    assert [r["step"] for r in runs[1].records] == [10, 20, 30]


def test_records_without_run_ids_are_split_where_the_step_goes_back() -> None:
    records = [*_train(None, range(10, 61, 10), 2.0), {"step": 60, "validation/loss": 2.1}]
    records += _train(None, range(10, 21, 10), 3.0)
    runs = split_runs(records)
    assert [run.label for run in runs] == ["run 1", "run 2"]
    assert runs[0].records[-1] == {"step": 60, "validation/loss": 2.1}
    assert [r["step"] for r in runs[1].records] == [10, 20]


def test_several_files_are_overlaid_into_one_image(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("matplotlib")
    first = _write(tmp_path / "a.jsonl", _train("a-1", range(1, 4), 2.0))
    second = _write(tmp_path / "b.jsonl", _train("b-1", range(1, 4), 1.0))
    png = tmp_path / "both.png"
    assert main([str(first), str(second), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == f"wrote {png}\n"


def test_a_file_that_is_not_metrics_names_its_line(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "m.jsonl"
    bad.write_text('{"step": 1, "loss": 1.0}\n{"loss": 2.0}\n', encoding="utf-8")
    assert main([str(bad)]) == 2
    assert capsys.readouterr().err == f"{bad}:2: a metrics record needs an integer 'step'\n"
