"""fla's Gated DeltaNet kernels on Hopper where only fla issue #640 refuses them (Triton 3.4.0 to 3.7.1)
and the key head size selects the 128-wide key tile the bug leaves correct: which kernel serves, the
device comparison that must pass first (run here on the CPU between our chunked kernel and the token
loop), its warnings, and the lifting of fla's refusal through its backend registry (with fla installed)."""

from __future__ import annotations

import importlib
import itertools
import types
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.autograd import Function  # noqa: E402

from hyper_parallel.models.qwen3_5 import _gated_delta  # noqa: E402
from hyper_parallel.models.qwen3_5._gated_delta import CheckedFla  # noqa: E402

REFUSAL = (
    "flash-linear-attention's gated backward is wrong on Hopper GPUs with Triton 3.6.0 "
    "(fla issue #640; Triton >= 3.7.1 or tilelang fixes it)"
)


@pytest.mark.parametrize(
    ("key_head_dim", "tile"), [(8, 16), (32, 32), (64, 64), (96, 128), (128, 128), (256, 128)]
)
def test_the_key_tile_is_fla_s_on_hopper(key_head_dim: int, tile: int) -> None:
    assert _gated_delta.fla_key_tile(key_head_dim) == tile


def fake_fla(q: Any, k: Any, v: Any, *, g: Any, beta: Any, initial_state: Any = None, **kw: Any) -> Any:
    """fla's call computed by our chunked kernel (one document at a time where ``cu_seqlens`` is given)."""
    assert kw["use_qk_l2norm_in_kernel"]
    assert kw["output_final_state"]
    cu_seqlens = kw.get("cu_seqlens")
    if cu_seqlens is None:
        return _gated_delta.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state)
    parts = [
        _gated_delta.chunk_gated_delta_rule(*(x[:, start:end] for x in (q, k, v, g, beta)))
        for start, end in itertools.pairwise(cu_seqlens.tolist())
    ]
    return torch.cat([out for out, _ in parts], dim=1), torch.cat([state for _, state in parts])


