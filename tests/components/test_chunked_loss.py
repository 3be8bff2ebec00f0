"""The fused, chunked cross entropy (``loss.chunk_tokens``): the whole-logits loss's value and gradients,
a chunk of logits at a time, and where a run may use it.

The reference is today's path: ``hidden @ weight.T`` then ``CausalLMLossFn.sum_and_count``, with ignored
labels, label smoothing and z-loss on; float32 on the CPU, within 1e-5 for the loss and the gradients of
the hidden states and of the output weight.
"""

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.loss import CausalLMLoss  # noqa: E402
from hyper_parallel.components.loss._chunked import linear_cross_entropy_sum  # noqa: E402
from hyper_parallel.components.loss._runtime import CausalLMLossFn  # noqa: E402
from hyper_parallel.components.loss.chunking import DEFAULT_CHUNK_TOKENS, loss_chunking  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.trainer import tiny_config  # noqa: E402

IGNORE = -100


def _inputs(vocab: int = 97) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 41, 24, generator=gen)
    weight = torch.randn(vocab, 24, generator=gen) * 0.3
    labels = torch.randint(0, vocab, (3, 41), generator=gen)
    labels[0, 3:11] = IGNORE  # a masked prompt
    labels[2, 30:] = IGNORE  # padding to the end of the row
    return hidden, weight, labels


def _whole(hidden: Any, weight: Any, labels: Any, smoothing: float, z: float) -> tuple[Any, Any, Any]:
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = CausalLMLossFn(label_smoothing=smoothing, z_loss_weight=z)
    total, _ = loss.sum_and_count(h @ w.t(), labels)
    (total * 0.37).backward()  # the trainer's scale (1 / counted tokens ...) reaches both gradients
    return total.detach(), h.grad, w.grad


def _fused(
    hidden: Any, weight: Any, labels: Any, smoothing: float, z: float, chunk: int
) -> tuple[Any, Any, Any]:
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    total = linear_cross_entropy_sum(
        h, w, labels, chunk_tokens=chunk, label_smoothing=smoothing, z_loss_weight=z
    )
    (total * 0.37).backward()
    return total.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 16, 37, 10_000])  # one token, even, uneven, all tokens at once
@pytest.mark.parametrize(("smoothing", "z"), [(0.0, 0.0), (0.1, 1e-3)])
def test_the_fused_loss_and_both_gradients_equal_the_whole_logits_loss(
    chunk: int, smoothing: float, z: float
) -> None:
    hidden, weight, labels = _inputs()
    expected = _whole(hidden, weight, labels, smoothing, z)
    got = _fused(hidden, weight, labels, smoothing, z, chunk)
    for name, want, have in zip(("loss", "hidden grad", "weight grad"), expected, got, strict=True):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5, msg=name)


def test_ignored_tokens_get_no_gradient_and_count_for_nothing() -> None:
    hidden, weight, labels = _inputs()
    _, grad_hidden, _ = _fused(hidden, weight, labels, 0.1, 1e-3, 16)
    # position t is scored against label t + 1: the hidden states before an ignored label get nothing
    assert torch.equal(grad_hidden[0, 2:10], torch.zeros_like(grad_hidden[0, 2:10]))
    assert torch.equal(grad_hidden[2, 29:], torch.zeros_like(grad_hidden[2, 29:]))
    assert bool(grad_hidden[0, 10].abs().sum() > 0)
    all_ignored = torch.full_like(labels, IGNORE)
    total, grad_hidden, grad_weight = _fused(hidden, weight, all_ignored, 0.1, 1e-3, 16)
    assert float(total) == 0.0
    assert not grad_hidden.any()
    assert not grad_weight.any()


def test_backward_keeps_no_tokens_x_vocab_tensor() -> None:
    """What autograd keeps from forward to backward is the two gradients, the sizes of the hidden states
    and of the weight: never a tensor of the logits' size."""
    hidden, weight, labels = _inputs(vocab=1000)
    saved: list[int] = []

    def pack(t: Any) -> Any:
        saved.append(t.numel())
        return t

    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy_sum(h, w, labels, chunk_tokens=16)
    tokens = 3 * 40  # shifted
    assert sorted(saved) == sorted([tokens * 24, 1000 * 24])
    assert max(saved) < tokens * 1000


