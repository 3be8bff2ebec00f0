"""Tiny transformers causal LMs written into a test's folder, and trainer configs that train them.

Each architecture is built by transformers itself from its config class with tiny sizes (2 layers,
hidden 32, vocabulary 512: the byte tokenizer's ids fit) and written with ``save_pretrained``: nothing is
downloaded. ``hf_config`` is the shipped Llama 3 debug config with its ``model`` group naming the folder
through ``hyper_parallel.models.hf.create_model_spec`` and the tiny run's overrides.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyper_parallel.config import load_config
from hyper_parallel.errors import ConfigWarning
from hyper_parallel.trainer.config import TrainerConfig
from tests.support.trainer import TINY_RUN, debug_config_path

__all__ = ["ARCHITECTURES", "hf_config", "write_tiny_model"]

_COMMON: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

#: ``model_type`` -> its fields beyond the common ones (four architectures of the issue).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 16},
    "qwen3": {"tie_word_embeddings": True},
    "gemma3_text": {"sliding_window": 8, "query_pre_attn_scalar": 8},
    "phi3": {"tie_word_embeddings": False},
}


def write_tiny_model(model_type: str, folder: Path, seed: int = 0, **fields: Any) -> Path:
    """``folder`` holding a tiny ``model_type`` causal LM as ``save_pretrained`` writes it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**_COMMON, **ARCHITECTURES[model_type], **fields})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.save_pretrained(folder)
    return folder


def hf_config(folder: Path, overrides: Mapping[str, str] | None = None, model: str = "") -> TrainerConfig:
    """The Llama 3 debug config training the transformers model in ``folder`` for the tiny run.

    ``model`` adds lines to the ``model`` group (YAML, indented by two spaces)."""
    text = debug_config_path("llama3").read_text()
    start, end = text.index("model:\n"), text.index("\ntokenizer:")
    group = f"model:\n  _target_: hyper_parallel.models.hf.create_model_spec\n  path: {folder}\n{model}"
    written = folder.parent / f"{folder.name}.rank{os.environ.get('RANK', '0')}.yaml"  # ranks write apart
    written.write_text(text[:start] + group + text[end:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(written, {**TINY_RUN, "parallelism.dp_shard": "1", **(overrides or {})})
