"""The Qwen 3.5 reference of the model tests: a tiny hybrid configuration, the transformers model it matches.

Shared by the model, speed-parity and trainer tests; needs torch and transformers (importers skip without).
"""

from typing import Any

import torch

from hyper_parallel.models import qwen3_5
from hyper_parallel.models.qwen3_5 import Qwen3_5Args

__all__ = ["TINY", "build", "hf_model", "tokens"]

TINY = Qwen3_5Args(
    dim=64,
    n_layers=4,
    ffn_hidden_dim=96,
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
)


def hf_model(args: Qwen3_5Args) -> Any:
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.dim,
        intermediate_size=args.ffn_hidden_dim,
        num_hidden_layers=args.n_layers,
        num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_kv_heads,
        head_dim=args.head_dim,
        linear_num_key_heads=args.linear_num_key_heads,
        linear_num_value_heads=args.linear_num_value_heads,
        linear_key_head_dim=args.linear_key_head_dim,
        linear_value_head_dim=args.linear_value_head_dim,
        linear_conv_kernel_dim=args.linear_conv_kernel_dim,
        rms_norm_eps=args.norm_eps,
        max_position_embeddings=args.max_seq_len,
        layer_types=list(args.layer_types()),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": args.rope_theta,
            "partial_rotary_factor": args.partial_rotary_factor,
        },
        tie_word_embeddings=args.tie_word_embeddings,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # norms are zero-initialised (1 + w): randomise them so a mix-up would show
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "dt_bias")):
                param.uniform_(-0.5, 0.5)
    return model


def tokens(args: Qwen3_5Args, seq: int = 40) -> Any:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, args.vocab_size, (2, seq), generator=generator)


def build(args: Qwen3_5Args, device: str = "cpu") -> Any:
    return qwen3_5.create_model_spec("debugmodel").build_model_fn(args, device=device)
