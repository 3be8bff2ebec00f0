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

    def host_inputs(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
        """The image grids and the M-RoPE positions, read from the host batch before it moves.

        ``grid_thw`` stays on the host (the vision tower reads its sizes as numbers) and the positions,
        computed there from the tokens (checking the placeholders against the images), go to the device:
        the step then reads nothing back from it.
        """
        grid_thw = batch.get("grid_thw")
        host_positions = getattr(self.model, "host_positions", None)  # the vision-language models have it
        if grid_thw is None or "pixel_values" not in batch or not callable(host_positions):
            return {}
        positions: torch.Tensor = host_positions(batch["input_ids"], grid_thw)
        return {"grid_thw": grid_thw, "positions": positions.to(self.device, non_blocking=True)}

    def forward(self, batch: Mapping[str, torch.Tensor], head: Any = None) -> torch.Tensor:
        """Logits of the tokens, with image features in place of the image placeholder tokens (never a
        ``head``: the fused loss is not used here, ``components/loss/chunking.py``)."""
        pixel_values = batch.get("pixel_values")
        if pixel_values is None:
            logits: torch.Tensor = self.model(batch["input_ids"])
        else:
            logits = self.model(
                batch["input_ids"],
                pixel_values=pixel_values,
                grid_thw=batch["grid_thw"],
                positions=batch.get("positions"),
            )
        return logits
