"""Plot loss and learning-rate curves from metrics JSON-lines files, one line per run.

``python -m hyper_parallel.plot METRICS.jsonl [MORE.jsonl ...] [-o curves.png]`` reads the records written
with ``metrics.enable_jsonl`` (one object per logged step; validation records add ``validation/loss``) and
draws the training loss, the validation loss when present, and the learning rate against the step.

Several launches may append to one file: each record's ``run_id`` says which launch wrote it, and each run
is drawn as its own line (records written before run ids existed are split where the step goes back). A
launch that resumed a checkpoint marks it (``"event": "resumed"`` at step S): it continues the run before it
in the file, whose records after step S (logged after that checkpoint, then lost with the killed process)
give way to the resumed run's, so every step is drawn once. Several files are overlaid, labelled by file.
matplotlib is an optional extra: ``python -m pip install -e '.[plot]'``.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hyper_parallel._json import loads
from hyper_parallel._paths import NotRegularFileError, open_regular

__all__ = ["Run", "main", "plot_metrics", "read_metrics", "split_runs"]

#: Runs the legend names (in file order); more are drawn unnamed, the legend saying how many. A legend of
#: every run of a file that 5,000 launches appended to took most of a minute (and covered the plot).
MAX_LEGEND_RUNS = 8

_USAGE = "usage: python -m hyper_parallel.plot METRICS.jsonl [MORE.jsonl ...] [-o OUTPUT.png]\n"


class Run(NamedTuple):
    """The records of one run (a launch and the launches that resumed it), in the order drawn."""

    label: str
    records: list[dict[str, Any]]


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSON-lines file; ``ValueError`` names the first line that is not JSON."""
    records = []
    try:
        raw = open_regular(path)  # a FIFO or a device is refused at once, never waited on
    except NotRegularFileError as exc:
        raise ValueError(f"{path}: {exc}") from None
    with raw, io.TextIOWrapper(raw, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON object: {exc.msg}") from None
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError(f"{path}:{number}: a metrics record needs an integer 'step'")
            records.append(record)
    return records


def _launches(records: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Records grouped by launch, in file order: by ``run_id``, else split where the step goes back."""
    launches: list[tuple[str, list[dict[str, Any]]]] = []
    by_id: dict[str, list[dict[str, Any]]] = {}
    legacy: list[dict[str, Any]] | None = None
    for record in records:
        run_id = record.get("run_id")
        if isinstance(run_id, str):
            if run_id not in by_id:
                by_id[run_id] = []
                launches.append((run_id, by_id[run_id]))
            by_id[run_id].append(record)
            legacy = None
            continue
        training = "loss" in record
        if legacy is None or (training and record["step"] <= _last_training_step(legacy)):
            legacy = []
            launches.append((f"run {len(launches) + 1}", legacy))
        legacy.append(record)
    return launches


def _last_training_step(records: Sequence[dict[str, Any]]) -> int:
    steps = [r["step"] for r in records if "loss" in r]
    return steps[-1] if steps else -1


def split_runs(records: Sequence[dict[str, Any]]) -> list[Run]:
    """The runs of one file: each launch, with a resumed launch joined to the run it continues."""
    runs: list[Run] = []
    for label, launch in _launches(records):
        resumed = [r["step"] for r in launch if r.get("event") == "resumed"]
        if resumed and runs:
            at = resumed[0]
            earlier = runs[-1]
            kept = [r for r in earlier.records if r["step"] <= at]
            runs[-1] = Run(f"{earlier.label} + {label}", kept + launch)
        else:
            runs.append(Run(label, list(launch)))
    return runs


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key``; for a step logged twice, the later record's value."""
    points: dict[int, float] = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            points[record["step"]] = float(value)  # a later record replaces an earlier one
    ordered = sorted(points.items())
    return [p[0] for p in ordered], [p[1] for p in ordered]


def plot_metrics(
    records: Sequence[dict[str, Any]] | Sequence[tuple[str, Sequence[dict[str, Any]]]], output: str | Path
) -> Path:
    """Draw loss (training and validation) and learning rate against the step into ``output``.

    ``records``: one file's records, or ``(name, records)`` pairs of several files (overlaid, each run
    labelled ``name: run``).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    files: Sequence[tuple[str, Sequence[dict[str, Any]]]] = (
        records  # type: ignore[assignment]
        if records and isinstance(records[0], tuple)
        else [("", records)]  # type: ignore[list-item]
    )
    runs = [
        Run(f"{name}: {run.label}" if name else run.label, run.records)
        for name, file_records in files
        for run in split_runs(file_records)
    ]
    figure, (loss_axes, lr_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    drawn = 0
    for run in runs:
        train_steps, train_loss = _series(run.records, "loss")
        if not train_steps:
            continue
        drawn += 1
        # Labels past the legend's runs start with "_", which matplotlib leaves out of a legend.
        named = drawn <= MAX_LEGEND_RUNS
        label = run.label if named else "_"
        (line,) = loss_axes.plot(train_steps, train_loss, label=f"training loss ({label})" if named else "_")
        val_steps, val_loss = _series(run.records, "validation/loss")
        if val_steps:
            shown = f"validation ({label})" if named else "_"
            loss_axes.plot(val_steps, val_loss, "o--", color=line.get_color(), label=shown)
        lr_steps, lr = _series(run.records, "lr")
        lr_axes.plot(lr_steps, lr, color=line.get_color(), label=label)
    if not drawn:
        plt.close(figure)
        raise ValueError("no training loss in the records (was metrics.enable_jsonl set?)")
    if drawn > MAX_LEGEND_RUNS:  # said in the legend itself: the lines beyond it are drawn, unnamed
        loss_axes.plot([], [], " ", label=f"and {drawn - MAX_LEGEND_RUNS:,} more runs, not named here")
    loss_axes.set_ylabel("loss (mean since the previous log line)")
    loss_axes.legend(fontsize="small", loc="upper right" if drawn > MAX_LEGEND_RUNS else "best")
    loss_axes.grid(alpha=0.3)
    lr_axes.set_ylabel("learning rate")
    lr_axes.set_xlabel("step")
    lr_axes.grid(alpha=0.3)
    figure.tight_layout()
    out = Path(output)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: exit 0 with the image written, 2 on bad arguments or input."""
    args = list(sys.argv[1:] if argv is None else argv)
    output = "curves.png"
    if "-o" in args:
        at = args.index("-o")
        if at + 1 >= len(args):
            sys.stderr.write(_USAGE)
            return 2
        output = args[at + 1]
        del args[at : at + 2]
    if not args or any(a.startswith("-") for a in args):
        sys.stderr.write(_USAGE)
        return 2
    try:
        files = [(Path(a).name if len(args) > 1 else "", read_metrics(a)) for a in args]
        written = plot_metrics(files, output)
    except ImportError:
        sys.stderr.write("plotting needs matplotlib: python -m pip install -e '.[plot]'\n")
        return 2
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    from hyper_parallel._cli import run

    run(main)
