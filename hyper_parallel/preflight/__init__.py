"""Preflight: parameter count, memory per rank and step cost of a resolved config, before anything runs.

Plain arithmetic over the model's architecture arguments (each model's ``preflight()`` cost model), the
parallel layout, batch, precision, optimizer and activation checkpointing; torch is never imported.
``--dry-run`` prints :func:`preflight_report`; ``--device-memory`` turns it into :func:`memory_issues`.
"""

from typing import TYPE_CHECKING

from hyper_parallel.preflight.devices import DEVICES, Device, parse_device
from hyper_parallel.preflight.estimate import Estimate, estimate
from hyper_parallel.preflight.fit import memory_issues
from hyper_parallel.preflight.report import format_report

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = [
    "DEVICES",
    "Device",
    "Estimate",
    "estimate",
    "format_report",
    "memory_issues",
    "parse_device",
    "preflight_report",
]


def preflight_report(cfg: "RunConfig", world_size: int | None = None, device: Device | None = None) -> str:
    """The report text of ``cfg`` on ``world_size`` ranks (a one-line note when the model has no estimate)."""
    est = estimate(cfg, world_size)
    if est is None:
        return f"preflight: no estimate for {cfg.model.name} (its arguments offer no preflight())\n"
    return format_report(est, device)