def test_without_gradients_only_the_loss_is_computed() -> None:
    hidden, weight, labels = _inputs()
    with torch.no_grad():
        total = linear_cross_entropy_sum(hidden, weight, labels, chunk_tokens=16)
    expected, _ = CausalLMLossFn().sum_and_count(hidden @ weight.t(), labels)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["llama3", "qwen3_5", "qwen3_5_moe"])
def test_the_trainer_with_the_fused_loss_takes_the_same_steps_as_with_the_whole_logits(model: str) -> None:
    """``loss.chunk_tokens`` read by the trainer: chunks of 7 tokens (uneven) against the whole logits,
    smoothing and z-loss on, two micro batches a step: the same losses and gradient norms, for every text
    model family (Qwen 3.5's tied output weight, the MoE model's balance loss beside it)."""
    runs = {}
    for chunk in ("7", "0"):
        overrides = {
            "loss.chunk_tokens": chunk,
            "loss.label_smoothing": "0.1",
            "loss.z_loss_weight": "0.001",
            "training.max_steps": "2",
        }
        trainer = LLMTrainer(tiny_config(model, overrides))
        try:
            assert trainer.loss_chunking.tokens == int(chunk)
            runs[chunk] = trainer.train()
        finally:
            trainer.close()
    assert [r.loss for r in runs["7"]] == pytest.approx([r.loss for r in runs["0"]], abs=1e-5)
    assert [r.grad_norm for r in runs["7"]] == pytest.approx([r.grad_norm for r in runs["0"]], rel=1e-4)


def test_the_default_fuses_where_the_run_can_and_says_why_not_elsewhere() -> None:
    cfg = tiny_config("llama3")
    assert cfg.loss.chunk_tokens is None
    assert loss_chunking(cfg) == (DEFAULT_CHUNK_TOKENS, "the default", None)
    assert loss_chunking(cfg, tp=2) == (
        0,
        "tensor parallelism (tp 2) shards the logits over the vocabulary",
        None,
    )
    compiled = tiny_config("llama3", {"compile.enable": "true"})
    assert loss_chunking(compiled).tokens == 0
    assert loss_chunking(tiny_config("llama3", {"loss.chunk_tokens": "0"})) == (
        0,
        "loss.chunk_tokens is 0",
        None,
    )


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--parallelism.tp", "2"], "tensor parallelism (tp 2) shards the logits over the vocabulary"),
        (
            ["--parallelism.pp", "2"],
            "pipeline parallelism (pp 2) computes the loss from the last stage's logits",
        ),
        (
            ["--compile.enable", "true"],
            "the compiled loss ('loss' in compile.components) takes the whole logits",
        ),
    ],
)
def test_a_stated_chunk_where_the_run_cannot_fuse_is_refused_at_dry_run(flags: list[str], why: str) -> None:
    import io

    from hyper_parallel.launch import main
    from tests.support.trainer import debug_config_path

    argv = ["--config-file", str(debug_config_path("llama3")), "--dry-run", "--no-file-checks"]
    out, errors = io.StringIO(), io.StringIO()
    status = main([*argv, "--loss.chunk_tokens", "512", *flags], out=out, err=errors)
    err = errors.getvalue()
    assert status == 2, err
    assert (
        f"--loss.chunk_tokens: cannot fuse the loss here: {why}; set it to 0 (or null) for the whole logits"
        in err.splitlines()
    )


def test_a_vision_language_model_refuses_a_stated_chunk() -> None:
    from hyper_parallel.config import ConfigError, load_config
    from tests.support import ROOT

    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs" / "qwen3_5_vl_debug.yaml", {"loss.chunk_tokens": "512"})
    assert (
        "cannot fuse the loss here: a vision-language model's trainer feeds images and projects the "
        "logits itself" in str(caught.value)
    )


def test_a_negative_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        CausalLMLoss.Config(chunk_tokens=-1)
