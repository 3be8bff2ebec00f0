"""An adapted layer (``LoRALinear``): the merged-weight path for training batches computes what adding the
adapter's output computes, value and gradients, and each path serves where it should.

Which path a batch took is read from what it cost (``torch.utils.flop_counter``): the merged weight is made
once per call (``out x rank x in``) and the batch takes one product with it, while adding the adapter's
output costs two thin products per token (``tokens x rank x (in + out)``) on top of the frozen layer's.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from hyper_parallel.components.peft import LoRA  # noqa: E402
from hyper_parallel.models import ModelArgs  # noqa: E402

IN, OUT, RANK = 48, 40, 4


def adapted(dropout: float = 0.0) -> Any:
    """One linear layer in a block, adapted, with every adapter matrix non-zero."""
    torch.manual_seed(0)
    model = nn.Module()
    model.layers = nn.ModuleDict({"0": nn.Module()})
    model.layers["0"].wq = nn.Linear(IN, OUT, bias=False)
    LoRA.Config(rank=RANK, alpha=8.0, dropout=dropout, targets=("wq",)).apply(model, ModelArgs())
    layer = model.layers["0"].wq
    with torch.no_grad():
        layer.lora_A.normal_(std=0.2)
        layer.lora_B.normal_(std=0.2)
    return layer


def expected(layer: Any, x: Any) -> Any:
    """``x W^T + scale (x A^T) B^T``, written out."""
    return x @ layer.weight.T + layer.lora_scale * (x @ layer.lora_A.T) @ layer.lora_B.T


def close(mine: Any, theirs: Any) -> bool:
    """Equal up to float32 rounding: within 1e-5 of the largest value."""
    return bool((mine - theirs).abs().max() <= 1e-5 * theirs.abs().max())


def forward_flops(layer: Any, x: Any) -> tuple[Any, int]:
    """The layer's output for ``x`` and the FLOPs its forward took."""
    with FlopCounterMode(display=False) as counter:
        out = layer(x)
    return out, counter.get_total_flops()


def merged_cost(tokens: int) -> int:
    """Forward FLOPs with the merged weight: ``W + s B A`` once, then one product over the tokens."""
    return 2 * OUT * RANK * IN + 2 * tokens * IN * OUT


def added_cost(tokens: int) -> int:
    """Forward FLOPs adding the adapter's output: the frozen product and the two thin ones, per token."""
    return 2 * tokens * IN * OUT + 2 * tokens * RANK * (IN + OUT)


@pytest.mark.parametrize("input_grad", [True, False])
def test_a_training_batch_takes_the_merged_weight_with_the_same_value_and_gradients(input_grad: bool) -> None:
    layer = adapted()
    assert isinstance(layer, nn.Linear)
    assert not layer.weight.requires_grad
    x = torch.randn(3, 20, IN).requires_grad_(input_grad)
    grad = torch.randn(3, 20, OUT)
    out, flops = forward_flops(layer, x)
    assert flops == merged_cost(60)
    out.backward(grad)
    got = [t.grad.clone() for t in ((x,) if input_grad else ()) + (layer.lora_A, layer.lora_B)]
    layer.zero_grad()
    x.grad = None
    ref = expected(layer, x)
    ref.backward(grad)
    want = [t.grad for t in ((x,) if input_grad else ()) + (layer.lora_A, layer.lora_B)]
    assert close(out, ref)
    for mine, theirs in zip(got, want, strict=True):
        assert close(mine, theirs)
    assert layer.weight.grad is None


@pytest.mark.parametrize(
    ("case", "merged"),
    [("training batch", True), ("no gradient", False), ("few tokens", False), ("dropout", False)],
)
def test_the_adapter_output_is_added_where_merging_cannot_serve_or_costs_more(
    case: str, merged: bool
) -> None:
    layer = adapted(dropout=0.1 if case == "dropout" else 0.0)
    tokens = 5 if case == "few tokens" else 64  # IN * OUT / (IN + OUT) is 21.8
    x = torch.randn(tokens, IN)
    with torch.set_grad_enabled(case != "no gradient"):
        out, flops = forward_flops(layer, x)
    assert flops == (merged_cost(tokens) if merged else added_cost(tokens))
    if case != "dropout":
        assert close(out, expected(layer, x))


def test_the_merged_path_under_bf16_autocast_returns_each_gradient_in_its_parameters_dtype() -> None:
    layer = adapted()
    x = torch.randn(64, IN, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert (x.grad.dtype, layer.lora_A.grad.dtype, layer.lora_B.grad.dtype) == (torch.float32,) * 3
    reference = expected(layer, x.detach())
    assert (out.float() - reference).abs().max() <= 0.05 * reference.abs().max()
