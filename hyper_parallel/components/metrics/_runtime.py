"""Runtime of ``hyper_parallel.components.metrics``: the metrics processor.

Imported only from ``Metrics.Config.build``. Console and JSON-lines output need nothing but the standard
library; TensorBoard (``enable_tensorboard``, through ``torch.utils.tensorboard``) and Weights & Biases
(``enable_wandb``) are optional extras: ``--dry-run`` refuses a switch whose package is missing, and a
config built in Python without it gets a warning and no such sink.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, TextIO

from hyper_parallel._disk import write_problem
from hyper_parallel._paths import NotRegularFileError, kind_problem
from hyper_parallel.preflight.flops import mfu

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


def _mix(data_tokens: Mapping[str, int]) -> str:
    """``data web 25% code 75%``: each source's share of the tokens supplied so far, by its path."""
    total = max(sum(data_tokens.values()), 1)
    shares = " ".join(f"{k} {100 * v / total:.0f}%" for k, v in data_tokens.items())
    return f"data {shares}"


def _per_rank(path: str, rank: int) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix}")


class MetricsProcessor:
    """Collects per-step values and writes one record every ``log_freq`` steps.

    Call ``record(step, loss=..., lr=..., grad_norm=..., num_tokens=...)`` after every optimizer step;
    on logging steps it returns the record written (``loss`` is the mean since the last record,
    ``tokens_per_second`` counts the tokens of this rank since then, ``memory_gib`` is the peak), else
    None. A processor on a rank that does not log (``rank0_only`` and rank > 0) writes nothing.

    Every JSON-lines record carries ``run_id``, new at each launch (the run name and a random suffix), so
    launches appending to one file stay apart; a launch that resumed a checkpoint at step S first writes
    ``{"run_id": ..., "step": S, "event": "resumed"}``, from which ``python -m hyper_parallel.plot`` draws the
    resumed run as the continuation of the one before it (its records win for steps after S).
    """

    def __init__(
        self,
        cfg: MetricsLogger.Config,
        *,
        rank: int = 0,
        stream: TextIO | None = None,
        clock: Any = time.perf_counter,
        max_steps: int | None = None,
        resumed_from: int | None = None,
        peak_flops: float | None = None,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.max_steps = max_steps
        self.active = rank == 0 or not cfg.rank0_only
        self.run_name = cfg.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{self.run_name}-{secrets.token_hex(3)}"
        self._stream = stream if stream is not None else sys.stdout
        self._clock = clock
        self._last_time = clock()
        self._start_time = self._last_time
        self._start_step: int | None = None
        self.peak_flops = peak_flops
        self._tokens = 0
        self._flops: float | None = 0.0
        self._losses: list[SupportsFloat] = []
        self._extra_keys: tuple[str, ...] = ()  # model figures of the last record (shown on the console)
        self._step_times: list[float] = []
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._bar_shown = False
        self._last_loss: float | None = None
        self._jsonl: TextIO | None = None
        self._tb: Any = None
        self._wandb: Any = None
        if not self.active:
            return
        self.jsonl_path: Path | None = None
        self._tb_folder: Path | None = None
        if cfg.enable_jsonl:
            path = Path(cfg.jsonl_path) if cfg.rank0_only else _per_rank(cfg.jsonl_path, rank)
            self.jsonl_path = path
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                problem = kind_problem(path)  # a FIFO would block the open, a device swallow the records
                if problem is not None:
                    raise NotRegularFileError(problem)
                self._jsonl = path.open("a", encoding="utf-8")
                if resumed_from:
                    self._write_jsonl({"step": resumed_from, "event": "resumed"})
            except OSError as exc:
                self._refuse_at_start(path, "metrics.jsonl_path", exc)
        if cfg.enable_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                _log.warning("enable_tensorboard is set but TensorBoard is not installed; skipping it")
            else:
                folder = Path(cfg.tensorboard_folder) / self.run_name
                if not cfg.rank0_only:
                    folder = folder / f"rank{rank}"
                self._tb_folder = folder
                try:
                    self._tb = SummaryWriter(log_dir=str(folder))
                except OSError as exc:
                    self._refuse_at_start(folder, "metrics.tensorboard_folder", exc)
        if cfg.enable_wandb:
            self._wandb = self._start_wandb(resumed_from)

    def _start_wandb(self, resumed_from: int | None) -> Any:
        """A W&B run named like the console's (``WANDB_MODE`` and the other W&B variables apply)."""
        try:
            import wandb  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            _log.warning("enable_wandb is set but wandb is not installed; skipping it")
            return None
        folder = Path(self.cfg.wandb_folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = self.run_name if self.cfg.rank0_only else f"{self.run_name}-rank{self.rank}"
        return wandb.init(
            project=self.cfg.wandb_project,
            name=name,
            dir=str(folder),
            config={"run_id": self.run_id, "resumed_from": resumed_from},
            settings=wandb.Settings(console="off", save_code=False, x_disable_stats=True),
        )

    def should_log(self, step: int) -> bool:
        """Whether ``record`` writes at ``step``."""
        return self.active and step % self.cfg.log_freq == 0

    def record(
        self,
        step: int,
        *,
        loss: SupportsFloat,
        lr: float,
        grad_norm: SupportsFloat | None = None,
        num_tokens: int = 0,
        flops: float | None = None,
        step_time: float | None = None,
        data_tokens: Mapping[str, int] | None = None,
        **extra: float,
    ) -> dict[str, Any] | None:
        """Account for one optimizer step; write and return a record on logging steps.

        ``step_time`` is this step's wall time in seconds (the record reports the mean since the last
        record); with ``max_steps`` known the record carries the estimated time to the end, ``eta_seconds``.
        ``flops`` is this rank's model FLOPs in the step: the record gives ``tflops`` (achieved TFLOP/s of
        this rank since the last record) and ``mfu`` (percent of ``peak_flops``), null when unknown.
        On a terminal, steps between records advance a progress bar instead of printing.
        """
        if not self.active:  # holds nothing: device values would pile up unread
            return None
        if self._start_step is None:
            self._start_step = step - 1
        self._tokens += num_tokens
        self._flops = None if flops is None or self._flops is None else self._flops + flops
        self._losses.append(loss)  # read on logged steps only: a device value waits for the device
        if step_time is not None:
            self._step_times.append(float(step_time))
        if not self.should_log(step):
            if self._tty and self.max_steps:
                self._progress(step)
            return None
        now = self._clock()
        elapsed = max(now - self._last_time, 1e-9)
        record: dict[str, Any] = {
            "run_id": self.run_id,
            "step": step,
            "loss": sum(float(x) for x in self._losses) / len(self._losses),
            "lr": float(lr),
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "tokens_per_second": self._tokens / elapsed,
            "tflops": None if self._flops is None else self._flops / elapsed / 1e12,
            "step_time": (sum(self._step_times) / len(self._step_times)) if self._step_times else None,
            "memory_gib": _memory_gib(),
            **{k: float(v) for k, v in extra.items()},
        }
        record["mfu"] = mfu(None if self._flops is None else self._flops / elapsed, self.peak_flops)
        if data_tokens:
            record["data_tokens"] = {str(k): int(v) for k, v in data_tokens.items()}
        self._extra_keys = tuple(extra)
        if self.max_steps is not None:
            done = step - self._start_step
            record["eta_seconds"] = (now - self._start_time) / max(done, 1) * max(self.max_steps - step, 0)
        self._last_time, self._tokens, self._losses, self._step_times = now, 0, [], []
        self._last_loss = record["loss"]
        self._flops = 0.0
        self._write(record)
        return record

    def _progress(self, step: int) -> None:
        """The bar, the step, the loss of the last record (nothing is read from the device) and the ETA."""
        assert self.max_steps is not None
        assert self._start_step is not None
        width = 30
        filled = width * min(step, self.max_steps) // self.max_steps
        bar = "#" * filled + "." * (width - filled)
        parts = [f"\r[{bar}] {step}/{self.max_steps}"]
        if self._last_loss is not None:
            parts.append(f"loss {self._last_loss:.4f}")
        done = step - self._start_step
        remaining = (self._clock() - self._start_time) / max(done, 1) * max(self.max_steps - step, 0)
        parts.append(f"eta {_duration(remaining)}")
        self._stream.write("  ".join(parts) + "\x1b[K")  # erase what a longer bar left
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
            "tflops n/a" if record["tflops"] is None else f"tflops {record['tflops']:.3g}",
            "mfu n/a" if record["mfu"] is None else f"mfu {record['mfu']:.1f}%",
        ]
        if record.get("step_time") is not None:
            parts.append(f"step_time {record['step_time']:.3f}s")
        parts.append(f"mem {record['memory_gib']:.2f} GiB")
        # Per-layer figures (``group/LAYER/name``) go to the files only: a console line per layer is noise.
        parts.extend(
            f"{key} {record[key]:.4g}" for key in self._extra_keys if key in record and "/" not in key
        )
        if "eta_seconds" in record:
            parts.append(f"eta {_duration(record['eta_seconds'])}")
        if record.get("data_tokens"):
            parts.append(_mix(record["data_tokens"]))
        return f"[{self.run_name}] " + "  ".join(parts)

    def _write(self, record: dict[str, Any]) -> None:
        self._clear_bar()
        print(self._line(record), file=self._stream, flush=True)
        self._append(record)
        self._scalars(record["step"], {k: v for k, v in record.items() if k not in ("step", "run_id")})

    def _scalars(self, step: int, values: dict[str, Any]) -> None:
        """The numbers of a record to TensorBoard and W&B (nulls left out)."""
        shown = {key: value for key, value in values.items() if value is not None}
        if self._tb is not None:
            try:
                for key, value in shown.items():
                    if key == "data_tokens":
                        for source, count in value.items():
                            self._tb.add_scalar(f"data_tokens/{source}", count, step)
                    else:
                        self._tb.add_scalar(key, value, step)
            except OSError as exc:  # its writer thread re-raises a failed write on the next call
                self._turn_off_tensorboard(exc)
        if self._wandb is not None:
            self._wandb.log(shown, step=step)

    def log_validation(self, step: int, values: dict[str, float]) -> None:
        """Write validation results (``{"loss": ..., "perplexity": ...}``) under ``validation/``."""
        if not self.active:
            return
        # Counts (tokens, batches) stay integers: ``tokens 378``, not ``tokens 378.0000``.
        scalars = {f"validation/{k}": v if type(v) is int else float(v) for k, v in values.items()}
        shown = "  ".join(f"{k} {v}" if type(v) is int else f"{k} {v:.4f}" for k, v in scalars.items())
        self._clear_bar()
        print(f"[{self.run_name}] step {step:>6}  {shown}", file=self._stream, flush=True)
        self._append({"run_id": self.run_id, "step": step, **scalars})
        self._scalars(step, scalars)

    def _append(self, record: dict[str, Any]) -> None:
        """One JSON-lines record (``run_id`` first); a failed write turns the sink off (see below)."""
        if self._jsonl is not None:
            try:
                self._write_jsonl(record)
            except OSError as exc:
                self._turn_off_jsonl(exc)

    def _write_jsonl(self, record: dict[str, Any]) -> None:
        """Write and flush one record, so a killed run keeps what it logged."""
        assert self._jsonl is not None
        self._jsonl.write(json.dumps({"run_id": self.run_id, **record}) + "\n")
        self._jsonl.flush()

    # A sink that cannot be written: before the first step the launch stops (nothing is lost yet and the
    # user asked for the file); during the run the sink is turned off with one warning and training goes
    # on, since a full disk under a metrics file must not cost the hours of a run (its console line still
    # shows every record, and its checkpoints say for themselves whether they could be saved).
    def _refuse_at_start(self, path: Path, field: str, exc: OSError) -> None:
        from hyper_parallel.errors import InputFileError

        self._close_quietly()
        if isinstance(exc, NotRegularFileError):
            raise InputFileError.at(path, f"{exc}; set {field} to a file") from None
        raise InputFileError.at(path, f"{write_problem(exc)}; free space or set {field} elsewhere") from None

    def _turn_off_jsonl(self, exc: OSError) -> None:
        _give_up(self._jsonl, self.jsonl_path, "enable_jsonl", exc)
        self._jsonl = None

    def _turn_off_tensorboard(self, exc: OSError) -> None:
        _give_up(self._tb, self._tb_folder, "enable_tensorboard", exc)
        self._tb = None

    def _close_quietly(self) -> None:
        """Close what the constructor opened before a sink refused to start."""
        for sink in (self._jsonl, self._tb):
            if sink is not None:
                with contextlib.suppress(OSError):
                    sink.close()
        self._jsonl = self._tb = None

    def clear_progress(self) -> None:
        """Erase the progress bar (if shown) so that a line printed next starts at the left margin."""
        self._clear_bar()

    def _clear_bar(self) -> None:
        """Erase the progress bar so the next line starts clean."""
        if self._bar_shown:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()
            self._bar_shown = False

    def close(self) -> None:
        """Close the files (a failed final write is a warning, as during the run)."""
        if self._jsonl is not None:
            try:
                self._jsonl.close()
                self._jsonl = None
            except OSError as exc:
                self._turn_off_jsonl(exc)
        if self._tb is not None:
            try:
                self._tb.close()
                self._tb = None
            except OSError as exc:
                self._turn_off_tensorboard(exc)
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _give_up(sink: Any, where: Path | None, switch: str, exc: OSError) -> None:
    """Warn once that the metrics sink writing to ``where`` failed (``exc``) and is off for the rest of the
    run, and close it (its buffer cannot be written either)."""
    _log.warning(
        "%s: %s; metrics.%s turned off for the rest of the run (training goes on, the console line shows "
        "every record)",
        where,
        write_problem(exc),
        switch,
    )
    if sink is not None:
        with contextlib.suppress(OSError):
            sink.close()
