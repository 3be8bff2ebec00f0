"""The chunked gated delta rule equals the token-by-token recurrence (values, final state, gradients)."""

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.models.qwen3_5._gated_delta import (  # noqa: E402
    chunk_gated_delta_rule,
    gated_delta_rule,
    recurrent_gated_delta_rule,
)

BATCH, SEQ, K_HEADS, V_HEADS, D_K, D_V = 2, 45, 2, 4, 8, 6


def inputs(seed: int = 0, with_state: bool = True) -> list[Any]:
    """q, k (2 key heads), v (4 value heads), log decay <= 0, beta in (0, 1), initial state."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(BATCH, SEQ, K_HEADS, D_K, generator=generator),
        torch.randn(BATCH, SEQ, K_HEADS, D_K, generator=generator),
        torch.randn(BATCH, SEQ, V_HEADS, D_V, generator=generator),
        -torch.rand(BATCH, SEQ, V_HEADS, generator=generator) * 2,
        torch.rand(BATCH, SEQ, V_HEADS, generator=generator),
        torch.randn(BATCH, V_HEADS, D_K, D_V, generator=generator) if with_state else None,
    ]
    return [t.requires_grad_(True) if t is not None else None for t in tensors]


def run(fn: Any, tensors: list[Any], **kwargs: Any) -> tuple[Any, Any, list[Any]]:
    """Output, final state, and the gradients of a fixed random projection of both w.r.t. every input."""
    out, state = fn(*tensors[:5], initial_state=tensors[5], **kwargs)
    generator = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=generator)).sum()
    loss = loss + (state * torch.randn(state.shape, generator=generator)).sum()
    leaves = [t for t in tensors if t is not None]
    grads = torch.autograd.grad(loss, leaves)
    return out.detach(), state.detach(), list(grads)


def assert_close(actual: Any, expected: Any) -> None:
    assert (actual - expected).abs().max().item() <= 1e-5


# 45 tokens: chunks of 1, 8 and 16 leave a partial last chunk; 64 is longer than the sequence.
@pytest.mark.parametrize("chunk_size", [1, 8, 16, 45, 64])
@pytest.mark.parametrize("with_state", [True, False], ids=["initial-state", "zero-state"])
def test_chunked_matches_recurrence_in_values_and_gradients(chunk_size: int, with_state: bool) -> None:
    tensors = inputs(with_state=with_state)
    expected = run(recurrent_gated_delta_rule, tensors)
    actual = run(chunk_gated_delta_rule, tensors, chunk_size=chunk_size)
    assert expected[0].abs().max().item() > 0.1  # a real output, not a vanishing one
    assert_close(actual[0], expected[0])
    assert_close(actual[1], expected[1])
    for got, want in zip(actual[2], expected[2], strict=True):
        assert want.abs().max().item() > 0
        assert_close(got, want)


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 64])
def test_resets_restart_the_state_like_the_recurrence(chunk_size: int) -> None:
    tensors = inputs(seed=3)
    resets = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    resets[0, [0, 7, 8, 30]] = True  # at the start, two in a row, and one inside a chunk
    resets[1, 16] = True  # exactly on a chunk boundary for chunk sizes 1, 16
    expected = run(recurrent_gated_delta_rule, tensors, resets=resets)
    actual = run(chunk_gated_delta_rule, tensors, chunk_size=chunk_size, resets=resets)
    assert_close(actual[0], expected[0])
    assert_close(actual[1], expected[1])
    for got, want in zip(actual[2], expected[2], strict=True):
        assert_close(got, want)


def test_a_reset_forgets_everything_before_it() -> None:
    q, k, v, g, beta, state = (t.detach() for t in inputs(seed=5))
    resets = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    resets[:, 20] = True
    out, _ = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=8, initial_state=state, resets=resets)
    alone, _ = chunk_gated_delta_rule(q[:, 20:], k[:, 20:], v[:, 20:], g[:, 20:], beta[:, 20:], chunk_size=8)
    assert_close(out[:, 20:], alone)


def test_dispatch_uses_the_recurrent_step_for_one_token_and_carries_the_state() -> None:
    q, k, v, g, beta, state = (t.detach() for t in inputs(seed=2))
    whole, final = gated_delta_rule(q, k, v, g, beta, initial_state=state)
    head, mid = gated_delta_rule(
        q[:, :-1], k[:, :-1], v[:, :-1], g[:, :-1], beta[:, :-1], initial_state=state
    )
    last, end = gated_delta_rule(q[:, -1:], k[:, -1:], v[:, -1:], g[:, -1:], beta[:, -1:], initial_state=mid)
    assert_close(torch.cat((head, last), dim=1), whole)
    assert_close(end, final)


def test_non_positive_chunk_size_is_rejected() -> None:
    q, k, v, g, beta, _ = inputs()
    with pytest.raises(ValueError, match="chunk_size must be positive, got 0"):
        chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=0)
