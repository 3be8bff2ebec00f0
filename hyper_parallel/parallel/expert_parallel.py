"""Mixture-of-experts across ranks: expert parallelism, and the load-balancing loss over data-parallel ranks.

Expert parallelism (``parallelism.ep``) follows TorchTitan's rule: the ``ep`` ranks are taken from the
data-parallel shard dimension, which the mesh splits into ``dp_shard_mod_ep`` x ``ep``
(``ParallelDims.build_mesh``). Each MoE block's stacked expert weights become ``DTensor``s sharded along the
expert dimension over ``ep`` (``Shard(0)``: ``ep`` rank ``j`` holds experts ``j * n / ep`` to
``(j + 1) * n / ep - 1``), and FSDP2 shards them further over ``dp_shard_mod_ep``
(``data_parallel.apply_fsdp``); everything else stays under FSDP2 over the whole ``dp_shard``. In the
forward, every rank routes its own tokens, sends each routed copy to the ``ep`` rank holding its expert
and gets the outputs back (:class:`AllToAllDispatcher`: two all-to-alls of the tokens, with autograd,
after one of the counts). An expert's gradient then sums the tokens of its ``ep`` group; FSDP averages it
over ``dp_shard_mod_ep`` only, so the expert weights' gradients are scaled by ``1 / ep`` on the way
(``GroupedExperts.grad_scale``) to equal the average over all ``dp_shard`` ranks that the other
parameters get.

The Switch-Transformer load-balancing loss of transformers' Qwen 3.5 MoE is
``n_experts * sum_e f_e * P_e``: ``f_e`` the share of top-k assignments expert ``e`` got, ``P_e`` its mean
router probability, both over every token of every MoE layer of one forward. :func:`load_balancing_loss`
computes it for each rank's micro-batch, as transformers does for the batch it is given; the trainer
averages it like the language-model loss (over micro-batches and data-parallel ranks), so a layout that
keeps ``micro_batch_size`` trains on the same losses. The expert load it reports (tokens per expert) is
summed over the data-parallel group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["AllToAllDispatcher", "BalanceLoss", "apply_ep", "clip_grad_norm", "load_balancing_loss"]

#: Names of the stacked expert weights a MoE block's ``experts`` module holds.
EXPERT_WEIGHTS = ("w13", "w2")


class AllToAllDispatcher:
    """Runs a MoE block's routed tokens on the ``ep`` ranks holding their experts, with autograd.

    Called as ``dispatcher(experts, tokens, counts)`` with this rank's routed token copies grouped by
    global expert and ``counts`` (n_experts,) per expert; returns the experts' outputs in the same order.
    """

    def __init__(self, group: dist.ProcessGroup, n_experts: int) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.n_local = n_experts // self.size

    def __call__(self, experts: nn.Module, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, n_local = self.size, self.n_local
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)  # (source rank, local expert)
        per_source = received_counts.view(ep, n_local)
        # the split sizes are the one host read: all-to-all takes them as Python integers
        send, receive = torch.stack((counts.view(ep, n_local).sum(dim=1), per_source.sum(dim=1))).tolist()
        arrived = all_to_all_single_autograd(tokens, receive, send, self.group)
        # (source, expert) segments -> (expert, source): each local expert's tokens in one group, by one
        # stable sort of the arrived rows' local expert (computed on the device)
        local_expert = torch.arange(n_local, device=counts.device).repeat(ep)
        expert_of = local_expert.repeat_interleave(received_counts, output_size=sum(receive))
        order = torch.argsort(expert_of, stable=True)
        out = experts(arrived.index_select(0, order), per_source.sum(dim=0))
        restored = torch.empty_like(out).index_copy(0, order, out)
        result: torch.Tensor = all_to_all_single_autograd(restored, send, receive, self.group)
        return result


def apply_ep(moe_layers: Sequence[Any], ep_mesh: DeviceMesh) -> None:
    """Shard each MoE block's experts over ``ep_mesh`` along the expert dimension and dispatch to them.

    ``moe_layers`` are the blocks' mixture-of-experts modules (``experts`` with stacked weights
    ``w13``/``w2``, a ``dispatcher`` slot, ``n_experts``). Run before FSDP2 wraps anything.
    """
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = ep_mesh.size()
    for moe in moe_layers:
        experts: Any = moe.experts
        for name in EXPERT_WEIGHTS:
            param = getattr(experts, name)
            sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        experts.grad_scale = 1.0 / ep
        moe.dispatcher = AllToAllDispatcher(ep_mesh.get_group(), int(moe.n_experts))


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip the gradients to the global 2-norm ``max_norm``; returns that norm (a plain tensor).

    Under expert parallelism the experts' gradients live on another mesh (``dp_shard_mod_ep`` x ``ep``)
    than the rest (``dp_shard``), and DTensor cannot combine them in one norm: each mesh's norm is
    completed on its own, then they are combined.
    """
    from torch.distributed.tensor import DTensor

    by_mesh: dict[object, list[nn.Parameter]] = {}
    for param in parameters:
        if param.grad is not None:
            key = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(param)
    squares = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None], 2.0, foreach=True)
        full = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squares.append(full.float() ** 2)
    total = torch.stack(squares).sum().sqrt() if squares else torch.zeros(())
    for group in by_mesh.values():  # one mesh per call: DTensor multiplies within a mesh only
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total


class BalanceLoss(NamedTuple):
    """One forward's load-balancing loss and the expert load it saw."""

    #: The loss of this rank's micro-batch (differentiable).
    local: torch.Tensor
    #: Its mean over the data-parallel group (no gradient): what is logged.
    value: torch.Tensor
    #: (layers, n_experts) tokens routed to each expert, summed over the data-parallel group (no gradient).
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
    on this rank. With ``group`` the logged value and the counts are reduced over it (one all-reduce).
    """
    n_experts = counts[0].shape[0]
    layers = len(counts)
    stacked = torch.stack([c.detach().float() for c in counts])
    rows = float(tokens * layers)
    share = stacked.sum(dim=0) / rows  # f_e over the whole forward
    local = n_experts * (share * torch.stack(list(prob_sums)).sum(dim=0) / rows).sum()
    packed = torch.cat([stacked.reshape(-1), local.detach().reshape(1).float()])
    if group is not None:
        dist.all_reduce(packed, group=group)
        packed[-1] /= dist.get_world_size(group)
    return BalanceLoss(local, packed[-1], packed[:-1].reshape(layers, n_experts))
