"""The model shapes the device benchmarks measure, as overrides of each family's ``debugmodel`` flavor.

``python -m bench gpu`` times them (about 1B parameters on a GPU, tiny ones in its CPU smoke mode) and
``python -m bench gpu --check`` trains the shipped GPU configs in the same tiny shapes on the CPU: one table,
read by both.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FULL_MODELS", "TINY_MODELS", "qwen3_5_0_8b_overrides"]

#: Model families -> (row name, overrides of the ``debugmodel`` flavor) at about 1B parameters.
FULL_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": (
        "llama3 1B",
        {
            "dim": 2048,
            "n_layers": 16,
            "n_heads": 32,
            "n_kv_heads": 8,
            "vocab_size": 128_256,
            "multiple_of": 256,
            "ffn_dim_multiplier": 1.5,
            "rope_theta": 500_000.0,
            "max_seq_len": 8192,
        },
    ),
    "qwen3_5": ("qwen3.5 0.8B", {}),  # filled from the 0.8B flavor (see qwen3_5_0_8b_overrides)
}
#: Tiny models of the CPU smoke mode.
TINY_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": (
        "llama3 tiny",
        {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32, "vocab_size": 512},
    ),
    "qwen3_5": (
        "qwen3.5 tiny",
        {
            "dim": 64,
            "n_layers": 2,
            "full_attention_interval": 2,
            "ffn_hidden_dim": 128,
            "n_heads": 4,
            "n_kv_heads": 2,
            "head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "vocab_size": 512,
        },
    ),
}


def qwen3_5_0_8b_overrides() -> dict[str, Any]:
    """The 0.8B flavor as overrides of debugmodel (the form ``bench.models._pair`` builds from)."""
    import attrs

    from hyper_parallel.models.qwen3_5.args import QWEN3_5_FLAVORS

    debug, target = QWEN3_5_FLAVORS["debugmodel"], QWEN3_5_FLAVORS["0.8B"]
    return {
        field.name: getattr(target, field.name)
        for field in attrs.fields(type(target))
        if getattr(target, field.name) != getattr(debug, field.name)
    }
