"""Point 1 and 3 of the preflight: exact parameter counts, in total and per layer type.

Every shipped flavor (and a few overridden ones) is built on the meta device and its ``sum(p.numel())``,
tied tensors once, must equal the estimate exactly; so must the count of each layer type, read from the
parameter names. The flavors small enough are also built on the CPU.
"""

from collections.abc import Callable
from typing import Any

import pytest

from hyper_parallel.models import llama3, qwen3_5, qwen3_5_moe
from hyper_parallel.models.spec import ModelSpec

SPECS: dict[str, Callable[[], ModelSpec]] = {
    **{f"llama3 {f}": (lambda f=f: llama3.create_model_spec(f)) for f in llama3.LLAMA3_FLAVORS},
    **{f"qwen3_5 {f}": (lambda f=f: qwen3_5.create_model_spec(f)) for f in qwen3_5.QWEN3_5_FLAVORS},
    **{f"qwen3_5_vl {f}": (lambda f=f: qwen3_5.create_vl_model_spec(f)) for f in qwen3_5.QWEN3_5_VL_FLAVORS},
    **{
        f"qwen3_5_moe {f}": (lambda f=f: qwen3_5_moe.create_model_spec(f))
        for f in qwen3_5_moe.QWEN3_5_MOE_FLAVORS
    },
    "qwen3_5_moe untied, top-1": lambda: qwen3_5_moe.create_model_spec(
        "debugmodel", overrides={"tie_word_embeddings": False, "n_experts_per_token": 1, "n_experts": 5}
    ),
    "llama3 mha, multiplier": lambda: llama3.create_model_spec(
        "debugmodel", overrides={"n_kv_heads": None, "ffn_dim_multiplier": 1.3, "vocab_size": 1001}
    ),
    "qwen3_5 untied, 2:1": lambda: qwen3_5.create_model_spec(
        "debugmodel", overrides={"tie_word_embeddings": False, "full_attention_interval": 2, "n_layers": 5}
    ),
    "qwen3_5 all full attention": lambda: qwen3_5.create_model_spec(
        "debugmodel", overrides={"full_attention_interval": 1}
    ),
    "qwen3_5_vl odd vision": lambda: qwen3_5.create_vl_model_spec(
        "debugmodel", overrides={"vision.spatial_merge_size": 3, "vision.temporal_patch_size": 1}
    ),
}
ON_CPU = [
    "llama3 debugmodel",
    "qwen3_5 debugmodel",
    "qwen3_5_vl debugmodel",
    "qwen3_5_moe debugmodel",
]  # 0.8B: 100 s to initialise


def _kind(name: str) -> str:
    """The layer type a parameter belongs to, from its name."""
    leaf = name.removeprefix("language_model.")
    if leaf.startswith("visual."):
        return "vision"
    if leaf.startswith("tok_embeddings."):
        return "embedding"
    if leaf.startswith("output."):
        return "output"
    if ".attention." in leaf:
        return "attention"
    if ".linear_attn." in leaf:
        return "gated_deltanet"
    if ".feed_forward.router." in leaf or ".feed_forward.experts." in leaf:
        return "moe"
    if ".feed_forward." in leaf:
        return "mlp"
    return "norm"


def _counts(model: Any) -> tuple[int, dict[str, int]]:
    by_kind: dict[str, int] = {}
    for name, param in model.named_parameters():  # a tied tensor is listed once
        by_kind[_kind(name)] = by_kind.get(_kind(name), 0) + param.numel()
    return sum(p.numel() for p in model.parameters()), by_kind


def _predicted(spec: ModelSpec) -> tuple[int, dict[str, int]]:
    by_kind: dict[str, int] = {}
    for group in spec.args.preflight().parameters():  # type: ignore[attr-defined]
        by_kind[group.kind] = by_kind.get(group.kind, 0) + group.numel * group.copies
    return sum(by_kind.values()), by_kind


@pytest.mark.parametrize("name", list(SPECS))
def test_parameter_count_equals_the_built_model_on_meta(name: str) -> None:
    pytest.importorskip("torch")
    spec = SPECS[name]()
    model = spec.build_model_fn(spec.args, device="meta")
    assert _predicted(spec) == _counts(model)


@pytest.mark.parametrize("name", ON_CPU)
def test_parameter_count_equals_the_built_model_on_cpu(name: str) -> None:
    pytest.importorskip("torch")
    spec = SPECS[name]()
    model = spec.build_model_fn(spec.args, device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert _predicted(spec) == _counts(model)


def test_shipped_flavors_report_their_published_sizes() -> None:
    totals = {name: _predicted(SPECS[name]())[0] for name in ("llama3 8B", "llama3 70B", "llama3 405B")}
    assert totals == {
        "llama3 8B": 8_030_261_248,
        "llama3 70B": 70_553_706_496,
        "llama3 405B": 405_853_388_800,
    }


@pytest.mark.parametrize("name", [n for n in SPECS if n.startswith("qwen3_5_moe")])
def test_active_parameters_count_the_experts_a_token_uses(name: str) -> None:
    """Active per token: every parameter but the routed experts, of which ``n_experts_per_token`` rows."""
    pytest.importorskip("torch")
    spec = SPECS[name]()
    args: Any = spec.args
    model = spec.build_model_fn(args, device="meta")
    active = sum(
        p.numel() // args.n_experts * args.n_experts_per_token if ".experts." in n else p.numel()
        for n, p in model.named_parameters()
    )
    groups = args.preflight().parameters()
    assert sum(g.active_numel * g.copies for g in groups) == active
    assert active < sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("flavor", "counts"),
    [
        ("35B-A3B", (34_660_610_688, 3_454_988_928, 2_437_870_208)),
        ("122B-A10B", (122_111_526_912, 9_771_288_576, 8_245_610_496)),
        ("397B-A17B", (396_346_350_336, 17_349_040_896, 15_314_803_456)),
    ],
)
def test_released_moe_flavors_have_their_published_total_and_active_sizes(
    flavor: str, counts: tuple[int, int, int]
) -> None:
    """Total, active per token, and active outside the embedding and output (the text model: the released
    checkpoints add a vision encoder and a multi-token-prediction layer): 34.66 B / 3.45 B for 35B-A3B,
    122.11 B / 9.77 B for 122B-A10B, 396.35 B / 17.35 B for 397B-A17B."""
    groups = qwen3_5_moe.create_model_spec(flavor).args.preflight().parameters()  # type: ignore[arg-type, attr-defined]
    total = sum(g.numel * g.copies for g in groups)
    active = sum(g.active_numel * g.copies for g in groups)
    inner = sum(g.active_numel * g.copies for g in groups if g.kind not in ("embedding", "output"))
    assert (total, active, inner) == counts
