"""Runtime of the fused, chunked cross entropy: the output projection and the loss, chunk by chunk of tokens.

The unfused path makes the whole ``tokens x vocab`` logits in the compute dtype, a float32 copy, the
float32 log-probabilities cross entropy keeps for backward and their float32 gradient: at the Llama 3.2-1B
shape (8,192 tokens, vocab 128,256) about 14 GiB, more than the model's activations. Here the model
hands its final hidden states and the output weight to :class:`ChunkedLinearCrossEntropy` (its ``head``)
instead of projecting them, and the loss walks the tokens ``chunk_tokens`` at a time: each chunk's logits
(float32), their log-sum-exp, the loss terms, and at once the chunk's gradient of the logits, which goes
straight into the gradients of the hidden states and of the output weight; the chunk's logits are then
dropped. The backward only scales those two gradients by the loss's incoming gradient (a scalar). The
matmul FLOPs are the unfused path's (one product forward, two for the gradients, none recomputed); what
stays alive from forward to backward is the two gradients, the size of the hidden states and of the
weight, instead of the logits.

Semantics are ``_runtime.CausalLMLossFn.sum_and_count``'s exactly (``tests/components/test_chunked_loss.py``
checks loss and both gradients against it within 1e-5 in float32): position ``t`` is scored against label
``t + 1``; labels equal to ``ignore_index`` count for nothing; label smoothing spreads ``epsilon`` over the
vocabulary as ``F.cross_entropy`` does (``(1 - epsilon) nll + epsilon (lse - mean logit)`` per counted
token); the z-loss adds ``weight x lse^2`` per counted token; the sum is returned and the caller divides
by the counted tokens as the trainer does for the unfused loss.

Imported only by the trainer when the loss is chunked; this module imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hyper_parallel.components.loss._runtime import CausalLMLossFn

__all__ = ["ChunkedLinearCrossEntropy", "linear_cross_entropy_sum"]


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Summed cross entropy of ``hidden @ weight.T`` against ``targets``, chunk by chunk (module doc)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk: int,
        ignore_index: int,
        smoothing: float,
        z_weight: float,
    ) -> torch.Tensor:
        # The dtype the unfused projection would compute in: autocast's (the trainer's mixed precision
        # without FSDP) or the inputs'. Every product below runs in it, explicitly, outside autocast.
        kind = hidden.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
        with torch.autocast(kind, enabled=False):
            grad_hidden, grad_weight, total = _forward(
                ctx.needs_input_grad,
                hidden,
                weight.to(dtype),
                targets,
                chunk,
                ignore_index,
                smoothing,
                z_weight,
            )
        ctx.save_for_backward(
            grad_hidden if grad_hidden is not None else hidden.new_empty(0),
            grad_weight.to(weight.dtype) if grad_weight is not None else weight.new_empty(0),
        )
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_total.float()
        return (
            grad_hidden * scale.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None,
            grad_weight * scale.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None,
            None,
            None,
            None,
            None,
            None,
        )


def _forward(
    needs_grad: tuple[bool, ...],
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk: int,
    ignore_index: int,
    smoothing: float,
    z_weight: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """The gradients of ``hidden`` and (float32) of ``weight`` where ``needs_grad`` asks for them, and the
    summed loss; ``weight`` is in the compute dtype, every product runs in it."""
    n, vocab = hidden.shape[0], weight.shape[0]
    grad_hidden = torch.empty_like(hidden) if needs_grad[0] else None
    grad_weight = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_grad[1] else None
    )
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, n, chunk):
        part = hidden[start : start + chunk].to(weight.dtype)
        labels = targets[start : start + chunk]
        logits = (part @ weight.t()).float()
        lse = torch.logsumexp(logits, dim=-1)
        counted = labels != ignore_index
        safe = torch.where(counted, labels, 0)
        picked = logits.gather(1, safe[:, None]).squeeze(1)
        per_token = (1.0 - smoothing) * (lse - picked)
        if smoothing:
            per_token = per_token + smoothing * (lse - logits.mean(dim=-1))
        if z_weight:
            per_token = per_token + z_weight * lse.square()
        total += (per_token * counted).sum()
        if grad_hidden is None and grad_weight is None:
            continue
        # d loss / d logits, in place over the logits: softmax x (1 + 2 z lse) - eps / V - (1 - eps) at
        # the target, zero for ignored tokens.
        grad = logits.sub_(lse[:, None]).exp_()
        if z_weight:
            grad.mul_((1.0 + 2.0 * z_weight * lse)[:, None])
        if smoothing:
            grad.sub_(smoothing / vocab)
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, safe] -= 1.0 - smoothing
        grad.mul_(counted[:, None])
        grad_c = grad.to(weight.dtype)
        if grad_hidden is not None:
            grad_hidden[start : start + chunk] = grad_c @ weight
        if grad_weight is not None:
            grad_weight += (grad_c.t() @ part).float()
    return grad_hidden, grad_weight, total


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_tokens: int,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss_weight: float = 0.0,
) -> torch.Tensor:
    """Summed next-token loss of ``hidden`` (batch, seq, dim) projected by ``weight`` (vocab, dim) against
    ``labels`` (batch, seq), ``chunk_tokens`` tokens of logits at a time (module docstring)."""
    if hidden.dim() != 3 or labels.shape != hidden.shape[:2] or weight.shape[-1] != hidden.shape[-1]:
        raise ValueError(
            f"expected hidden [batch, seq, dim], weight [vocab, dim] and labels [batch, seq], got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(labels.shape)}"
        )
    shifted = hidden[:, :-1, :].reshape(-1, hidden.shape[-1])
    targets = labels[:, 1:].reshape(-1)
    total: torch.Tensor = _FusedLinearCrossEntropy.apply(  # type: ignore[no-untyped-call]
        shifted, weight, targets, chunk_tokens, ignore_index, label_smoothing, z_loss_weight
    )
    return total


class ChunkedLinearCrossEntropy:
    """What a model's forward calls in place of its output projection (its ``head``): the summed loss of one
    micro batch's ``labels``, with the options of ``loss`` (``CausalLMLossFn``)."""

    def __init__(self, loss: CausalLMLossFn, labels: torch.Tensor, chunk_tokens: int) -> None:
        self.loss = loss
        self.labels = labels
        self.chunk_tokens = chunk_tokens

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy_sum(
            hidden,
            weight,
            self.labels,
            chunk_tokens=self.chunk_tokens,
            ignore_index=self.loss.ignore_index,
            label_smoothing=self.loss.label_smoothing,
            z_loss_weight=self.loss.z_loss_weight,
        )
