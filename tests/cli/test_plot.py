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


def test_a_file_of_many_runs_names_the_first_in_its_legend_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run is drawn, the legend names ``MAX_LEGEND_RUNS`` of them and says how many more: a legend of
    each of 5,000 launches took 66 s of CPU to draw (4.9 s now; the command in the report)."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from hyper_parallel.plot import MAX_LEGEND_RUNS, plot_metrics

    drawn: list[int] = []
    legends: list[list[str]] = []
    plot, legend = Axes.plot, Axes.legend

    def counting_plot(self: Axes, *args: Any, **kwargs: Any) -> Any:
        drawn.append(len(args[0]) if args else 0)
        return plot(self, *args, **kwargs)

    def recording_legend(self: Axes, *args: Any, **kwargs: Any) -> Any:
        made = legend(self, *args, **kwargs)
        legends.append([text.get_text() for text in made.get_texts()])
        return made

    monkeypatch.setattr(Axes, "plot", counting_plot)
    monkeypatch.setattr(Axes, "legend", recording_legend)
    records = [r for i in range(30) for r in _train(f"r{i}", range(1, 3), 2.0 - i / 100)]
    plot_metrics(records, tmp_path / "many.png")
    named = [f"training loss (r{i})" for i in range(MAX_LEGEND_RUNS)]
    assert legends == [[*named, f"and {30 - MAX_LEGEND_RUNS:,} more runs, not named here"]]
    assert drawn.count(2) == 2 * 30  # each run's loss and learning rate, named or not
