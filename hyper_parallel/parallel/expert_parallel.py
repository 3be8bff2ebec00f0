"""Mixture-of-experts across ranks: the load-balancing loss over data-parallel ranks, and expert load.

The Switch-Transformer load-balancing loss of transformers' Qwen 3.5 MoE is
``n_experts * sum_e f_e * P_e``: ``f_e`` the share of top-k assignments expert ``e`` got, ``P_e`` its mean
router probability, both over every token of every MoE layer of the forward. It is not a mean of per-rank
values, so data-parallel ranks would each see another loss than one process on the same global batch.
:func:`load_balancing_loss` makes it exact: the assignment counts and token counts (no gradient) are summed
over the data-parallel group, and each rank contributes ``n_experts * sum_e f_e * p_e / N`` for its own
probability sums ``p_e`` (``N`` the global token count of all layers), so the rank contributions sum to the
one-process loss and their gradients to its gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = ["BalanceLoss", "load_balancing_loss"]


class BalanceLoss(NamedTuple):
    """One forward's load-balancing loss and the expert load it saw (over the data-parallel group)."""

    #: This rank's share of the loss (differentiable); the shares of all ranks sum to ``value``.
    local: torch.Tensor
    #: The loss of the whole forward over every data-parallel rank (no gradient).
    value: torch.Tensor
    #: (layers, n_experts) tokens routed to each expert over the data-parallel group (no gradient).
    counts: torch.Tensor


def load_balancing_loss(
    counts: Sequence[torch.Tensor],
    prob_sums: Sequence[torch.Tensor],
    tokens: int,
    group: dist.ProcessGroup | None = None,
) -> BalanceLoss:
    """The load-balancing loss of one forward from each MoE layer's routing statistics.

    ``counts[l]`` (n_experts,): top-k assignments per expert in layer ``l`` on this rank; ``prob_sums[l]``
    (n_experts,): router probabilities summed over this rank's tokens; ``tokens``: tokens routed per layer
    on this rank. With ``group`` the counts and tokens are summed over it (one all-reduce).
    """
    n_experts = counts[0].shape[0]
    layers = len(counts)
    stacked = torch.stack([c.detach().float() for c in counts])
    packed = torch.cat([stacked.reshape(-1), stacked.new_tensor([float(tokens)])])
    if group is not None:
        dist.all_reduce(packed, group=group)
    global_counts = packed[:-1].reshape(layers, n_experts)
    rows = packed[-1] * layers
    share = global_counts.sum(dim=0) / rows  # f_e over the whole forward
    local = n_experts * (share * torch.stack(list(prob_sums)).sum(dim=0) / rows).sum()
    value = local.detach().clone()
    if group is not None:
        dist.all_reduce(value, group=group)
    return BalanceLoss(local, value, global_counts)
