"""``LLMTrainer``: causal language-model training on token batches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hyper_parallel.trainer._trainer import Trainer

__all__ = ["LLMTrainer"]


class LLMTrainer(Trainer):
    """Trains a text model: each micro-batch is ``{input_ids, labels}`` of ``[micro_batch_size, seq_len]``.

    ``LLMTrainer(cfg).train()`` is what ``python -m hyper_parallel.train_lm`` runs.
    """

    #: Feeds token batches: image-caption data is refused (as ``train_lm`` refuses it).
    kind = "lm"

    def host_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        """Document ids read on the host: none for a batch whose every row holds one document, and on
        CUDA the rest kept there, so that the model picks its attention kernel without a device sync.

        Masking rows of one document changes nothing but the kernel: without ids attention takes plain
        causal SDPA (cuDNN's kernel on an H200: 1.41 ms forward + backward at 2 x 4,096 tokens of the Llama
        3.2-1B shape, against 2.47 ms for FlexAttention's document mask). Rows of a few documents take one
        such call per document (``models._layers.SLICE_MAX_DOCUMENTS``). A pipeline, tensor and context
        parallelism keep the ids on the device (FlexAttention's mask): the pipeline's stages take the same
        inputs at every step, and the other two split what the calls would take whole; so do compiled
        blocks, where FlexAttention compiles inline and a call per document would break each block's graph.
        """
        ids = batch.get("document_ids")
        if ids is None or ids.device.type != "cpu" or self.pipeline is not None:
            return {}
        if ids.shape[-1] > 1 and not bool((ids[:, 1:] != ids[:, :-1]).any()):
            return {"document_ids": None}
        compiled = self.config.compile.enable and "model" in self.config.compile.components
        if self.device.type == "cuda" and self.dims.tp == 1 and self.dims.cp == 1 and not compiled:
            return {"document_ids": ids}
        return {}

    def forward(self, batch: Mapping[str, torch.Tensor], head: Any = None) -> torch.Tensor:
        """Logits of the token ids; packed documents stay apart when the batch says where they are. With
        ``head`` (the fused loss) the model hands it its final hidden states instead of projecting them."""
        documents = batch.get("document_ids")
        extra: dict[str, Any] = {} if head is None else {"head": head}
        if documents is None:
            logits: torch.Tensor = self.model(batch["input_ids"], **extra)
        else:
            logits = self.model(batch["input_ids"], document_ids=documents, **extra)
        return logits
