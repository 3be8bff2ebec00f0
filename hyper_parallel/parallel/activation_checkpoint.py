"""Activation checkpointing per block: recompute activations in backward as ``activation_checkpoint`` says.

The block's ``forward`` is wrapped in place (non-reentrant ``torch.utils.checkpoint``), so its class and
parameter names, hence state-dict keys, never change. Selective op-level checkpointing keeps the outputs of
matmuls, attention and reduce-scatters and recomputes the cheap element-wise operations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:  # annotations only: parallel sits below the trainer layer and never imports it
    from hyper_parallel.trainer.config import ActivationCheckpointConfig

__all__ = ["apply_activation_checkpointing"]


def _saved_ops() -> frozenset[Any]:
    """Operators whose outputs selective op-level checkpointing keeps: matmuls and attention."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_mm",
    )
    ops = {getattr(aten, name) for name in names if hasattr(aten, name)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor)  # recomputing a collective costs communication
    return frozenset(ops)


def _op_policy(saved: frozenset[Any], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in saved else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward: Callable[..., Any], config: ActivationCheckpointConfig) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    options: dict[str, Any] = {
        "use_reentrant": False,
        "preserve_rng_state": config.preserve_rng_state,
        "early_stop": config.early_stop,
    }
    if config.mode == "selective" and config.selective_option == "op":
        policy = functools.partial(_op_policy, _saved_ops())
        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, **options, **kwargs)

    return run


def apply_activation_checkpointing(blocks: Sequence[nn.Module], config: ActivationCheckpointConfig) -> None:
    """Recompute block activations in backward as ``config`` says (mode none/full/selective).

    ``full`` checkpoints every block; ``selective`` with ``"op"`` checkpoints every block but keeps the
    outputs of matmuls and attention (recomputing the cheap element-wise ops); ``selective`` with an
    integer ``n`` checkpoints every n-th block (the n-th, 2n-th ...). The block's ``forward`` is replaced
    in place, so its class and parameter names are unchanged.
    """
    if config.mode == "none":
        return
    every = config.selective_option if config.mode == "selective" else "op"
    for index, block in enumerate(blocks):
        if isinstance(every, int) and (index + 1) % every:
            continue
        block.forward = _checkpointed(block.forward, config)
