"""``ModelArgs.parameter_shapes`` lists, without torch, exactly the parameters the model builds: the weights
check that ``--dry-run`` and the launch share compares a weights folder with it."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.models._shapes import Shape  # noqa: E402
from hyper_parallel.models.llama3 import create_model_spec as llama3  # noqa: E402
from hyper_parallel.models.qwen3_5 import create_model_spec as qwen3_5  # noqa: E402
from hyper_parallel.models.qwen3_5 import create_vl_model_spec as qwen3_5_vl  # noqa: E402
from hyper_parallel.models.qwen3_5_moe import create_model_spec as qwen3_5_moe  # noqa: E402

SPECS: dict[str, tuple[Any, dict[str, Any]]] = {
    "llama3": (llama3, {}),
    "llama3-tied-gqa": (llama3, {"tie_word_embeddings": True, "n_kv_heads": 2, "ffn_dim_multiplier": 1.3}),
    "qwen3_5": (qwen3_5, {"full_attention_interval": 2}),
    "qwen3_5_vl": (qwen3_5_vl, {"vision.depth": 2, "vision.spatial_merge_size": 1}),
    "qwen3_5_moe": (qwen3_5_moe, {"n_experts": 4}),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_the_listed_shapes_are_the_built_models_parameters(name: str) -> None:
    factory, overrides = SPECS[name]
    spec = factory(flavor="debugmodel", overrides=overrides or None)
    model = spec.build_model_fn(spec.args, device="meta")
    built = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    assert spec.args.parameter_shapes() == built


@pytest.mark.parametrize("name", list(SPECS))
def test_the_adapter_maps_shapes_as_it_maps_tensors(name: str) -> None:
    """``from_hf`` on header shapes gives the shapes it gives on the tensors (MoE experts stacked too)."""
    factory, overrides = SPECS[name]
    spec = factory(flavor="debugmodel", overrides=overrides or None)
    adapter = spec.state_dict_adapter(spec.args)
    tensors = {n: torch.zeros(s) for n, s in spec.args.parameter_shapes().items()}
    hf = adapter.to_hf(tensors)
    if name == "qwen3_5_moe":  # the released layout: one tensor per expert
        assert "model.layers.0.mlp.experts.3.gate_proj.weight" in hf
    mapped = adapter.from_hf({n: Shape(tuple(t.shape)) for n, t in hf.items()})
    loaded = adapter.from_hf(hf)
    assert {n: s.shape for n, s in mapped.items()} == {n: tuple(t.shape) for n, t in loaded.items()}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Shape((6, 4)).view(5, 4), "shape '[5, 4]' is invalid for input of size 24"),
        (
            lambda: Shape((6, 4)).split([2, 2], dim=0),
            "split_with_sizes expects split_sizes to sum exactly to 6 (input tensor's size at dimension 0), "
            "but got split_sizes=[2, 2]",
        ),
        (lambda: Shape((2, 3))[2], "index 2 is out of bounds for dimension 0 with size 2"),
    ],
)
def test_a_shape_an_operation_cannot_take_raises_as_torch_does(call: Any, message: str) -> None:
    with pytest.raises(RuntimeError) as raised:
        call()
    assert str(raised.value) == message


def test_shape_arithmetic_follows_torch() -> None:
    t = torch.zeros(8, 2, 6)
    s = Shape((8, 2, 6))
    assert s.view(4, -1, 6).shape == tuple(t.view(4, -1, 6).shape)
    assert s.transpose(0, 2).shape == tuple(t.transpose(0, 2).shape)
    assert [p.shape for p in s.split([3, 5])] == [tuple(p.shape) for p in t.split([3, 5])]
    assert [p.shape for p in s.chunk(3, dim=2)] == [tuple(p.shape) for p in t.chunk(3, dim=2)]
    assert s[1, :1].shape == tuple(t[1, :1].shape)
    assert s.unsqueeze(1).shape == tuple(t.unsqueeze(1).shape)
