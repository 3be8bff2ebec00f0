"""Qwen 3.5 MoE in plain PyTorch: the Qwen 3.5 hybrid blocks with a mixture of experts (imported lazily).

Each block's feed-forward network is a :class:`MoE`: a linear router, ``n_experts`` SwiGLU experts held
as two stacked tensors and a sigmoid-gated shared SwiGLU expert. The router and the shared expert's gate
are one matmul, and so are each SwiGLU's gate and up projections. The routed tokens are grouped by expert
(one stable sort; the counts per expert stay on the device), each group goes through its expert in one
matmul per projection (``F.grouped_mm`` over all groups at once where torch has it, else one matmul
per non-empty group), and the outputs are added back to their tokens with one ``index_add`` onto the
shared expert's output. Routing weights and the shared expert's gate scale the SwiGLU hidden state rather
than the output (the same product; the hidden state is the narrower one in every released flavor), in one
autograd function with the activation (:func:`gated_swiglu`).

Parameter names under ``layers.<i>.feed_forward``: ``router.weight`` (n_experts, dim),
``experts.w13`` (n_experts, 2 hidden, dim) (each expert's gate rows, then its up rows), ``experts.w2``
(n_experts, dim, hidden), ``shared_expert.{w1, w2, w3}.weight`` and ``shared_expert_gate.weight`` (1, dim).

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

from hyper_parallel.models._layers import FeedForward
from hyper_parallel.models.qwen3_5._modules import HybridBlock, Qwen3_5Model, _local
from hyper_parallel.models.qwen3_5.args import Qwen3_5Args
from hyper_parallel.models.qwen3_5_moe.args import Qwen3_5MoeArgs

__all__ = [
    "GroupedExperts",
    "MoE",
    "Qwen3_5MoeModel",
    "RouterStats",
    "build_qwen3_5_moe",
    "gated_swiglu",
    "grouped_matmul",
]

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


#: ``(device type, dtype)`` where this torch's ``grouped_mm`` refused to run: its coverage moved between
#: releases of the supported range (CPU kernels, float32 on CUDA, GPU architectures), and where it does not
#: run the experts take one matmul per group instead of failing. Only refusals are kept: a call that fails
#: leaves nothing behind, so a recomputing activation checkpoint sees the same tensors as the forward.
_NO_GROUPED_MM: set[tuple[str, torch.dtype]] = set()

#: torch's grouped matmul: the public ``F.grouped_mm`` where this torch has it, else the ``torch._grouped_mm``
#: it wraps (same arguments), which releases of the supported range before the public name carry; held by
#: ``tests/parallel/test_torch_internals.py``. None: one matmul per group.
_GROUPED_MM: Any = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _can_group(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the grouped matmul (:data:`_GROUPED_MM`) may take these operands: torch has it, it did not
    refuse this device and dtype, rows are 16-byte aligned."""
    size = x.element_size()
    return (
        _GROUPED_MM is not None
        and (x.device.type, x.dtype) not in _NO_GROUPED_MM
        and x.shape[0] > 0
        and (x.shape[1] * size) % 16 == 0
        and (weight.shape[1] * size) % 16 == 0
    )


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x`` (tokens, in) grouped by expert times each group's ``weight[e]`` (e, out, in) transposed.

    ``counts`` (e,) int: consecutive rows of ``x`` per expert. One ``F.grouped_mm`` call where
    torch has it; otherwise one matmul per non-empty group. Under ``torch.compile`` outside bfloat16 (the
    only dtype torch 2.13 traces ``_grouped_mm`` in) the call runs eagerly, a graph break.
    """
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        eager: torch.Tensor = _untraced_grouped_matmul(x, weight, counts)
        return eager
    return _grouped_matmul(x, weight, counts)


def _grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """:func:`grouped_matmul` itself."""
    if _can_group(x, weight):
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        try:
            out: torch.Tensor = _GROUPED_MM(x, weight.transpose(-2, -1), offs=offsets)
            return out
        except (RuntimeError, NotImplementedError):
            if torch.compiler.is_compiling():
                raise
            _NO_GROUPED_MM.add((x.device.type, x.dtype))
    sizes = counts.tolist()
    parts = [part @ weight[e].t() for e, part in enumerate(torch.split(x, sizes, dim=0)) if sizes[e]]
    return torch.cat(parts) if parts else x.new_zeros(0, weight.shape[1])


#: :func:`_grouped_matmul` run eagerly from inside a compiled region.
_untraced_grouped_matmul = torch.compiler.disable(_grouped_matmul)  # type: ignore[no-untyped-call]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _GatedSwiGLU(torch.autograd.Function):
    """``silu(gate) * up``, row ``i`` times ``scale[i]``, of ``gate_up`` = [gate | up] (rows, 2 hidden).

    Keeps only its inputs for backward (``silu(gate)`` is recomputed there, as ``_layers.swiglu`` does) and
    writes the gradients of the gate and the up halves into one (rows, 2 hidden) buffer: what the fused
    matmul before it takes back, so autograd neither concatenates nor adds gradients.
    """

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(gate_up, scale)
        gate, up = gate_up.chunk(2, dim=-1)
        hidden = F.silu(gate).mul_(up)
        return hidden if scale is None else hidden.mul_(scale[:, None])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        gate_up, scale = ctx.saved_tensors
        gate, up = gate_up.chunk(2, dim=-1)
        half = gate.shape[-1]
        act = F.silu(gate)
        grad_gate_up = torch.empty_like(gate_up)
        grad_hidden = grad if scale is None else grad * scale[:, None]  # of silu(gate) * up
        torch.mul(grad_hidden, act, out=grad_gate_up[:, half:])
        grad_act = grad_hidden * up if scale is None else grad_hidden.mul_(up)
        torch.ops.aten.silu_backward.grad_input(grad_act, gate, grad_input=grad_gate_up[:, :half])
        grad_scale = None
        if scale is not None and ctx.needs_input_grad[1]:
            grad_scale = act.mul_(up).mul_(grad).sum(dim=-1)
        return grad_gate_up, grad_scale


def gated_swiglu(gate_up: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` = [gate | up] (rows, 2 hidden); with ``scale`` (rows,), row ``i``
    times ``scale[i]`` (a routing weight, a gate): the same as scaling the projection after it."""
    needs_grad = gate_up.requires_grad or (scale is not None and scale.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        hidden: torch.Tensor = _GatedSwiGLU.apply(gate_up, scale)  # type: ignore[no-untyped-call]
        return hidden
    gate, up = gate_up.chunk(2, dim=-1)
    hidden = F.silu(gate, inplace=True) * up  # nothing is saved: silu in place, the product contiguous
    return hidden if scale is None else hidden.mul_(scale[:, None])


class GroupedExperts(nn.Module):
    """``n`` SwiGLU experts as stacked weights: ``w2[e] (silu(gate) * up)``, [gate | up] = ``w13[e] x``.

    ``w13`` holds each expert's gate and up projections one above the other (Hugging Face's
    ``gate_up_proj`` layout), so both are one grouped matmul forward and backward.

    Under expert parallelism a rank holds a contiguous block of experts: the weights are then ``DTensor``s
    sharded along the expert dimension, the forward uses their local shards, and ``grad_scale`` scales
    their gradients (see ``hyper_parallel.parallel.expert_parallel``).
    """

    def __init__(self, n: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(n, 2 * hidden, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, hidden))
        self.grad_scale = 1.0

    def forward(
        self, x: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Outputs (tokens, dim) of ``x`` (tokens, dim) grouped by local expert, ``counts`` per expert;
        with ``weights`` (tokens,), row ``i`` of the output times ``weights[i]``."""
        w13, w2 = _local(self.w13), _local(self.w2)
        if self.grad_scale != 1.0:
            w13, w2 = (_ScaleGrad.apply(w, self.grad_scale) for w in (w13, w2))  # type: ignore[no-untyped-call]
        hidden = gated_swiglu(grouped_matmul(x, w13, counts), weights)
        return grouped_matmul(hidden, w2, counts)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        for weight in (self.w13, self.w2):
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
        return self._select(self.router(x))

    def _select(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`route` from the router's logits (in the activations' dtype)."""
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights.to(logits.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        tokens, n = flat.shape[0], self.n_experts
        # the router and the shared expert's gate in one matmul (FSDP2 gathers both with the block)
        scores = F.linear(flat, torch.cat((self.router.weight, self.shared_expert_gate.weight)))
        probs, weights, experts = self._select(scores[:, :n])
        chosen = experts.reshape(-1)  # assignment slots in (token, k) order
        # tokens per expert on the device (bincount would read its size back from an accelerator)
        counts = torch.zeros(n, dtype=torch.int64, device=flat.device).scatter_add_(
            0, chosen, torch.ones_like(chosen)
        )
        if torch.is_grad_enabled():  # a training forward; decoding and validation keep no bookkeeping
            self.stats = RouterStats(counts.float(), probs.sum(dim=0), tokens)
        order = torch.argsort(chosen, stable=True)  # the slots grouped by expert: the one permutation
        token_of = order // self.top_k
        routed = flat.index_select(0, token_of)
        slot_weights = weights.reshape(-1).index_select(0, order)
        if self.dispatcher is None:
            out = self.experts(routed, counts, slot_weights)
        else:
            out = self.dispatcher(self.experts, routed, counts) * slot_weights[:, None]
        shared = self.shared_expert
        # FeedForward's forward with its gate and up projections in one matmul and the sigmoid gate on its
        # hidden state (the block is FSDP2's unit, not the shared expert, so its weights are gathered here)
        gate_up = F.linear(flat, torch.cat((shared.w1.weight, shared.w3.weight)))
        hidden = gated_swiglu(gate_up, torch.sigmoid(scores[:, n]))
        # each routed output added to its token's shared-expert output: in place without gradients; with
        # them into a new tensor, since selective activation checkpointing keeps the matmul's output for
        # the backward and an in-place add would change it
        shared_out = shared.w2(hidden)
        # under bf16 autocast the shared expert's matmul gives bf16 while the routed outputs, scaled by the
        # fp32 routing weights, are fp32: index_add takes one dtype (found by python -m bench gpu --check)
        out = out.to(shared_out.dtype)
        summed = (
            shared_out.index_add(0, token_of, out)
            if torch.is_grad_enabled()
            else shared_out.index_add_(0, token_of, out)
        )
        result: torch.Tensor = summed.reshape(shape)
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
