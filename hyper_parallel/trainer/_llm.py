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
        inputs at every step, and the other two split what the calls would take whole. Compiled blocks,
        where a call per document would break each block's graph, keep them on the host where torch has a
        variable-length kernel that compiles inline (the model then attends through the compiled blocks'
        plan, ``AttentionPlan.for_device(device, compiled=True)``), else on the device (FlexAttention's
        mask, which compiles inline too).
        """
        ids = batch.get("document_ids")
        if ids is None or ids.device.type != "cpu" or self.pipeline is not None:
            return {}
        if ids.shape[-1] > 1 and not bool((ids[:, 1:] != ids[:, :-1]).any()):
            return {"document_ids": None}
        compiled = self.config.compile.enable and "model" in self.config.compile.components
        whole = self.device.type == "cuda" and self.dims.tp == 1 and self.dims.cp == 1
        if whole and (not compiled or self._varlen_in_compiled_blocks()):
            return {"document_ids": ids}
        return {}

    def _varlen_in_compiled_blocks(self) -> bool:
        """Whether the compiled blocks attend through torch's variable-length kernel: where this torch has
        it and the model takes an attention plan (the native models), which is then set to the compiled
        blocks' one (once)."""
        from hyper_parallel.models import AttentionPlan

        plan = AttentionPlan.for_device(self.device, compiled=True)
        if plan.varlen is None or not hasattr(self.model, "attention_plan"):
            return False
        if getattr(self.model, "attention_plan", None) is not plan:
            setattr(self.model, "attention_plan", plan)  # noqa: B010 (nn.Module types attributes as modules)
        return True

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
