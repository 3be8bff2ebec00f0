"""Runtime of ``hyper_parallel.components.validator``: mean held-out loss and perplexity.

Imported only from ``Validator.Config.build``; this module imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from hyper_parallel.components.validator import Validator

__all__ = ["LossValidatorRuntime"]


def _logits(output: Any) -> torch.Tensor:
    """Model output as logits: a tensor, or an object / dict with ``logits``."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output["logits"] if isinstance(output, dict) else output.logits
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}, not logits or an object with logits")
    return logits


class LossValidatorRuntime:
    """``validate(model, step)`` runs the loader's batches (at most ``steps``; -1: all) without gradients.

    The mean loss is token-weighted: the loss's ``sum_and_count`` gives each batch's summed loss and
    counted tokens (a loss without it counts each batch once, weighted by its number of labels), summed
    in float64 over batches and, with ``process_group`` (the data-parallel group), over its ranks; so
    the result does not depend on how the samples were dealt. ``perplexity`` is ``exp(loss)``;
    ``tokens`` is the total over the group, ``batches`` this rank's count. The model's training mode is
    restored afterwards; a loader with ``state_dict`` restarts from the position it had when the validator was
    built, so every validation sees the same batches. ``stop`` (the trainer's stop-signal check, a collective
    that every rank runs after the same batch) is asked after each batch: a pass it cuts short reports
    nothing, so a SIGTERM during a long validation waits for one batch, not the whole pass.
    """

    def __init__(
        self,
        cfg: Validator.Config,
        dataloader: Iterable[Any],
        loss: Any,
        *,
        process_group: ProcessGroup | None = None,
    ) -> None:
        self.cfg = cfg
        self.dataloader = dataloader
        self.loss = loss
        self.process_group = process_group
        get_state = getattr(dataloader, "state_dict", None)
        self._start = get_state() if callable(get_state) else None

    def should_validate(self, step: int) -> bool:
        """Whether validation is enabled and due at ``step``."""
        return bool(self.cfg.enable) and step % self.cfg.freq == 0

    def _sum_and_count(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fn = getattr(self.loss, "sum_and_count", None)
        if callable(fn):
            total, count = fn(logits, labels)
            return total.detach().double(), count.detach().double()
        weight = torch.tensor(float(labels.numel()), dtype=torch.float64)
        return self.loss(logits, labels).detach().double() * weight, weight

    @torch.no_grad()
    def validate(
        self, model: torch.nn.Module, step: int, *, stop: Callable[[], bool] | None = None
    ) -> dict[str, float] | None:
        """``{"loss", "perplexity", "tokens", "batches"}`` over the validation batches.

        None when ``stop()`` returned true after a batch: the pass was cut short and reports nothing.
        """
        if self._start is not None:
            self.dataloader.load_state_dict(self._start)  # type: ignore[attr-defined]
        was_training = model.training
        model.eval()
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros((), dtype=torch.float64, device=device)
        batches = 0
        try:
            for batch in self.dataloader:
                if 0 <= self.cfg.steps <= batches:
                    break
                input_ids = batch["input_ids"].to(device)
                labels = batch["labels"].to(device)
                documents = batch.get("document_ids")  # packed documents kept apart, as in training
                extra = {} if documents is None else {"document_ids": documents.to(device)}
                batch_total, batch_count = self._sum_and_count(_logits(model(input_ids, **extra)), labels)
                total += batch_total.to(device)
                count += batch_count.to(device)
                batches += 1
                if stop is not None and stop():
                    return None  # every rank asked the same question after the same batch
        finally:
            model.train(was_training)
        sums = torch.stack([total, count])
        if self.process_group is not None:
            dist.all_reduce(sums, group=self.process_group)
        total_loss, tokens = sums.tolist()
        if tokens == 0:
            raise ValueError(f"validation at step {step} counted no tokens ({batches} batches)")
        mean = total_loss / tokens
        return {
            "loss": mean,
            "perplexity": math.exp(mean) if mean < 700 else math.inf,
            "tokens": int(tokens),
            "batches": batches,
        }
