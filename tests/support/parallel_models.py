"""The tiny models and layouts of the two-process ``parallelize`` tests (sharded runs against unsharded ones).

Needs torch (importers skip without it). ``SPECS`` builds a fresh ``ModelSpec`` per call, so each process
and each test starts from its own.
"""

from typing import Any

import torch

from hyper_parallel.models import llama3, qwen3_5
from hyper_parallel.trainer.config import ParallelismConfig

__all__ = ["IMAGE_TOKEN", "LAYOUTS", "SPECS", "WORLD", "full", "image_batch"]

WORLD = 2
SPECS = {
    "llama3": lambda: llama3.create_model_spec(
        "debugmodel", overrides={"dim": 64, "n_layers": 2, "vocab_size": 128, "multiple_of": 32}
    ),
    "qwen3_5": lambda: qwen3_5.create_model_spec(
        "debugmodel",
        overrides={
            "dim": 64,
            "n_layers": 2,
            "full_attention_interval": 2,
            "ffn_hidden_dim": 96,
            "vocab_size": 128,
            "head_dim": 16,
            # 4 key and 8 value heads (debugmodel): tp=2 gives each rank 2 key heads and the 4 value
            # heads using them; key and value channel counts differ (64, 96) so a mixed split shows.
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 12,
        },
    ),
    "qwen3_5_vl": lambda: qwen3_5.create_vl_model_spec(
        "debugmodel",
        overrides={
            "text.dim": 64,
            "text.n_layers": 2,
            "text.full_attention_interval": 2,
            "text.ffn_hidden_dim": 96,
            "text.vocab_size": 128,
            "text.head_dim": 16,
            "text.linear_key_head_dim": 16,
            "text.linear_value_head_dim": 8,
            "vision.depth": 1,
            "vision.hidden_size": 32,
            "vision.n_heads": 2,
            "vision.intermediate_size": 64,
            "vision.patch_size": 4,
        },
    ),
}
IMAGE_TOKEN = 5
LAYOUTS = {
    "dp_shard2": ParallelismConfig(dp_shard=2),
    "tp2": ParallelismConfig(dp_shard=1, tp=2),
    "tp2_no_sp": ParallelismConfig(dp_shard=1, tp=2, sequence_parallel=False),
}


def full(tensor: Any) -> Any:
    """The whole tensor: gathered from its shards if it is a DTensor, as it is otherwise."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def image_batch(vocab: int, patch: int) -> tuple[Any, Any, Any]:
    """Two samples of 12 tokens, each with one image of 2x2 merged tokens (4x4 patches)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(10, vocab, (2, 12), generator=generator)
    ids[:, 3:7] = IMAGE_TOKEN
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])
    return ids, torch.randn(32, patch, generator=generator), grid
