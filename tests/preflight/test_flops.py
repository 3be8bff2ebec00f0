"""Point 4 of the preflight: model FLOPs per token within 5% of ``FlopCounterMode`` on the debug models.

Forward plus backward of the model and the loss, without checkpointing (recomputation is not model
FLOPs). The formula is TorchTitan's convention (``hyper_parallel/preflight/flops.py``: ``6N + 12LHQT``,
attention counted whole, no recomputation). FlopCounterMode counts matmuls, attention (the whole square,
causal or not) and convolutions, as the formula does; elementwise ops and the embedding lookup count as
free in both. The one known difference is accounted for in the counter, not in the tolerance: torch's
attention backward formula counts five products, the first of which recomputes the scores ``QK^T`` (what
a flash kernel does, 2 x seq x heads x head_dim per token and layer: 1/7 of the attention FLOPs, which
on the 1,024-token debug Llama is over 5% of the whole); the convention counts the four gradient products
only, so the mapping below for the CPU attention backward subtracts the recomputed one. Two gaps of
torch 2.13's counter are filled through its ``custom_mapping``, with its own attention formulas: it has
no entry for the CPU flash-attention ops, and its ``convolution_backward`` ignores ``groups`` (a
depthwise convolution's backward is counted channels-times too high), so grouped backward is counted as
two forward convolutions (input and weight gradients).

Every model family is covered: Llama 3, Qwen 3.5 dense, Qwen 3.5 MoE (the counter sees the routed
experts' ``_grouped_mm`` at the tokens each expert actually got, which the formula prices at
``n_experts_per_token`` experts per token: the same total, however the router splits them) and the VL
model on a text batch (the preflight counts the language model; the vision tower's FLOPs depend on the
images of a batch, which the config does not say, and are left out on both sides).

What the counter does not see, and what is added by hand: ``torch._grouped_mm`` (the routed experts; no
entry in torch 2.13's counter) is counted by the mapping below, ``2 x rows x k x n``. The gated delta
rule runs here as our chunked PyTorch kernel, whose matrix products the counter sees and the formula
follows; its triangular solves (``C^2 (d_k + d_v)`` per chunk and head) are counted on neither side,
under 1% of the debug models' FLOPs. On a GPU with flash-linear-attention the rule is one Triton kernel
the counter cannot see at all; the formula's figure for it is the same chunked algorithm's.
"""

import math
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
from hyper_parallel.models import llama3, qwen3_5, qwen3_5_moe  # noqa: E402

SPECS = {
    "llama3": lambda: llama3.create_model_spec("debugmodel"),
    "llama3_mha": lambda: llama3.create_model_spec("debugmodel", overrides={"n_kv_heads": None}),
    "qwen3_5": lambda: qwen3_5.create_model_spec("debugmodel"),
    "qwen3_5_untied": lambda: qwen3_5.create_model_spec(
        "debugmodel", overrides={"tie_word_embeddings": False, "full_attention_interval": 2}
    ),
    "qwen3_5_moe": lambda: qwen3_5_moe.create_model_spec("debugmodel"),
    "qwen3_5_vl": lambda: qwen3_5.create_vl_model_spec("debugmodel"),
}


aten = torch.ops.aten


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(sdpa_flop_count(query, key, value))


def _cpu_sdpa_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """Torch's count of the four gradient products, without its recomputed scores (``QK^T``, which the
    convention leaves out as recomputation)."""
    batch, heads, seq_q, head_dim = query
    recomputed = 2 * batch * heads * seq_q * head_dim * key[2]
    return int(sdpa_backward_flop_count(grad_out, query, key, value)) - recomputed


