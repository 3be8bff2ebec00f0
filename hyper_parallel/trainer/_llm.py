"""``LLMTrainer``: causal language-model training on token batches."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hyper_parallel.trainer._trainer import Trainer

__all__ = ["LLMTrainer"]


class LLMTrainer(Trainer):
    """Trains a text model: each micro-batch is ``{input_ids, labels}`` of ``[micro_batch_size, seq_len]``.

    ``LLMTrainer(cfg).train()`` is what ``python -m hyper_parallel.train_lm`` runs.
    """

    #: Feeds token batches: image-caption data is refused (as ``train_lm`` refuses it).
    kind = "lm"

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the token ids; packed documents stay apart when the batch says where they are."""
        documents = batch.get("document_ids")
        if documents is None:
            logits: torch.Tensor = self.model(batch["input_ids"])
        else:
            logits = self.model(batch["input_ids"], document_ids=documents)
        return logits
