"""Qwen 3.5 MoE in plain PyTorch: the Qwen 3.5 hybrid blocks with a mixture of experts (imported lazily).

Each block's feed-forward network is a :class:`MoE`: a linear router, ``n_experts`` SwiGLU experts held
as three stacked tensors and a sigmoid-gated shared SwiGLU expert. The routed tokens are grouped by expert
(one stable sort), each group goes through its expert in one matmul per projection (``torch._grouped_mm``
over all groups at once where torch has it, else one matmul per non-empty group), and the outputs are
weighted and summed back per token without a scatter-add.

Parameter names under ``layers.<i>.feed_forward``: ``router.weight`` (n_experts, dim),
``experts.{w1, w3}`` (n_experts, hidden, dim) (gate and up), ``experts.w2`` (n_experts, dim, hidden),
``shared_expert.{w1, w2, w3}.weight`` and ``shared_expert_gate.weight`` (1, dim).

Every forward with gradients enabled leaves its routing statistics on the block (:class:`RouterStats`): the
trainer reads them after the forward to form the load-balancing loss and the expert-load figures
(``hyper_parallel.parallel.expert_parallel.load_balancing_loss``). A forward under ``torch.no_grad`` or
``torch.inference_mode`` (validation, decoding: ``hyper_parallel.models._inference``) records none, so
routing one decoded token at a time adds no work and leaves the training statistics untouched. Routing
needs no cache: each token picks its experts from its own hidden state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from hyper_parallel.models._layers import FeedForward, swiglu
from hyper_parallel.models.qwen3_5._modules import HybridBlock, Qwen3_5Model, _local
from hyper_parallel.models.qwen3_5.args import Qwen3_5Args
from hyper_parallel.models.qwen3_5_moe.args import Qwen3_5MoeArgs

__all__ = ["GroupedExperts", "MoE", "Qwen3_5MoeModel", "RouterStats", "build_qwen3_5_moe", "grouped_matmul"]

#: A dispatcher replaces the local expert call under expert parallelism: (experts, tokens grouped by
#: expert, tokens per expert) -> outputs in the same order. ``None`` runs every expert here.
Dispatcher = Callable[["GroupedExperts", torch.Tensor, torch.Tensor], torch.Tensor]


class RouterStats(NamedTuple):
    """What one MoE forward routed: per-expert assignment counts and probability sums over its tokens."""

    #: (n_experts,) float32: top-k assignments per expert (no gradient).
    counts: torch.Tensor
    #: (n_experts,) float32: router softmax probabilities summed over the tokens (differentiable).
    prob_sums: torch.Tensor
    #: Tokens routed.
    tokens: int


def _can_group(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes these operands: torch has it, and rows are 16-byte aligned."""
    size = x.element_size()
    return (
        hasattr(torch, "_grouped_mm")
        and x.shape[0] > 0
        and (x.shape[1] * size) % 16 == 0
        and (weight.shape[1] * size) % 16 == 0
    )


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x`` (tokens, in) grouped by expert times each group's ``weight[e]`` (e, out, in) transposed.

    ``counts`` (e,) int: consecutive rows of ``x`` per expert. One ``torch._grouped_mm`` call where
    torch has it; otherwise one matmul per non-empty group.
    """
    if _can_group(x, weight):
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        out: torch.Tensor = torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
        return out
    sizes = counts.tolist()
    parts = [part @ weight[e].t() for e, part in enumerate(torch.split(x, sizes, dim=0)) if sizes[e]]
    return torch.cat(parts) if parts else x.new_zeros(0, weight.shape[1])


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class GroupedExperts(nn.Module):
    """``n`` SwiGLU experts as stacked weights: ``w2[e] (silu(w1[e] x) * w3[e] x)``.

    Under expert parallelism a rank holds a contiguous block of experts: the weights are then ``DTensor``s
    sharded along the expert dimension, the forward uses their local shards, and ``grad_scale`` scales
    their gradients (see ``hyper_parallel.parallel.expert_parallel``).
    """

    def __init__(self, n: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n, hidden, dim))
        self.grad_scale = 1.0

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Outputs (tokens, dim) of ``x`` (tokens, dim) grouped by local expert, ``counts`` per expert."""
        w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
        if self.grad_scale != 1.0:
            w1, w2, w3 = (_ScaleGrad.apply(w, self.grad_scale) for w in (w1, w2, w3))  # type: ignore[no-untyped-call]
        hidden = swiglu(grouped_matmul(x, w1, counts), grouped_matmul(x, w3, counts))
        return grouped_matmul(hidden, w2, counts)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        for weight in (self.w1, self.w2, self.w3):
            nn.init.trunc_normal_(weight, std=std)


