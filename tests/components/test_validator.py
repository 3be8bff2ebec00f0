"""Validator.Config.build(dataloader, loss): validate(model, step) -> mean loss and perplexity, no grads."""

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.dataloader import JsonlSource, LoaderRequest  # noqa: E402
from hyper_parallel.components.loss import CausalLMLoss  # noqa: E402
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.components.validator import LossValidator, Validator  # noqa: E402
from tests.support.components import TinyLM, train_tokenizer, write_jsonl  # noqa: E402

VOCAB = 9


def fixed_batches() -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for rows in (2, 3, 1):
        ids = torch.randint(0, VOCAB, (rows, 5), generator=gen)
        labels = ids.clone()
        labels[0, 2:] = -100  # uneven token counts per batch: the mean must be token-weighted
        out.append({"input_ids": ids, "labels": labels})
    return out


def reference(model: Any, batches: list[dict[str, Any]]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(b["input_ids"])[:, :-1].reshape(-1, VOCAB)
            targets = b["labels"][:, 1:].reshape(-1)
            keep = targets != -100
            total += torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum").item()
            count += int(keep.sum())
    return total / count


@pytest.fixture
def model() -> Any:
    torch.manual_seed(0)
    return TinyLM(VOCAB)


def test_mean_loss_is_token_weighted_and_perplexity_is_its_exp(model: Any) -> None:
    batches = fixed_batches()
    validator = LossValidator.Config(enable=True).build(batches, CausalLMLoss.Config().build())
    result = validator.validate(model, step=10)
    expected = reference(model, batches)
    assert result["loss"] == pytest.approx(expected, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert result["batches"] == 3
    assert result["tokens"] == (1 + 4) + (1 + 2 * 4) + 1


def test_steps_limits_the_batches(model: Any) -> None:
    batches = fixed_batches()
    validator = LossValidator.Config(steps=2).build(batches, CausalLMLoss.Config(reduction="sum").build())
    result = validator.validate(model, step=1)
    assert result["batches"] == 2
    assert result["loss"] == pytest.approx(reference(model, batches[:2]), rel=1e-6)


def test_no_gradients_and_training_mode_restored(model: Any) -> None:
    model.train()
    LossValidator.Config().build(fixed_batches(), CausalLMLoss.Config().build()).validate(model, 1)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append((m.training, torch.is_grad_enabled())))
    LossValidator.Config().build(fixed_batches(), CausalLMLoss.Config().build()).validate(model, 1)
    assert seen == [(False, False)] * 3
    assert not model.training


def test_a_plain_callable_loss_is_weighted_by_labels(model: Any) -> None:
    batches = [{"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[1, 2, 3]])}] * 2

    def loss(logits: Any, labels: Any) -> Any:
        return torch.tensor(2.0)

    result = LossValidator.Config().build(batches, loss).validate(model, 1)
    assert result["loss"] == 2.0
    assert result["perplexity"] == pytest.approx(math.exp(2.0))


def test_built_validation_loader_gives_the_same_pass_every_time(model: Any, tmp_path: Path) -> None:
    tok = HuggingFaceTokenizer.Config(path=str(train_tokenizer(tmp_path / "tok"))).build()
    data = write_jsonl(tmp_path / "val.jsonl", 20)
    cfg = LossValidator.Config(
        enable=True, freq=5, dataset=JsonlSource(paths=(str(data),)), micro_batch_size=3
    )
    loader = cfg.build_dataloader(LoaderRequest(tok, 0, 1, seq_len=6, micro_batch_size=1, seed=0))
    torch.manual_seed(0)
    lm = TinyLM(tok.vocab_size)
    every = list(loader)
    assert len(every) == len(loader)
    assert every[0]["input_ids"].shape[0] == 3  # the section's micro_batch_size
    assert list(loader)  # a finished pass starts over
    validator = cfg.build(loader, CausalLMLoss.Config().build())
    first = validator.validate(lm, 5)
    assert first["batches"] == len(loader)
    assert validator.validate(lm, 10) == first
    assert first["loss"] == pytest.approx(reference_lm(lm, every), rel=1e-6)
    assert [s for s in range(1, 16) if validator.should_validate(s)] == [5, 10, 15]
    off = LossValidator.Config(freq=5).build(loader, CausalLMLoss.Config().build())
    assert not off.should_validate(5)


def reference_lm(model: Any, batches: list[dict[str, Any]]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(b["input_ids"])
            flat = logits[:, :-1].reshape(-1, logits.size(-1))
            total += torch.nn.functional.cross_entropy(
                flat, b["labels"][:, 1:].reshape(-1), reduction="sum"
            ).item()
            count += b["labels"][:, 1:].numel()
    return total / count


def test_no_counted_token_is_an_error(model: Any) -> None:
    batches = [{"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([[-100, -100]])}]
    with pytest.raises(ValueError, match="counted no tokens"):
        LossValidator.Config().build(batches, CausalLMLoss.Config().build()).validate(model, 3)


def test_base_config_names_the_class() -> None:
    with pytest.raises(NotImplementedError, match=r"Validator\.Config"):
        Validator.Config().build([], None)


@pytest.mark.parametrize(("world", "steps"), [(2, -1), (3, -1), (2, 3), (4, 2)])
def test_rank_shares_add_up_to_the_single_process_result(tmp_path: Path, world: int, steps: int) -> None:
    tok = HuggingFaceTokenizer.Config(path=str(train_tokenizer(tmp_path / "tok"))).build()
    data = write_jsonl(tmp_path / "val.jsonl", 25)
    cfg = LossValidator.Config(steps=steps, dataset=JsonlSource(paths=(str(data),)))
    torch.manual_seed(0)
    lm = TinyLM(tok.vocab_size)
    loss = CausalLMLoss.Config().build()

    def result(rank: int, size: int) -> dict[str, float]:
        loader = cfg.build_dataloader(LoaderRequest(tok, rank, size, seq_len=6, micro_batch_size=2, seed=0))
        return cfg.build(loader, loss).validate(lm, 1)

    single = result(0, 1)
    shares = [result(r, world) for r in range(world)]
    # What the all-reduce over the data-parallel group adds up: the same tokens, the same mean.
    assert sum(s["tokens"] for s in shares) == single["tokens"]
    mean = sum(s["loss"] * s["tokens"] for s in shares if s["tokens"]) / single["tokens"]
    assert mean == pytest.approx(single["loss"], rel=0, abs=1e-6)  # float32 per-batch sums
    assert len({s["batches"] for s in shares}) == 1
