"""The Llama 3 reference of the model tests: a tiny configuration, the transformers model it matches, tokens.

Shared by the model, speed-parity and trainer tests; needs torch and transformers (importers skip without).
"""

from typing import Any

import torch
import transformers

from hyper_parallel.models.llama3 import Llama3Args, RopeScaling

__all__ = ["TINY", "hf_model", "tokens"]

TINY = Llama3Args(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=128,
    multiple_of=32,
    rope_theta=10_000.0,
    # A short original context so that all three RoPE frequency bands occur at head_dim 16.
    rope_scaling=RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=32
    ),
    max_seq_len=64,
)


def hf_model(args: Llama3Args) -> Any:
    scaling = args.rope_scaling
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
    if scaling is not None:
        rope = {
            "rope_type": "llama3",
            "rope_theta": args.rope_theta,
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    config = transformers.LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.ffn_hidden_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_kv_heads,
        rms_norm_eps=args.norm_eps,
        max_position_embeddings=args.max_seq_len,
        rope_parameters=rope,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norm weights too, so that a swapped norm would show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def tokens(args: Llama3Args, seq: int = 48) -> Any:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, args.vocab_size, (2, seq), generator=generator)
