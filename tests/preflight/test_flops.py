"""Point 4 of the preflight: model FLOPs per token within 5% of ``FlopCounterMode`` on the debug models.

Forward plus backward of the model and the loss, without checkpointing (recomputation is not model
FLOPs). FlopCounterMode counts matmuls, attention (the whole square, causal or not) and convolutions, as
the formula does; elementwise ops and the embedding lookup count as free in both. Two gaps of torch
2.13's counter are filled through its ``custom_mapping``, with its own attention formulas: it has no
entry for the CPU flash-attention ops, and its ``convolution_backward`` ignores ``groups`` (a depthwise
convolution's backward is counted channels-times too high), so grouped backward is counted as two
forward convolutions (input and weight gradients).
"""

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.flop_counter import (  # noqa: E402
    FlopCounterMode,
    conv_flop_count,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from hyper_parallel.components.loss._runtime import CausalLMLossFn  # noqa: E402
from hyper_parallel.models import llama3, qwen3_5  # noqa: E402

SPECS = {
    "llama3": lambda: llama3.create_model_spec("debugmodel"),
    "llama3_mha": lambda: llama3.create_model_spec("debugmodel", overrides={"n_kv_heads": None}),
    "qwen3_5": lambda: qwen3_5.create_model_spec("debugmodel"),
    "qwen3_5_untied": lambda: qwen3_5.create_model_spec(
        "debugmodel", overrides={"tie_word_embeddings": False, "full_attention_interval": 2}
    ),
}


aten = torch.ops.aten


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))


def _cpu_sdpa_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return int(sdpa_backward_flop_count(grad_out, query, key, value))


def _conv_backward(
    grad_out: Any, x: Any, weight: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    output_mask = args[-1]
    return int(sum(output_mask[:2]) * conv_flop_count(x, weight, grad_out))


CUSTOM = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    aten.convolution_backward: _conv_backward,
}


def _counted(model: Any, vocab: int, batch: int, seq: int) -> int:
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False, custom_mapping=CUSTOM) as counter:
        CausalLMLossFn()(model(tokens), tokens).backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("name", "seq"),
    [(name, seq) for name in SPECS for seq in ((256, 1024) if name.startswith("llama") else (32, 128))],
)
def test_flops_per_token_match_flop_counter_mode(name: str, seq: int) -> None:
    spec = SPECS[name]()
    torch.manual_seed(0)
    model = spec.build_model_fn(spec.args, device="cpu")
    batch = 2
    counted = _counted(model, spec.args.vocab_size, batch, seq)
    predicted = spec.args.preflight().flops_per_token(seq) * batch * seq
    assert predicted == pytest.approx(counted, rel=0.05)


def test_attention_flops_grow_with_the_sequence() -> None:
    costs = llama3.create_model_spec("8B").args.preflight()
    # per token and layer: 2 x 2 x seq x 4096 forward (QK^T and AV), 5 x 2 x seq x 4096 backward
    assert costs.flops_per_token(8192) - costs.flops_per_token(4096) == 32 * 14 * 4096 * 4096
