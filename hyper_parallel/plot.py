"""Plot loss and learning-rate curves from a metrics JSON-lines file.

``python -m hyper_parallel.plot METRICS.jsonl [-o curves.png]`` reads the records written with
``metrics.enable_jsonl`` (one object per logged step; validation records add ``validation/loss``) and
draws the training loss, the validation loss when present, and the learning rate against the step.
matplotlib is an optional extra: ``python -m pip install -e '.[plot]'``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "plot_metrics", "read_metrics"]

_USAGE = "usage: python -m hyper_parallel.plot METRICS.jsonl [-o OUTPUT.png]\n"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics JSON-lines file; ``ValueError`` names the first line that is not JSON."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON object: {exc.msg}") from None
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError(f"{path}:{number}: a metrics record needs a 'step'")
            records.append(record)
    return records


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def plot_metrics(records: Sequence[dict[str, Any]], output: str | Path) -> Path:
    """Draw loss (training and validation) and learning rate against the step into ``output``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    train_steps, train_loss = _series(records, "loss")
    if not train_steps:
        raise ValueError("no training loss in the records (was metrics.enable_jsonl set?)")
    figure, (loss_axes, lr_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    loss_axes.plot(train_steps, train_loss, label="training loss")
    val_steps, val_loss = _series(records, "validation/loss")
    if val_steps:
        loss_axes.plot(val_steps, val_loss, "o-", label="validation loss")
    loss_axes.set_ylabel("loss")
    loss_axes.legend()
    loss_axes.grid(alpha=0.3)
    lr_steps, lr = _series(records, "lr")
    lr_axes.plot(lr_steps, lr, color="tab:orange")
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
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write(_USAGE)
        return 2
    try:
        written = plot_metrics(read_metrics(args[0]), output)
    except ImportError:
        sys.stderr.write("plotting needs matplotlib: python -m pip install -e '.[plot]'\n")
        return 2
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
