"""Runtime of ``hyper_parallel.components.lr_scheduler``: the warmup/plateau/decay factor and scheduler.

Imported only from ``LRScheduler.Config.build``; this module imports torch.

Closed form, with ``s`` the number of optimizer steps already taken (``s = 0`` is the first step),
``T = training_steps``, ``W = warmup_steps``, ``D = decay_steps(T)`` (``T - W`` when ``decay_ratio`` is
null), ``S = max(T - D, W)`` the first decay step and ``m = min_lr_factor``; the learning rate is
``lr * factor(s)``:

- warmup, ``s < W``: ``(s + 1) / (W + 1)`` (never 0, so the first step trains);
- plateau, ``W <= s < S``: ``1``;
- decay, ``S <= s``: with progress ``p = min((s - S) / (T - S - 1), 1)`` (``p = 1`` when ``T - S == 1``),
  ``linear``: ``m + (1 - m) * (1 - p)``, ``cosine``: ``m + (1 - m) * (1 + cos(pi * p)) / 2``,
  ``constant``: ``1``. The first decay step runs at the peak and the last step (``s = T - 1``) at ``m``.

When warmup and decay do not fit in ``T`` (the config layer warns), warmup keeps its length and the decay
gets the steps left, ``T - S``; a run shorter than its warmup ends before the peak.

A checkpoint holds the schedule's position, not its shape: ``state_dict()`` is ``{"step": s}`` and
``load_state_dict`` puts a scheduler built from the current config at step ``s``, setting the optimizer's
learning rates for it. A run resumed with a larger ``training.max_steps`` (or another warmup, decay or
peak ``lr``) therefore follows the new schedule from the saved step, where torch's ``LambdaLR`` would
restore the old shape from its saved factor attributes and base learning rates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hyper_parallel.components.lr_scheduler import WarmupDecay

__all__ = ["WarmupDecayFactor", "WarmupDecayLR", "build_warmup_decay"]


class WarmupDecayFactor:
    """The multiplicative factor of the learning rate at step ``s`` (the module docstring's closed form)."""

    def __init__(self, warmup_steps: int, decay_start: int, decay_steps: int, decay_type: str, m: float):
        self.warmup_steps = warmup_steps
        self.decay_start = decay_start
        self.decay_steps = decay_steps
        self.decay_type = decay_type
        self.min_lr_factor = m

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if step < self.decay_start or self.decay_type == "constant":
            return 1.0
        span = self.decay_steps - 1
        progress = 1.0 if span <= 0 else min((step - self.decay_start) / span, 1.0)
        m = self.min_lr_factor
        if self.decay_type == "linear":
            return m + (1.0 - m) * (1.0 - progress)
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupDecayLR(torch.optim.lr_scheduler.LambdaLR):
    """A ``LambdaLR`` over a ``WarmupDecayFactor`` whose saved state is its position alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, factor: WarmupDecayFactor) -> None:
        self.factor = factor
        super().__init__(optimizer, lr_lambda=factor)

    def state_dict(self) -> dict[str, Any]:
        """``{"step": s}``: the number of optimizer steps taken (JSON-serialisable)."""
        return {"step": self.last_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Move to the saved step of this (current-config) schedule and set the optimizer's lr for it."""
        step = state_dict.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"lr scheduler state needs a step >= 0, got {state_dict!r}")
        lrs = [base * self.factor(step) for base in self.base_lrs]
        for group, base, lr in zip(self.optimizer.param_groups, self.base_lrs, lrs, strict=True):
            group["initial_lr"], group["lr"] = base, lr
        self.last_epoch, self._step_count = step, step + 1
        self._last_lr = list(lrs)


def build_warmup_decay(
    cfg: WarmupDecay.Config, optimizer: torch.optim.Optimizer, training_steps: int
) -> WarmupDecayLR:
    """A ``WarmupDecayLR`` following the closed form in this module's docstring."""
    if training_steps < 1:
        raise ValueError(f"training_steps must be >= 1, got {training_steps}")
    start = max(training_steps - cfg.decay_steps(training_steps), cfg.warmup_steps)
    decay = max(training_steps - start, 0)
    factor = WarmupDecayFactor(cfg.warmup_steps, start, decay, cfg.decay_type, cfg.min_lr_factor)
    return WarmupDecayLR(optimizer, factor)
