"""Runtime of ``hyper_parallel.components.lr_scheduler``: the warmup/plateau/decay factor and scheduler.

Imported only from ``LRScheduler.Config.build``; this module imports torch.

Closed form, with ``s`` the number of optimizer steps already taken (``s = 0`` is the first step),
``T = training_steps``, ``W = warmup_steps``, ``D = decay_steps(T)`` (``T - W`` when ``decay_ratio`` is
null), ``S = T - D`` the first decay step and ``m = min_lr_factor``; the learning rate is
``lr * factor(s)``:

- warmup, ``s < W``: ``(s + 1) / (W + 1)`` (never 0, so the first step trains);
- plateau, ``W <= s < S``: ``1``;
- decay, ``S <= s``: with progress ``p = min((s - S) / (D - 1), 1)`` (``p = 1`` when ``D == 1``),
  ``linear``: ``m + (1 - m) * (1 - p)``, ``cosine``: ``m + (1 - m) * (1 + cos(pi * p)) / 2``,
  ``constant``: ``1``. The first decay step runs at the peak and the last step (``s = T - 1``) at ``m``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hyper_parallel.components.lr_scheduler import WarmupDecay

__all__ = ["WarmupDecayFactor", "build_warmup_decay"]


class WarmupDecayFactor:
    """The multiplicative factor of ``LambdaLR``; a class so the scheduler's state_dict records it."""

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


def build_warmup_decay(
    cfg: WarmupDecay.Config, optimizer: torch.optim.Optimizer, training_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following the closed form in this module's docstring."""
    if training_steps < 1:
        raise ValueError(f"training_steps must be >= 1, got {training_steps}")
    if cfg.warmup_steps > training_steps:
        raise ValueError(f"warmup_steps ({cfg.warmup_steps}) exceeds training_steps ({training_steps})")
    decay = cfg.decay_steps(training_steps)
    start = training_steps - decay
    if start < cfg.warmup_steps:
        raise ValueError(
            f"warmup_steps ({cfg.warmup_steps}) plus decay steps ({decay}) exceed training_steps "
            f"({training_steps})"
        )
    factor = WarmupDecayFactor(cfg.warmup_steps, start, decay, cfg.decay_type, cfg.min_lr_factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)
