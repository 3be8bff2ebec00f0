"""``VLTrainer``: vision-language training; batches may carry image patches beside the tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hyper_parallel.trainer._trainer import Trainer

__all__ = ["VLTrainer"]


class VLTrainer(Trainer):
    """Trains a vision-language model (``python -m hyper_parallel.train_vl``).

    A micro-batch holds ``input_ids`` and ``labels`` and, for samples with images, ``pixel_values`` (the
    flattened patches) and ``grid_thw`` (patches per image along time, height, width), whose placeholder
    tokens the model replaces with the vision tower's features. Text-only batches train the language model
    alone.
    """

    #: Needs a vision-language model (refused otherwise, as ``train_vl`` refuses it).
    kind = "vl"

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
