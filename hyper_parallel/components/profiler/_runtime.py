"""Runtime of ``hyper_parallel.components.profiler``: a scheduled ``torch.profiler`` or a no-op.

Imported only from ``Profiler.Config.build``. The no-op profiler imports nothing; the torch profiler is
created by ``TorchProfilerContext``, which imports torch when built.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyper_parallel.components.profiler import TorchProfiler

__all__ = ["NullProfiler", "TorchProfilerContext"]


class NullProfiler:
    """The disabled profiler: a context manager whose ``step()`` does nothing."""

    enabled = False

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def step(self) -> None:
        """Mark the end of a training step (no-op)."""


class TorchProfilerContext:
    """``with profiler: ... profiler.step()`` after each training step.

    Every ``profile_freq`` steps the profiler idles ``wait`` steps, warms up ``warmup`` steps and
    records ``active`` steps; at the end of each cycle a Chrome trace is written to
    ``save_traces_folder/iteration_<step>/rank<rank>_trace.json`` (``<step>`` is the number of steps done).
    """

    enabled = True

    def __init__(self, cfg: TorchProfiler.Config, *, rank: int = 0) -> None:
        import torch.profiler

        self.cfg, self.rank = cfg, rank
        self.folder = Path(cfg.save_traces_folder)
        self.traces: list[Path] = []
        wait = cfg.wait if cfg.wait is not None else cfg.profile_freq - cfg.warmup - cfg.active
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=wait, warmup=cfg.warmup, active=cfg.active),
            on_trace_ready=self._trace_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.record_memory,
            with_stack=cfg.with_stack,
        )

    def _trace_ready(self, prof: Any) -> None:
        folder = self.folder / f"iteration_{prof.step_num}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}_trace.json"
        prof.export_chrome_trace(str(path))
        self.traces.append(path)
        if self.cfg.record_memory:
            import torch

            if torch.cuda.is_available():
                prof.export_memory_timeline(str(folder / f"rank{self.rank}_memory.html"))

    def __enter__(self) -> TorchProfilerContext:
        self._profiler.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        self._profiler.__exit__(*exc)  # type: ignore[no-untyped-call]

    def step(self) -> None:
        """Mark the end of a training step."""
        with warnings.catch_warnings():
            # Clearing the events after each cycle is the intent: one trace per cycle.
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
            self._profiler.step()
