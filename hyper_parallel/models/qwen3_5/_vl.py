"""Qwen 3.5 vision-language model: vision tower + hybrid language model (imported lazily).

Image placeholder tokens (``image_token_id``) in the prompt are replaced, in order, by the merged
vision tokens of each image, and positions become 3-D (time, height, width) for M-RoPE: text tokens
advance all three axes together; an image of merged grid ``(t, h, w)`` starting at position ``p`` gets
``(p + ti, p + hi, p + wi)`` and the text after it continues at ``p + max(h, w)``. Videos (timestamped
frames) are not supported yet.

Parameter names: ``visual.*`` (see ``_vision``) and ``language_model.*`` (see ``_modules``).
"""

from __future__ import annotations

import torch
from torch import nn

from hyper_parallel.models.qwen3_5._modules import Qwen3_5Model
from hyper_parallel.models.qwen3_5._vision import VisionTower
from hyper_parallel.models.qwen3_5.args import Qwen3_5VLArgs

__all__ = ["IMAGE_TOKEN_ID", "Qwen3_5VLModel", "build_qwen3_5_vl", "mrope_positions"]

#: Id of the image placeholder token in the released Qwen 3.5 tokenizer (``Qwen3_5VLArgs`` default).
IMAGE_TOKEN_ID = 248_056


def mrope_positions(
    tokens: torch.Tensor,
    image_mask: torch.Tensor | None,
    grid_thw: torch.Tensor,
    merge: int,
    *,
    image_token_id: int | None = None,
) -> torch.Tensor:
    """M-RoPE positions (3, batch, seq) for ``tokens`` whose ``image_mask`` marks image placeholders.

    ``grid_thw`` lists the images in prompt order (row-major over the batch), in patches before merging.
    Every placeholder must belong to an image and every image fill its placeholders (``ValueError``), so
    the positions also vouch for the placeholder count. ``image_mask`` None with ``image_token_id=``
    reads the placeholders from ``tokens`` itself: given host tensors (a batch before it moves to the
    device), nothing then reads the device. The positions are built where ``tokens`` are.
    """
    batch, seq = tokens.shape
    positions = torch.zeros(3, batch, seq, dtype=torch.long, device=tokens.device)
    grids = iter(grid_thw.tolist())
    if image_mask is None:
        if image_token_id is None:
            raise ValueError("mrope_positions needs image_mask or image_token_id")
        mask = [[token == image_token_id for token in row] for row in tokens.tolist()]
    else:
        mask = image_mask.tolist()
    for b in range(batch):
        i, pos = 0, 0
        while i < seq:
            if not mask[b][i]:
                positions[:, b, i] = pos
                i, pos = i + 1, pos + 1
                continue
            grid = next(grids, None)
            if grid is None:
                raise ValueError(f"sample {b}: image placeholder tokens at {i} but no image left in grid_thw")
            t, h, w = grid
            h, w = h // merge, w // merge
            tt, hh, ww = torch.meshgrid(
                torch.arange(t, device=tokens.device),
                torch.arange(h, device=tokens.device),
                torch.arange(w, device=tokens.device),
                indexing="ij",
            )
            count = t * h * w
            if i + count > seq or not all(mask[b][i : i + count]):
                raise ValueError(
                    f"sample {b}: fewer image placeholder tokens at {i} than the image's {count}"
                )
            positions[:, b, i : i + count] = torch.stack((tt, hh, ww)).reshape(3, -1) + pos
            i, pos = i + count, pos + max(h, w)
    if next(grids, None) is not None:
        raise ValueError("grid_thw lists more images than the samples hold image placeholder tokens for")
    return positions


class Qwen3_5VLModel(nn.Module):
    """Token ids (batch, seq) plus optional image patches to logits (batch, seq, vocab)."""

    def __init__(self, args: Qwen3_5VLArgs) -> None:
        super().__init__()
        self.args = args
        self.visual = VisionTower(args.vision, args.text.dim)
        self.language_model = Qwen3_5Model(args.text)

    def tie_weights(self) -> None:
        self.language_model.tie_weights()

    def forward(
        self,
        tokens: torch.Tensor,
        pixel_values: torch.Tensor | None = None,
        grid_thw: torch.Tensor | None = None,
        image_token_id: int | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits; ``image_token_id`` (default ``args.image_token_id``) marks the image placeholders.

        ``positions`` (3, batch, seq): the M-RoPE positions :func:`mrope_positions` computed from the same
        tokens and ``grid_thw`` on the host, where it also checked the placeholders against the images.
        Given them and a host ``grid_thw``, the forward reads nothing back from the device; without them
        it computes both here (reading the tokens and the placeholder count from the device).
        """
        if image_token_id is None:
            image_token_id = self.args.image_token_id
        h = self.language_model.embed(tokens)
        if pixel_values is None:
            return self.language_model.forward_embeddings(h)
        if grid_thw is None:
            raise ValueError("grid_thw is required with pixel_values")
        features = self.visual(pixel_values, grid_thw).to(h.dtype)
        image_mask = tokens == image_token_id
        if positions is None:
            if int(image_mask.sum()) != features.shape[0]:
                raise ValueError(
                    f"{int(image_mask.sum())} image placeholder tokens but {features.shape[0]} image features"
                )
            positions = mrope_positions(tokens, image_mask, grid_thw, self.args.vision.spatial_merge_size)
        h = h.masked_scatter(image_mask[..., None], features)
        return self.language_model.forward_embeddings(h, positions)

    def host_positions(self, tokens: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The ``positions`` of :meth:`forward` for host ``tokens`` and ``grid_thw`` (a batch before it
        moves to the device; the trainer calls it there): :func:`mrope_positions` with this model's
        merge size and image placeholder id, built on the host."""
        return mrope_positions(
            tokens,
            None,
            grid_thw,
            self.args.vision.spatial_merge_size,
            image_token_id=self.args.image_token_id,
        )

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        self.visual.init_weights(std)
        self.language_model.init_weights(std)


def build_qwen3_5_vl(args: Qwen3_5VLArgs, device: str) -> Qwen3_5VLModel:
    """The module on ``device``; initialised unless ``device`` is ``"meta"``."""
    with torch.device(device):
        model = Qwen3_5VLModel(args)
    if torch.device(device).type != "meta":
        model.init_weights()
    return model
