"""Activation checkpointing per block: recompute activations in backward as ``activation_checkpoint`` says.

The block's ``forward`` is wrapped in place (non-reentrant ``torch.utils.checkpoint``), so its class and
parameter names, hence state-dict keys, never change. Selective op-level checkpointing keeps the outputs of
matmuls (the experts' grouped ones too), attention and reduce-scatters and recomputes the cheap element-wise
operations (and, under expert parallelism, the experts' all-to-all dispatch, as whole-block checkpointing
does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import ActivationCheckpointConfig

__all__ = ["apply_activation_checkpointing"]


@functools.cache
def _saved_ops() -> frozenset[Any]:
    """Operators whose outputs selective op-level checkpointing keeps: matmuls and attention."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_grouped_mm",  # the experts' matmul of a mixture of experts
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_mm",
    )
    ops = {getattr(aten, name) for name in names if hasattr(aten, name)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    for name in ("reduce_scatter_tensor", "all_to_all_single"):  # recomputing a collective communicates
        if c10d is not None and hasattr(c10d, name):
            ops.add(getattr(c10d, name))
    return frozenset(ops)


def _op_policy(saved: frozenset[Any], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in saved else CheckpointPolicy.PREFER_RECOMPUTE


@functools.cache  # once per process: every checkpointed block asks
def _ignore_profiler_annotations() -> None:
    """Have selective checkpointing run profiler annotations as they come, without counting them.

    Selective checkpointing replays the forward's operators by count, and torch 2.13 counts the
    ``record_function`` annotations among them. FSDP2 annotates its hooks, and the hooks of a module
    sharded on its own inside a checkpointed block (the experts under expert parallelism) run a different
    number of times in the recomputation than in the forward, which then fails ("invocation index ...
    not found in storage"). Annotations compute nothing, so they join ``SAC_IGNORED_OPS``, the operators
    selective checkpointing already leaves alone.
    """
    from torch.utils.checkpoint import SAC_IGNORED_OPS

    profiler = torch.ops.profiler
    for name, overload in (
        ("_record_function_enter_new", "default"),
        ("_record_function_exit", "_RecordFunction"),
    ):
        op = getattr(getattr(profiler, name, None), overload, None)
        if op is not None:
            SAC_IGNORED_OPS.add(op)


def _checkpointed(forward: Callable[..., Any], config: ActivationCheckpointConfig) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    options: dict[str, Any] = {
        "use_reentrant": False,
        "preserve_rng_state": config.preserve_rng_state,
        "early_stop": config.early_stop,
    }
    if config.mode == "selective" and config.selective_option == "op":
        _ignore_profiler_annotations()
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
