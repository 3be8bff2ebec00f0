"""``LLMTrainer``: causal language-model training on token batches."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hyper_parallel.trainer.base import Trainer

__all__ = ["LLMTrainer"]


class LLMTrainer(Trainer):
    """Trains a text model: each micro-batch is ``{input_ids, labels}`` of ``[micro_batch_size, seq_len]``.

    ``LLMTrainer(cfg).train()`` is what ``python -m hyper_parallel.train_lm`` runs.
    """

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the token ids."""
        logits: torch.Tensor = self.model(batch["input_ids"])
        return logits