@pytest.fixture
def installed_fla(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An installed fla whose kernel is :func:`fake_fla`; the lookups' caches are cleared around the test."""
    module = types.SimpleNamespace(chunk_gated_delta_rule=fake_fla)
    real_import = importlib.import_module

    def importing(name: str, *args: Any) -> Any:
        return module if name == "fla.ops.gated_delta_rule" else real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", importing)
    _gated_delta.fla_kernel.cache_clear()
    yield module
    _gated_delta.fla_kernel.cache_clear()


@pytest.mark.parametrize(
    ("capability", "triton", "key_head_dim", "lifted", "served"),
    [
        ((9, 0), "3.6.0", 128, None, "checked"),  # the H200's image, Qwen 3.5's key heads
        ((9, 0), "3.6.0", 64, None, "chunked"),  # the tile #640 corrupts
        ((9, 0), "3.6.0", 128, "fla's backend registry cannot be imported (x)", "chunked"),
        ((9, 0), "3.7.1", 64, None, "fla"),  # fixed Triton: fla as it is
        ((8, 0), "3.6.0", 64, None, "fla"),  # not Hopper
    ],
)
def test_which_kernel_serves_on_each_machine_and_key_head_size(
    installed_fla: Any,
    monkeypatch: pytest.MonkeyPatch,
    capability: tuple[int, int],
    triton: str,
    key_head_dim: int,
    lifted: str | None,
    served: str,
) -> None:
    refusal = _gated_delta.fla_refusal(capability, triton, False)
    monkeypatch.setattr(_gated_delta, "fla_refusal", lambda: refusal)
    monkeypatch.setattr(_gated_delta, "_lift_fla_640_refusal", lambda: lifted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = _gated_delta.fla_kernel(key_head_dim)
    messages = [str(w.message) for w in caught]
    if served == "fla":
        assert kernel is not None
        assert not isinstance(kernel, CheckedFla)
        assert messages == []
    elif served == "checked":
        assert isinstance(kernel, CheckedFla)
        assert kernel.refusal == REFUSAL
        assert messages == []  # said when a shape's comparison is done
    elif lifted is None:
        assert kernel is None
        assert messages == [f"{REFUSAL}; Gated DeltaNet runs the PyTorch chunked kernel"]
    else:
        assert kernel is None
        assert messages == [
            f"{REFUSAL}; its 128-wide key tile is not affected, but {lifted}; "
            "Gated DeltaNet runs the PyTorch chunked kernel"
        ]


def gated_inputs(seq: int = 40, dtype: Any = torch.float32) -> list[Any]:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randn(2, seq, 2, 16, generator=generator, dtype=dtype),
        torch.randn(2, seq, 2, 16, generator=generator, dtype=dtype),
        torch.randn(2, seq, 4, 8, generator=generator, dtype=dtype),
        -torch.rand(2, seq, 4, generator=generator),
        torch.rand(2, seq, 4, generator=generator, dtype=dtype),
    ]


@pytest.mark.parametrize("agrees", [True, False])
def test_a_checked_fla_serves_a_shape_after_its_comparison_and_says_so(
    agrees: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    compared: list[tuple[int, ...]] = []

    def recording_fla(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return fake_fla(*args, **kwargs)

    fla = CheckedFla(recording_fla, REFUSAL)
    problem = None if agrees else "relative RMS difference above 0.04: key 3.1, log_decay 0.9"

    def compare(query: Any, key: Any, value: Any, packed: bool) -> str | None:
        compared.append(tuple(query.shape))
        return problem

    monkeypatch.setattr(fla, "compare", compare)
    inputs = gated_inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # compared once per shape
            out, _ = _gated_delta.gated_delta_rule(*inputs, fla=fla)
    expected, _ = _gated_delta.chunk_gated_delta_rule(*inputs)
    assert (out - expected).abs().max().item() < 1e-5
    assert compared == [(2, 40, 2, 16)]
    assert len(calls) == (2 if agrees else 0)
    where = "40 tokens, 2x16 key, 4x8 value heads, torch.float32"
    if agrees:
        assert [str(w.message) for w in caught] == [
            f"{REFUSAL}; key head size 16 takes the 128-wide key tile the bug leaves correct, and fla's "
            f"forward and gradients matched the PyTorch chunked kernel on this device ({where}): "
            "Gated DeltaNet runs fla's kernels"
        ]
    else:
        assert [str(w.message) for w in caught] == [
            f"{REFUSAL}; fla's kernels differ from the PyTorch chunked kernel on this device "
            f"({where}: {problem}); Gated DeltaNet runs the PyTorch chunked kernel"
        ]
    assert fla.verdicts == {(40, 2, 16, 4, 8, torch.float32, torch.device("cpu"), False): problem}


def test_the_comparison_measures_the_output_and_every_input_gradient() -> None:
    """Our chunked kernel against the token loop, with and without packed documents: every relative
    difference is fp32 rounding; a kernel whose key gradient is wrong (as #640's) is named alone."""
    query, key, value = gated_inputs(seq=48)[:3]
    for packed in (False, True):
        inputs = _gated_delta.check_inputs(query, key, value, packed)
        assert ("resets" in inputs) is packed
        errors = _gated_delta.kernel_disagreement(
            _gated_delta.chunk_gated_delta_rule, _gated_delta.recurrent_gated_delta_rule, inputs
        )
        assert set(errors) == {"output", "query", "key", "value", "log_decay", "beta"}
        assert max(errors.values()) < 1e-5, errors
        assert _gated_delta.disagreement_problem(errors, _gated_delta.FLA_CHECK_TOLERANCE) is None

    class TripledGradient(Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad * 3

    def wrong_key_gradient(q: Any, k: Any, *rest: Any, **kwargs: Any) -> Any:
        tripled = TripledGradient.apply(k)  # type: ignore[no-untyped-call]
        return _gated_delta.recurrent_gated_delta_rule(q, tripled, *rest, **kwargs)

    errors = _gated_delta.kernel_disagreement(_gated_delta.chunk_gated_delta_rule, wrong_key_gradient, inputs)
    problem = _gated_delta.disagreement_problem(errors, _gated_delta.FLA_CHECK_TOLERANCE)
    assert problem == f"relative RMS difference above 0.04: key {errors['key']:.3g}"
    assert errors["key"] == pytest.approx(2.0, rel=1e-4)
    nan = _gated_delta.disagreement_problem({"output": float("nan")}, 0.04)
    assert nan == "relative RMS difference above 0.04: output nan"  # a NaN is never within tolerance


def test_the_device_check_runs_fla_against_our_kernel_and_reports_its_refusal() -> None:
    query, key, value = gated_inputs(seq=40)[:3]
    assert CheckedFla(fake_fla, REFUSAL).compare(query, key, value, False) is None

    def refusing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for\nmore")

    problem = CheckedFla(refusing, REFUSAL).compare(query, key, value, False)
    assert (
        problem == "RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for"
    )


def test_fla_s_refusal_is_lifted_for_128_wide_key_tiles_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fla installed (not in the suite's environment): the backend registered in fla's registry
    takes ``chunk_bwd_dqkwg`` for a 128-wide key tile and runs fla's own function past its refusal,
    restoring the flag after; a 64-wide tile still meets fla's refusal."""
    chunk_o = pytest.importorskip("fla.ops.common.chunk_o")
    monkeypatch.setattr(chunk_o, "IS_NVIDIA_HOPPER", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_4_0", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_7_1", False)
    _gated_delta._lift_fla_640_refusal.cache_clear()
    assert _gated_delta._lift_fla_640_refusal() is None

    def call(key_head_dim: int) -> str:
        q = torch.zeros(1, 64, 1, key_head_dim, dtype=torch.bfloat16)
        v, h = torch.zeros(1, 64, 1, 64, dtype=torch.bfloat16), torch.zeros(1, 1, key_head_dim, 64)
        g = torch.zeros(1, 64, 1)
        try:
            chunk_o.chunk_bwd_dqkwg(q, q, v, v, h.bfloat16(), h.bfloat16(), g=g, scale=1.0)
        except Exception as error:  # the CPU has no Triton device: past the refusal, the launch fails
            return str(error)
        return "ran"

    assert "(see #640)" in call(64)
    assert "(see #640)" not in call(128)
    assert chunk_o.TRITON_ABOVE_3_7_1 is False


def test_the_comparison_runs_clear_of_the_caller_s_grad_mode_autocast_and_checkpoint_hooks() -> None:
    """A layer's first forward may run under no_grad, autocast or activation checkpointing's saved-tensor
    hooks; the comparison's own forward and backward see none of them."""
    query, key, value = gated_inputs(seq=40)[:3]

    def pack(tensor: Any) -> Any:
        raise AssertionError("the caller's saved-tensor hooks reached the comparison")

    fla = CheckedFla(fake_fla, REFUSAL)
    with (
        warnings.catch_warnings(record=True),
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x),
    ):
        warnings.simplefilter("always")
        assert fla.serves(query, key, value, packed=True)