class MoE(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert (Qwen 3.5 MoE's feed-forward network)."""

    def __init__(self, args: Qwen3_5MoeArgs) -> None:
        super().__init__()
        self.n_experts = args.n_experts
        self.top_k = args.n_experts_per_token
        self.norm_topk_prob = args.norm_topk_prob
        self.router = nn.Linear(args.dim, args.n_experts, bias=False)
        self.experts = GroupedExperts(args.n_experts, args.dim, args.ffn_hidden_dim)
        self.shared_expert = FeedForward(args.dim, args.shared_expert_hidden_dim)
        self.shared_expert_gate = nn.Linear(args.dim, 1, bias=False)
        #: Set by expert parallelism (``hyper_parallel.parallel.expert_parallel``); None: all experts here.
        self.dispatcher: Dispatcher | None = None
        #: Routing of the last forward with gradients (read by the trainer for the load-balancing loss).
        self.stats: RouterStats | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(probabilities (tokens, n_experts) fp32, top-k weights in ``x``'s dtype, top-k expert ids)."""
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        tokens = flat.shape[0]
        probs, weights, experts = self.route(flat)
        chosen = experts.reshape(-1)
        counts = torch.bincount(chosen, minlength=self.n_experts)
        if torch.is_grad_enabled():  # a training forward; decoding and validation keep no bookkeeping
            self.stats = RouterStats(counts.detach().float(), probs.sum(dim=0), tokens)
        order = torch.argsort(chosen, stable=True)  # assignment slots grouped by expert
        routed = flat[order // self.top_k]
        if self.dispatcher is None:
            out = self.experts(routed, counts)
        else:
            out = self.dispatcher(self.experts, routed, counts)
        out = out * weights.reshape(-1, 1)[order]
        # back to (token, slot) order, then the k slots of each token summed (no scatter-add)
        unsorted = torch.empty_like(out)
        unsorted[order] = out
        combined = unsorted.view(tokens, self.top_k, -1).sum(dim=1)
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        result: torch.Tensor = (combined + shared).reshape(shape)
        return result


class Qwen3_5MoeModel(Qwen3_5Model):
    """The Qwen 3.5 hybrid language model with a mixture of experts in every block."""

    args: Qwen3_5MoeArgs

    def make_block(self, args: Qwen3_5Args, layer_type: str) -> HybridBlock:  # type: ignore[override]
        assert isinstance(args, Qwen3_5MoeArgs)
        return HybridBlock(args, layer_type, feed_forward=MoE(args))

    def moe_layers(self) -> list[MoE]:
        """The mixture-of-experts module of every block, in order."""
        return [module for module in self.modules() if isinstance(module, MoE)]

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Qwen 3.5's initialisation, plus truncated-normal experts (the router as every linear)."""
        super().init_weights(std)
        for moe in self.moe_layers():
            moe.experts.reset_parameters(std)


def build_qwen3_5_moe(args: Qwen3_5MoeArgs, device: str) -> Qwen3_5MoeModel:
    """The module on ``device``; initialised unless ``device`` is ``"meta"``."""
    with torch.device(device):
        model = Qwen3_5MoeModel(args)
    if torch.device(device).type != "meta":
        model.init_weights()
    return model
