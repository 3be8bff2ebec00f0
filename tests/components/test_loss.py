"""Loss.Config.build(): shifted causal-LM cross entropy against a hand-computed reference."""

import math

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.loss import CausalLMLoss, Loss  # noqa: E402

IGNORE = -100


def reference(logits: "torch.Tensor", labels: "torch.Tensor", ignore: int = IGNORE) -> tuple[float, int]:
    """Sum of -log softmax(logits[b, t])[labels[b, t + 1]] over counted tokens, and their number."""
    total, count = 0.0, 0
    batch, seq, _ = logits.shape
    for b in range(batch):
        for t in range(seq - 1):
            target = int(labels[b, t + 1])
            if target == ignore:
                continue
            row = [float(x) for x in logits[b, t]]
            log_z = math.log(sum(math.exp(x) for x in row))
            total += log_z - row[target]
            count += 1
    return total, count


@pytest.fixture
def batch() -> tuple["torch.Tensor", "torch.Tensor"]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=gen, dtype=torch.float64)
    labels = torch.tensor([[3, 1, IGNORE, 6, 2], [0, IGNORE, IGNORE, 4, 5]])
    return logits, labels


def test_mean_over_counted_tokens(batch: tuple["torch.Tensor", "torch.Tensor"]) -> None:
    logits, labels = batch
    total, count = reference(logits, labels)
    assert count == 5  # labels[:, 1:] has 3 ignored positions out of 8
    loss = CausalLMLoss.Config().build()(logits, labels)
    assert loss.item() == pytest.approx(total / count, rel=1e-6)


def test_a_call_is_the_token_mean_under_either_reduction_and_sum_and_count_its_parts(
    batch: tuple["torch.Tensor", "torch.Tensor"],
) -> None:
    # A call sees one batch: both reductions weigh its tokens alike (they differ only in how the trainer
    # weighs the micro-batches of a step, see tests/trainer/test_trainer.py).
    logits, labels = batch
    total, count = reference(logits, labels)
    fn = CausalLMLoss.Config(reduction="sum").build()
    assert fn(logits, labels).item() == pytest.approx(total / count, rel=1e-6)
    by_micro_batch = CausalLMLoss.Config(reduction="mean").build()
    assert by_micro_batch(logits, labels).item() == pytest.approx(total / count, rel=1e-6)
    s, n = fn.sum_and_count(logits, labels)
    assert (s.item(), n.item()) == (pytest.approx(total, rel=1e-6), count)


def test_token_weighted_aggregation_across_ranks(batch: tuple["torch.Tensor", "torch.Tensor"]) -> None:
    """Sum mode over two 'ranks' divided by the global count equals the mean over the whole batch."""
    logits, labels = batch
    fn = CausalLMLoss.Config(reduction="sum").build()
    parts = [fn.sum_and_count(logits[i : i + 1], labels[i : i + 1]) for i in range(2)]
    merged = sum(p[0] for p in parts) / sum(p[1] for p in parts)
    whole = CausalLMLoss.Config().build()(logits, labels)
    assert merged.item() == pytest.approx(whole.item(), rel=1e-9)


def test_custom_ignore_index(batch: tuple["torch.Tensor", "torch.Tensor"]) -> None:
    logits, _ = batch
    labels = torch.tensor([[3, 1, 6, 6, 2], [0, 6, 1, 4, 5]])
    total, count = reference(logits, labels, ignore=6)
    assert count == 5
    loss = CausalLMLoss.Config(ignore_index=6).build()(logits, labels)
    assert loss.item() == pytest.approx(total / count, rel=1e-6)
    default = CausalLMLoss.Config().build()(logits, labels)
    assert default.item() != pytest.approx(loss.item())


def test_all_ignored_gives_zero_not_nan() -> None:
    logits = torch.randn(1, 3, 4, requires_grad=True)
    labels = torch.full((1, 3), IGNORE)
    loss = CausalLMLoss.Config().build()(logits, labels)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(logits.grad) == 0


def test_label_smoothing_and_z_loss(batch: tuple["torch.Tensor", "torch.Tensor"]) -> None:
    logits, labels = batch
    shifted, targets = logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1)
    keep = targets != IGNORE
    logp = torch.log_softmax(shifted[keep], -1)
    eps = 0.1
    smoothed = -((1 - eps) * logp.gather(1, targets[keep, None]).squeeze(1) + eps * logp.mean(-1))
    z = torch.logsumexp(shifted[keep], -1) ** 2
    expected = (smoothed.sum() + 1e-2 * z.sum()) / keep.sum()
    got = CausalLMLoss.Config(label_smoothing=eps, z_loss_weight=1e-2).build()(logits, labels)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)


def test_gradient_flows_and_float32_compute() -> None:
    logits = torch.randn(2, 4, 5, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 5, (2, 4))
    loss = CausalLMLoss.Config().build()(logits, labels)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logits.grad is not None
    assert torch.count_nonzero(logits.grad[:, -1]) == 0  # the last position predicts nothing


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"expected logits \[batch, seq, vocab\]"):
        CausalLMLoss.Config().build()(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Loss\.Config"):
        Loss.Config().build()
