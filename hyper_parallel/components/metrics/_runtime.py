"""Runtime of ``hyper_parallel.components.metrics``: the metrics processor.

Imported only from ``Metrics.Config.build``. Console and JSON-lines output need nothing but the standard
library; TensorBoard is used when ``enable_tensorboard`` is set and ``torch.utils.tensorboard`` imports
(the ``tensorboard`` package is optional: without it a warning is logged once and the sink is skipped).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from hyper_parallel.components.metrics import MetricsLogger

__all__ = ["MetricsProcessor"]

_log = logging.getLogger(__name__)


def _memory_gib() -> float:
    """Peak accelerator memory allocated (CUDA), else the process's peak resident memory, in GiB."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return float(torch.cuda.max_memory_allocated()) / 2**30
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux/macOS
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return float(peak) / (2**30 if sys.platform == "darwin" else 2**20)


def _duration(seconds: float) -> str:
    """``h:mm:ss`` for an estimated remaining time."""
    total = round(seconds)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def _per_rank(path: str, rank: int) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


class MetricsProcessor:
    """Collects per-step values and writes one record every ``log_freq`` steps.

    Call ``record(step, loss=..., lr=..., grad_norm=..., num_tokens=...)`` after every optimizer step;
    on logging steps it returns the record written (``loss`` is the mean since the last record,
    ``tokens_per_second`` counts the tokens of this rank since then, ``memory_gib`` is the peak), else
    None. A processor on a rank that does not log (``rank0_only`` and rank > 0) writes nothing.
    """

    def __init__(
        self,
        cfg: MetricsLogger.Config,
        *,
        rank: int = 0,
        stream: TextIO | None = None,
        clock: Any = time.perf_counter,
        max_steps: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.max_steps = max_steps
        self.active = rank == 0 or not cfg.rank0_only
        self.run_name = cfg.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
        self._stream = stream if stream is not None else sys.stdout
        self._clock = clock
        self._last_time = clock()
        self._start_time = self._last_time
        self._start_step: int | None = None
        self._tokens = 0
        self._losses: list[float] = []
        self._extra_keys: tuple[str, ...] = ()  # model figures of the last record (shown on the console)
        self._step_times: list[float] = []
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar_shown = False
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        if not self.active:
            return
        if cfg.enable_jsonl:
            path = Path(cfg.jsonl_path) if cfg.rank0_only else _per_rank(cfg.jsonl_path, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = path.open("a", encoding="utf-8")
            self.jsonl_path: Path | None = path
        else:
            self.jsonl_path = None
        if cfg.enable_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                _log.warning("enable_tensorboard is set but TensorBoard is not installed; skipping it")
            else:
                folder = Path(cfg.tensorboard_folder) / self.run_name
                if not cfg.rank0_only:
                    folder = folder / f"rank{rank}"
                self._tb = SummaryWriter(log_dir=str(folder))

    def should_log(self, step: int) -> bool:
        """Whether ``record`` writes at ``step``."""
        return self.active and step % self.cfg.log_freq == 0

    def record(
        self,
        step: int,
        *,
        loss: float,
        lr: float,
        grad_norm: float | None = None,
        num_tokens: int = 0,
        step_time: float | None = None,
        **extra: float,
    ) -> dict[str, Any] | None:
        """Account for one optimizer step; write and return a record on logging steps.

        ``step_time`` is this step's wall time in seconds (the record reports the mean since the last
        record); with ``max_steps`` known the record carries the estimated time to the end, ``eta_seconds``.
        On a terminal, steps between records advance a progress bar instead of printing.
        """
        if self._start_step is None:
            self._start_step = step - 1
        self._tokens += num_tokens
        self._losses.append(float(loss))
        if step_time is not None:
            self._step_times.append(float(step_time))
        if not self.should_log(step):
            if self.active and self._tty and self.max_steps:
                self._progress(step)
            return None
        now = self._clock()
        elapsed = max(now - self._last_time, 1e-9)
        record: dict[str, Any] = {
            "step": step,
            "loss": sum(self._losses) / len(self._losses),
            "lr": float(lr),
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "tokens_per_second": self._tokens / elapsed,
            "step_time": (sum(self._step_times) / len(self._step_times)) if self._step_times else None,
            "memory_gib": _memory_gib(),
            **{k: float(v) for k, v in extra.items()},
        }
        self._extra_keys = tuple(extra)
        if self.max_steps is not None:
            done = step - self._start_step
            record["eta_seconds"] = (now - self._start_time) / max(done, 1) * max(self.max_steps - step, 0)
        self._last_time, self._tokens, self._losses, self._step_times = now, 0, [], []
        self._write(record)
        return record

    def _progress(self, step: int) -> None:
        assert self.max_steps is not None
        width = 30
        filled = width * min(step, self.max_steps) // self.max_steps
        bar = "#" * filled + "." * (width - filled)
        self._stream.write(f"\r[{bar}] {step}/{self.max_steps}")
        self._stream.flush()
        self._bar_shown = True

    def _line(self, record: dict[str, Any]) -> str:
        step = f"{record['step']:>6}"
        if self.max_steps is not None:
            step = f"{record['step']:>{len(str(self.max_steps))}}/{self.max_steps}"
        norm = "n/a" if record["grad_norm"] is None else f"{record['grad_norm']:.4f}"
        parts = [
            f"step {step}",
            f"loss {record['loss']:.4f}",
            f"lr {record['lr']:.3e}",
            f"grad_norm {norm}",
            f"tok/s {record['tokens_per_second']:,.0f}",
        ]
        if record.get("step_time") is not None:
            parts.append(f"step_time {record['step_time']:.3f}s")
        parts.append(f"mem {record['memory_gib']:.2f} GiB")
        parts.extend(f"{key} {record[key]:.4g}" for key in self._extra_keys if key in record)
        if "eta_seconds" in record:
            parts.append(f"eta {_duration(record['eta_seconds'])}")
        return f"[{self.run_name}] " + "  ".join(parts)

    def _write(self, record: dict[str, Any]) -> None:
        if self._bar_shown:
            self._stream.write("\r\x1b[2K")
            self._bar_shown = False
        print(self._line(record), file=self._stream, flush=True)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and value is not None:
                    self._tb.add_scalar(key, value, record["step"])

    def log_validation(self, step: int, values: dict[str, float]) -> None:
        """Write validation results (``{"loss": ..., "perplexity": ...}``) under ``validation/``."""
        if not self.active:
            return
        record = {"step": step, **{f"validation/{k}": float(v) for k, v in values.items()}}
        shown = "  ".join(f"{k} {v:.4f}" for k, v in record.items() if k != "step")
        print(f"[{self.run_name}] step {step:>6}  {shown}", file=self._stream, flush=True)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key != "step":
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        """Close the files."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
