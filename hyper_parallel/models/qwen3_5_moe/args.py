"""Architecture arguments of Qwen 3.5 MoE and its flavor table.

Qwen 3.5 MoE keeps the hybrid token mixers of Qwen 3.5 (Gated DeltaNet and gated full attention, 3:1)
and replaces every block's dense feed-forward network by a mixture of experts: a linear router scores
``n_experts`` SwiGLU experts per token, the ``n_experts_per_token`` best (softmax, then top-k,
renormalised when ``norm_topk_prob``) are run and summed by their weights, and one shared SwiGLU expert,
scaled by a sigmoid gate of the token, is added to every token. Training adds the Switch-Transformer
load-balancing loss times ``router_aux_loss_coef`` to the language-model loss, as transformers does.

Provenance: ``35B-A3B`` is transformers 5.24's ``Qwen3_5MoeTextConfig`` defaults (its docstring names the
Qwen/Qwen3.5-35B-A3B checkpoint; ``tests/models/test_qwen3_5_moe.py`` compares them). ``122B-A10B`` and
``397B-A17B`` are the text configs of the released Qwen/Qwen3.5-122B-A10B and Qwen/Qwen3.5-397B-A17B
``config.json`` files as independent public projects quote them field by field (the files themselves
could not be read here): MLX's MoE benchmarks (hidden, expert hidden, experts, top-k), a Megatron FSDP
experiment table (hidden, heads and KV heads, Gated DeltaNet key/value heads, expert hidden, the
3 DeltaNet : 1 attention pattern), slime's 397B launch script (layers, heads, head_dim 256, experts,
top-k, shared expert 1024, vocabulary, rope 1e7 over a quarter of each head, untied output), an Ascend
launch script for the 122B (every field above plus the DeltaNet head widths of 128). They agree with
each other, and the counts they give (122.1 B total / 9.8 B active, 396.3 B / 17.3 B, text only)
match the published sizes; ``tests/preflight/test_params.py`` pins them.
"""

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import attrs

from hyper_parallel._checks import quote, said
from hyper_parallel.config_base import config_class
from hyper_parallel.models.qwen3_5.args import Qwen3_5Args

if TYPE_CHECKING:
    from hyper_parallel.models.qwen3_5_moe.estimate import Qwen3_5MoeCosts

__all__ = ["QWEN3_5_MOE_FLAVORS", "Qwen3_5MoeArgs"]

_pos_int = attrs.validators.gt(0)


@config_class
class Qwen3_5MoeArgs(Qwen3_5Args):
    """Dimensions of the hybrid Qwen 3.5 language model with mixture-of-experts feed-forward networks."""

    ffn_hidden_dim: int = attrs.field(
        validator=_pos_int,
        metadata={"help": "Hidden size of each routed expert's SwiGLU (Hugging Face moe_intermediate_size)."},
    )
    n_experts: int = attrs.field(
        validator=_pos_int, metadata={"help": "Routed experts in every block's mixture of experts."}
    )
    n_experts_per_token: int = attrs.field(
        validator=_pos_int, metadata={"help": "Experts each token is routed to (top-k of the router)."}
    )
    shared_expert_hidden_dim: int = attrs.field(
        validator=_pos_int,
        metadata={"help": "Hidden size of the sigmoid-gated shared SwiGLU expert every token goes through."},
    )
    norm_topk_prob: bool = attrs.field(
        default=True,
        metadata={"help": "Renormalise the top-k routing probabilities of a token to sum to one."},
    )
    router_aux_loss_coef: float = attrs.field(
        default=0.001,
        validator=attrs.validators.ge(0.0),
        metadata={"help": "Weight of the load-balancing loss added to the training loss (0 = logged only)."},
    )

    def expert_count(self) -> int:
        """Routed experts per block (what ``parallelism.ep`` shards)."""
        return self.n_experts

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """The Qwen 3.5 checks, plus: a token cannot be routed to more experts than there are."""
        yield from super().cross_check()
        if self.n_experts_per_token > self.n_experts:
            yield (
                "n_experts_per_token",
                said("must be <= ", quote("n_experts", self.n_experts), f", got {self.n_experts_per_token}"),
            )

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Tensor parallelism of the experts is not implemented (experts scale with ``ep``); pipeline
        parallelism as Qwen 3.5; ``ep`` must divide the experts."""
        tp = degrees.get("tp", 1)
        if tp > 1:
            yield (
                "parallelism.tp",
                "tensor parallelism is not supported yet by Qwen 3.5 MoE (its experts are not split by "
                f"tp); shard the experts with parallelism.ep and the rest with dp_shard, got {tp}",
            )
        yield from super().parallel_issues({**degrees, "tp": 1})
        ep = degrees.get("ep", 1)
        if self.n_experts % ep:
            yield (
                "parallelism.ep",
                f"must divide the model's {self.n_experts} experts (model.args.n_experts), got {ep}",
            )

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape, experts included (torch-free, ``estimate.parameter_shapes``)."""
        from hyper_parallel.models.qwen3_5_moe.estimate import parameter_shapes

        return parameter_shapes(self)

    def preflight(self) -> "Qwen3_5MoeCosts":  # type: ignore[override]
        """Parameter (total and active), activation and FLOP counts for the preflight (torch-free)."""
        from hyper_parallel.models.qwen3_5_moe.estimate import Qwen3_5MoeCosts

        return Qwen3_5MoeCosts(self)


#: Flavor name -> arguments. ``35B-A3B`` is transformers' default config; the others the released
#: checkpoints' text configs (see the module docstring for the sources).
QWEN3_5_MOE_FLAVORS: dict[str, Qwen3_5MoeArgs] = {
    "debugmodel": Qwen3_5MoeArgs(
        dim=256,
        n_layers=4,
        ffn_hidden_dim=128,
        n_experts=8,
        n_experts_per_token=2,
        shared_expert_hidden_dim=256,
        vocab_size=2048,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
        max_seq_len=4096,
        router_aux_loss_coef=0.01,
    ),
    # transformers 5.24 Qwen3_5MoeTextConfig() (checkpoint Qwen/Qwen3.5-35B-A3B).
    "35B-A3B": Qwen3_5MoeArgs(
        dim=2048,
        n_layers=40,
        ffn_hidden_dim=512,
        n_experts=256,
        n_experts_per_token=8,
        shared_expert_hidden_dim=512,
        n_heads=16,
        n_kv_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        max_seq_len=32_768,
    ),
    # Qwen/Qwen3.5-122B-A10B: 48 layers (12 full attention), 256 experts of 1024, 8 active, 32 q / 2 kv
    # heads of 256, DeltaNet 16 key / 64 value heads of 128, context 262,144; the rest the defaults.
    "122B-A10B": Qwen3_5MoeArgs(
        dim=3072,
        n_layers=48,
        ffn_hidden_dim=1024,
        n_experts=256,
        n_experts_per_token=8,
        shared_expert_hidden_dim=1024,
        n_heads=32,
        n_kv_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=64,
    ),
    # Qwen/Qwen3.5-397B-A17B: 60 layers (15 full attention), 512 experts of 1024, 10 active, 32 q / 2 kv
    # heads of 256, DeltaNet 16 key / 64 value heads of 128, context 262,144; the rest the defaults.
    "397B-A17B": Qwen3_5MoeArgs(
        dim=4096,
        n_layers=60,
        ffn_hidden_dim=1024,
        n_experts=512,
        n_experts_per_token=10,
        shared_expert_hidden_dim=1024,
        n_heads=32,
        n_kv_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=64,
    ),
}
