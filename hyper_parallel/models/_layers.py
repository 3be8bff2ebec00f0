"""PyTorch building blocks shared by the built-in models (imported lazily, with the model modules)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Documents", "FeedForward", "documents_from_ids", "rms_norm", "swiglu"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, in ``x``'s dtype.

    On accelerators through torch's fused kernel; on CPU, where that kernel's forward is slower than the
    composite (torch 2.13, measured), through the composite. Both compute the same thing.
    """
    if x.device.type != "cpu":
        fused: torch.Tensor = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return fused
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` that keeps only its two inputs for backward and recomputes ``silu(gate)``.

    Plain autograd would also keep ``silu(gate)``: a third (tokens, hidden) tensor per block.
    """

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad * F.silu(gate)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, keeping only the two inputs for backward when a gradient is needed."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        hidden: torch.Tensor = _SwiGLU.apply(gate, up)  # type: ignore[no-untyped-call]
        return hidden
    return F.silu(gate, inplace=True).mul_(up)  # nothing is saved: reuse the gate's buffer


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(swiglu(self.w1(x), self.w3(x)))
        return result


class Documents(NamedTuple):
    """Packed documents of a batch, in the forms the layers consume (see :func:`documents_from_ids`)."""

    #: (batch, seq) bool: True at the first token of every document after the first one of its row.
    resets: torch.Tensor
    #: (batch, seq) int64: the position of every token inside its document (RoPE positions).
    positions: torch.Tensor
    #: (batch, 1, seq, seq) bool attention mask: True where a query may attend a key (causal, same
    #: document), in the layout ``scaled_dot_product_attention`` broadcasts over heads.
    mask: torch.Tensor


def documents_from_ids(document_ids: torch.Tensor, shape: tuple[int, ...] | torch.Size) -> Documents:
    """Document boundaries from ``document_ids`` (batch, seq): a document starts where the id changes.

    ``shape`` is the (batch, seq) of the tokens; any other shape of ``document_ids`` is an error.
    """
    if tuple(document_ids.shape) != tuple(shape):
        raise ValueError(
            f"document_ids must have the (batch, seq) shape {tuple(shape)} of the tokens, "
            f"got {tuple(document_ids.shape)}"
        )
    resets = F.pad(document_ids[:, 1:] != document_ids[:, :-1], (1, 0))
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    starts = torch.where(resets, index, 0).cummax(dim=1).values
    doc = resets.cumsum(dim=1)  # an id reused later in the row is still a new document
    mask = (doc[:, :, None] == doc[:, None, :]).tril()[:, None]
    return Documents(resets=resets, positions=index - starts, mask=mask)
