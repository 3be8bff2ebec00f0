"""The Qwen 3.5 MoE reference of the tests: a tiny configuration and the transformers model it must match.

Needs torch and transformers (importers skip without).
"""

from typing import Any

import torch

from hyper_parallel.models.qwen3_5_moe import Qwen3_5MoeArgs
from hyper_parallel.models.qwen3_5_moe._runtime import Qwen3_5MoeStateDictAdapter

__all__ = ["TINY_MOE", "hf_moe_model"]

TINY_MOE = Qwen3_5MoeArgs(
    dim=64,
    n_layers=4,
    ffn_hidden_dim=32,
    n_experts=8,
    n_experts_per_token=3,
    shared_expert_hidden_dim=48,
    vocab_size=128,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    full_attention_interval=2,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    tie_word_embeddings=False,
    max_seq_len=128,
    router_aux_loss_coef=0.05,
)


def hf_moe_model(args: Qwen3_5MoeArgs, experts: str = "eager") -> Any:
    """transformers' ``Qwen3_5MoeForCausalLM`` from the config our adapter exports, randomised norms."""
    from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    config = Qwen3_5MoeTextConfig(**Qwen3_5MoeStateDictAdapter(args).hf_config())
    config._attn_implementation = "eager"
    config._experts_implementation = experts
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(config).eval()
    with torch.no_grad():  # norms are zero-initialised (1 + w): randomise them so a mix-up would show
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "dt_bias")):
                param.uniform_(-0.5, 0.5)
            if name.endswith("mlp.gate.weight"):  # a sharper router: top-k choices far from ties
                param.normal_(0.0, 0.5)
    return model
