"""``VLTrainer``: vision-language training; batches may carry image patches beside the tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

import torch

from hyper_parallel.trainer._trainer import Trainer, TrainingError
from hyper_parallel.trainer.config import TrainerConfig

__all__ = ["VLTrainer"]


class VLTrainer(Trainer):
    """Trains a vision-language model (``python -m hyper_parallel.train_vl``).

    A micro-batch holds ``input_ids`` and ``labels`` and, for samples with images, ``pixel_values`` (the
    flattened patches) and ``grid_thw`` (patches per image along time, height, width), whose placeholder
    tokens the model replaces with the vision tower's features. Text-only batches train the language model
    alone.
    """

    def __init__(self, config: TrainerConfig, *, stream: TextIO | None = None) -> None:
        if getattr(config.model.args, "vision", None) is None:
            raise TrainingError(
                f"VLTrainer needs a vision-language model, but {config.model.name!r} has no vision tower; "
                "use hyper_parallel.models.qwen3_5.create_vl_model_spec, or LLMTrainer"
            )
        super().__init__(config, stream=stream)

    def data_inputs(self) -> dict[str, Any]:
        """Image data needs the vision tower's patch geometry and the image placeholder token id."""
        args = self.config.model.args
        return {"vision": args.vision, "image_token_id": args.image_token_id}  # type: ignore[attr-defined]

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the tokens, with image features in place of the image placeholder tokens."""
        pixel_values = batch.get("pixel_values")
        if pixel_values is None:
            logits: torch.Tensor = self.model(batch["input_ids"])
        else:
            logits = self.model(batch["input_ids"], pixel_values=pixel_values, grid_thw=batch["grid_thw"])
        return logits
