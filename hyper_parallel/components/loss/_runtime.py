"""Runtime of ``hyper_parallel.components.loss``: the causal language-modelling loss.

Imported only from ``Loss.Config.build``; this module imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from hyper_parallel.components.loss import CausalLMLoss

__all__ = ["CausalLMLossFn"]


class CausalLMLossFn:
    """Next-token cross entropy: ``loss(logits, labels)``.

    ``logits`` is ``[batch, seq, vocab]`` and ``labels`` is ``[batch, seq]`` aligned with the inputs (the
    Hugging Face convention: ``labels`` may simply be ``input_ids``); position ``t`` of the logits is
    scored against label ``t + 1``. Labels equal to ``ignore_index`` are not counted. A call returns the
    mean over the counted tokens of what it is given (0 when none is counted). How the micro-batches and
    ranks of an optimizer step are weighed (``loss.reduction``) is the trainer's: it divides the
    ``sum_and_count`` sums by the step's counted tokens (``sum``) or each micro-batch's (``mean``), which
    a call holding the whole batch does alike. The loss is computed in float32.
    """

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        z_loss_weight: float = 0.0,
    ) -> None:
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.z_loss_weight = z_loss_weight

    def _counted(self, labels: torch.Tensor) -> torch.Tensor:
        return labels[:, 1:] != self.ignore_index

    def count_tokens(self, labels: torch.Tensor) -> torch.Tensor:
        """Tokens of ``labels`` the loss counts (shifted, not ignored): a token-weighted mean's weight."""
        return self._counted(labels).sum()

    def sum_and_count(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed loss over the counted (shifted, not ignored) tokens, and their number."""
        if logits.dim() != 3 or labels.shape != logits.shape[:2]:
            raise ValueError(
                f"expected logits [batch, seq, vocab] and labels [batch, seq], got "
                f"{tuple(logits.shape)} and {tuple(labels.shape)}"
            )
        shifted = logits[:, :-1, :].reshape(-1, logits.size(-1)).float()
        targets = labels[:, 1:].reshape(-1)
        total = F.cross_entropy(
            shifted,
            targets,
            ignore_index=self.ignore_index,
            reduction="sum",
            label_smoothing=self.label_smoothing,
        )
        counted = self._counted(labels).reshape(-1)
        if self.z_loss_weight:
            z = torch.logsumexp(shifted, dim=-1)
            total = total + self.z_loss_weight * (z.square() * counted).sum()
        return total, counted.sum()

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        total, count = self.sum_and_count(logits, labels)
        return total / count.clamp(min=1)


def build_causal_lm_loss(cfg: CausalLMLoss.Config) -> CausalLMLossFn:
    """The loss callable described by ``cfg``."""
    return CausalLMLossFn(
        ignore_index=cfg.ignore_index,
        label_smoothing=cfg.label_smoothing,
        z_loss_weight=cfg.z_loss_weight,
    )