def _conv_backward(
    grad_out: Any, x: Any, weight: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    output_mask = args[-1]
    return int(sum(output_mask[:2]) * conv_flop_count(x, weight, grad_out))


def _grouped_mm(x: Any, weight: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``torch._grouped_mm``, which torch 2.13's counter has no entry for (added here by hand): each row of
    ``x`` meets one group's (k, n) matrix, whether ``weight`` holds the groups (forward, input gradient)
    or the offsets split the shared dimension (weight gradient): ``2 x x.numel() x n``."""
    return 2 * math.prod(x) * weight[-1]  # the counter passes shapes


CUSTOM = {
    aten._grouped_mm: _grouped_mm,
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward,
    aten.convolution_backward: _conv_backward,
}


def _counted(model: Any, vocab: int, batch: int, seq: int) -> int:
    tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False, custom_mapping=CUSTOM) as counter:
        out = model(tokens)
        logits = out[0] if isinstance(out, tuple) else out  # the MoE model also returns its aux loss
        CausalLMLossFn()(logits, tokens).backward()
    return int(counter.get_total_flops())


def _vocab(args: Any) -> int:
    return int(args.text.vocab_size if hasattr(args, "text") else args.vocab_size)


@pytest.mark.parametrize(
    ("name", "seq"),
    [(name, seq) for name in SPECS for seq in ((256, 1024) if name.startswith("llama") else (32, 128))],
)
def test_flops_per_token_match_flop_counter_mode(name: str, seq: int) -> None:
    spec = SPECS[name]()
    torch.manual_seed(0)
    model = spec.build_model_fn(spec.args, device="cpu")
    batch = 2
    counted = _counted(model, _vocab(spec.args), batch, seq)
    predicted = spec.args.preflight().flop_count(seq).total * batch * seq
    assert predicted == pytest.approx(counted, rel=0.05)


def test_attention_flops_grow_with_the_sequence_in_torchtitans_convention() -> None:
    costs = llama3.create_model_spec("8B").args.preflight()
    # per token and layer: 2 x 2 x seq x 4096 forward (QK^T and AV), 4 x 2 x seq x 4096 backward (no
    # recomputed scores): 12 L H Q T
    longer, shorter = costs.flop_count(8192), costs.flop_count(4096)
    assert longer.total - shorter.total == 32 * 12 * 4096 * 4096
    assert longer.attention == 12 * 32 * 4096 * 8192
    assert longer.causal == longer.total - longer.attention // 2


def test_the_llama_3_2_1b_count_is_torchtitans_6n_plus_12lhqt() -> None:
    """6 x the weights of every matmul (the tied output projection included, the embedding lookup not)
    plus 12 x layers x heads x head size x sequence."""
    a = llama3.create_model_spec("debugmodel").args
    costs = a.preflight()
    head = a.dim // a.n_heads
    kv = (a.n_kv_heads or a.n_heads) * head
    weights = (
        a.n_layers * (a.dim * (2 * a.dim + 2 * kv) + 3 * a.dim * a.ffn_hidden_dim) + a.vocab_size * a.dim
    )
    assert costs.flop_count(512).total == 6 * weights + 12 * a.n_layers * a.n_heads * head * 512


@pytest.mark.parametrize("config", ["llama3_debug", "qwen3_5_debug"])
def test_lora_flops_per_token_leave_out_the_frozen_weights_gradients(config: str) -> None:
    """With LoRA the counter sees no weight gradient of the frozen base and the adapters' small matmuls;
    the preflight's FLOPs (the MFU's numerator) say the same within 5%, a third under full fine-tuning's."""
    from pathlib import Path

    from hyper_parallel.config import load_config
    from hyper_parallel.preflight import estimate

    path = Path(__file__).resolve().parents[2] / "configs" / f"{config}.yaml"
    seq = 128
    lora = {"peft._target_": "hyper_parallel.components.peft.LoRA.Config", "training.seq_len": str(seq)}
    cfg = load_config(path, lora)
    full = estimate(load_config(path, {"training.seq_len": str(seq)}), 1)
    est = estimate(cfg, 1)
    assert est is not None
    assert full is not None
    torch.manual_seed(0)
    model = cfg.model.build_model_fn(cfg.model.args, device="cpu")
    cfg.peft.apply(model, cfg.model.args)
    cfg.peft.after_load(model, cfg.model.args, seed=0, compute_dtype="float32")
    counted = _counted(model, _vocab(cfg.model.args), 2, seq)
    assert est.flops_per_token * 2 * seq == pytest.approx(counted, rel=0.05)
    assert est.flops_per_token < 0.75 * full.flops_per_token
