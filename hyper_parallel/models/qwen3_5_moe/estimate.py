"""Torch-free costs of Qwen 3.5 MoE for the preflight estimate: total and active parameters, FLOPs.

Everything but the feed-forward network is Qwen 3.5's (``hyper_parallel.models.qwen3_5.estimate``, with
the shared expert in place of the dense SwiGLU). The routed experts are two stacked tensors per block
whose first dimension is the expert: ``ParamGroup.experts_per_token`` says how many of those rows one
token uses, so the active count is exact, and ``ep`` shards that dimension. FLOPs per token count the
active matmuls (``6 x`` the active weights of every matmul, the router included) plus attention and Gated
DeltaNet's terms. The routed-expert activations are an estimate (not checked against autograd): per token
and block the router's fp32 probabilities, the ``k`` gathered copies of the token, the ``w13`` outputs
and ``w2``'s input (the routing weights scale the hidden state, so ``w2``'s output is not kept).
"""

from collections.abc import Sequence

import attrs

from hyper_parallel.models.qwen3_5.estimate import Qwen3_5Costs
from hyper_parallel.models.qwen3_5.estimate import parameter_shapes as dense_parameter_shapes
from hyper_parallel.models.qwen3_5_moe.args import Qwen3_5MoeArgs
from hyper_parallel.preflight.flops import FlopCount
from hyper_parallel.preflight.model import ActivationCosts, ParamGroup, Workload

__all__ = ["Qwen3_5MoeCosts", "parameter_shapes"]


class Qwen3_5MoeCosts(Qwen3_5Costs):
    """Parameter (total and active), activation and FLOP counts of one Qwen 3.5 MoE language model."""

    args: Qwen3_5MoeArgs

    def __init__(self, args: Qwen3_5MoeArgs) -> None:
        super().__init__(args)
        # Qwen 3.5's formulas with the shared expert as the dense feed-forward network.
        self._dense = Qwen3_5Costs(attrs.evolve(args, ffn_hidden_dim=args.shared_expert_hidden_dim))

    def parameters(self) -> Sequence[ParamGroup]:
        a = self.args
        n, e, k, h = a.n_layers, a.n_experts, a.n_experts_per_token, a.ffn_hidden_dim
        return (
            *self._dense.parameters(),
            ParamGroup("moe", (e, a.dim), n),  # router
            ParamGroup("mlp", (1, a.dim), n),  # shared expert gate
            ParamGroup("moe", (e, 2 * h, a.dim), n, experts_per_token=k),  # w13 (gate and up)
            ParamGroup("moe", (e, a.dim, h), n, experts_per_token=k),  # w2
        )

    def activations(self, work: Workload) -> ActivationCosts:
        a, p = self.args, work.param_bytes
        k, h, d = a.n_experts_per_token, a.ffn_hidden_dim, a.dim
        tokens = work.batch * work.seq
        dense = self._dense.activations(work)
        kept = (4 * a.n_experts + 8 * k + k * p * (d + 3 * h)) * tokens
        op = (p * a.n_experts + k * p * (2 * h + d)) * tokens
        blocks = tuple(b._replace(kept=b.kept + kept, op=b.op + op) for b in dense.blocks)
        return dense._replace(blocks=blocks, note="routed-expert activations estimated")

    def flop_count(self, seq: int) -> FlopCount:
        a = self.args
        routed = 3 * a.dim * a.ffn_hidden_dim * a.n_experts_per_token + a.dim * (a.n_experts + 1)
        dense = self._dense.flop_count(seq)
        return dense._replace(weights=dense.weights + 6 * a.n_layers * routed)

    def tp_degrees(self) -> Sequence[int]:
        return [1]  # tensor parallelism of the experts is not implemented (``parallel_issues``)

    def expert_layers(self) -> int:
        """Blocks whose tokens are dispatched to experts (all of them)."""
        return self.args.n_layers


def parameter_shapes(a: Qwen3_5MoeArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape in the mixture-of-experts model (Qwen 3.5's, each block's
    feed-forward network being the router, the stacked experts and the gated shared expert)."""
    e, h, s = a.n_experts, a.ffn_hidden_dim, a.shared_expert_hidden_dim
    moe = {
        "feed_forward.router.weight": (e, a.dim),
        "feed_forward.experts.w13": (e, 2 * h, a.dim),
        "feed_forward.experts.w2": (e, a.dim, h),
        "feed_forward.shared_expert.w1.weight": (s, a.dim),
        "feed_forward.shared_expert.w2.weight": (a.dim, s),
        "feed_forward.shared_expert.w3.weight": (s, a.dim),
        "feed_forward.shared_expert_gate.weight": (1, a.dim),
    }
    return dense_parameter_shapes(a, moe)
