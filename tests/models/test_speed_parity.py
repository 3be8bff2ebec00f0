"""The fast paths stay exact: gradients against transformers, chunk sizes, packed-document masking."""

from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_5")

from hyper_parallel.models import llama3  # noqa: E402
from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter  # noqa: E402
from hyper_parallel.models.qwen3_5._runtime import Qwen3_5StateDictAdapter  # noqa: E402
from tests.support import llama3_reference as llama_case  # noqa: E402
from tests.support import qwen3_5_reference as qwen_case  # noqa: E402

# Sequence 70 with chunk 16: four full chunks and a partial one.
QWEN = attrs.evolve(qwen_case.TINY, linear_chunk_size=16)
SEQ = 70
LLAMA = attrs.evolve(llama_case.TINY, max_seq_len=128)


def assert_close(actual: Any, expected: Any, tolerance: float) -> None:
    """Within ``tolerance`` of the largest expected magnitude (absolute below magnitude 1)."""
    scale = max(1.0, expected.abs().max().item())
    assert (actual - expected).abs().max().item() <= tolerance * scale


def grads_by_name(model: Any, loss: Any) -> dict[str, Any]:
    loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


def random_projection(logits: Any) -> Any:
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    return (logits * weights).sum()


def test_qwen_gradients_match_transformers() -> None:
    reference = qwen_case.hf_model(QWEN)
    ours = qwen_case.build(QWEN)
    ours.load_state_dict(Qwen3_5StateDictAdapter(QWEN).from_hf(reference.state_dict()), strict=True)
    ids = qwen_case.tokens(QWEN, seq=SEQ)
    ours_logits, their_logits = ours(ids), reference(ids).logits
    assert (ours_logits - their_logits).abs().max().item() < 1e-4
    ours_grads = grads_by_name(ours, random_projection(ours_logits))
    their_grads = grads_by_name(reference, random_projection(their_logits))
    mapped = Qwen3_5StateDictAdapter(QWEN).from_hf(their_grads)
    assert set(mapped) == set(ours_grads)
    for name, grad in ours_grads.items():
        assert grad.abs().max().item() > 0, name
        assert (grad - mapped[name]).abs().max().item() < 1e-4, name


def test_llama_gradients_match_transformers() -> None:
    args = llama_case.TINY
    reference = llama_case.hf_model(args)
    ours = llama3.create_model_spec("debugmodel").build_model_fn(args, device="cpu")
    ours.load_state_dict(Llama3StateDictAdapter(args).from_hf(reference.state_dict()), strict=True)
    ids = llama_case.tokens(args)
    ours_logits, their_logits = ours(ids), reference(ids).logits
    assert (ours_logits - their_logits).abs().max().item() < 1e-4
    ours_grads = grads_by_name(ours, random_projection(ours_logits))
    mapped = Llama3StateDictAdapter(args).from_hf(grads_by_name(reference, random_projection(their_logits)))
    for name, grad in ours_grads.items():
        assert grad.abs().max().item() > 0, name
        assert (grad - mapped[name]).abs().max().item() < 1e-4, name


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_qwen_logits_do_not_depend_on_the_chunk_size(chunk_size: int) -> None:
    torch.manual_seed(0)
    reference = qwen_case.build(QWEN).eval()
    other = qwen_case.build(attrs.evolve(QWEN, linear_chunk_size=chunk_size)).eval()
    other.load_state_dict(reference.state_dict())
    ids = qwen_case.tokens(QWEN, seq=SEQ)
    with torch.no_grad():
        assert (other(ids) - reference(ids)).abs().max().item() < 1e-5


LENGTHS = (5, 37, 1, 27)  # a one-token document, and boundaries inside and across 16-token chunks


def packed(vocab: int) -> tuple[list[Any], Any, Any]:
    """Documents of LENGTHS, their concatenation (batch 1), and ids (reusing an id for a later one)."""
    generator = torch.Generator().manual_seed(4)
    docs = [torch.randint(0, vocab, (1, n), generator=generator) for n in LENGTHS]
    ids = torch.cat([torch.full((1, n), i % 2) for i, n in enumerate(LENGTHS)], dim=1)
    return docs, torch.cat(docs, dim=1), ids


def models() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "llama3": llama3.create_model_spec("debugmodel").build_model_fn(LLAMA, device="cpu"),
        "qwen3_5": qwen_case.build(QWEN),
    }


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_packed_documents_match_running_each_document_alone(name: str) -> None:
    model = models()[name].eval()
    docs, tokens, ids = packed(model.args.vocab_size)
    with torch.no_grad():
        alone = torch.cat([model(doc) for doc in docs], dim=1)
        together = model(tokens, document_ids=ids)
        unmasked = model(tokens)
    assert (together - alone).abs().max().item() < 1e-5
    assert (unmasked - alone).abs().max().item() > 1e-2  # without ids the documents do interact
    batch = torch.cat((tokens, tokens.flip(1)))  # rows are independent
    with torch.no_grad():
        rows = model(batch, document_ids=torch.cat((ids, ids.flip(1))))
    assert (rows[:1] - alone).abs().max().item() < 1e-5


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_packed_document_gradients_match_running_each_document_alone(name: str) -> None:
    model = models()[name]
    docs, tokens, ids = packed(model.args.vocab_size)
    alone = grads_by_name(model, sum(random_projection(model(doc)) for doc in docs))
    model.zero_grad()
    alone = {k: v.clone() for k, v in alone.items()}
    logits = model(tokens, document_ids=ids)
    together = grads_by_name(model, sum(random_projection(x) for x in logits.split(LENGTHS, dim=1)))
    for grad, expected in zip(together.values(), alone.values(), strict=True):
        assert_close(grad, expected, 1e-5)


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_document_ids_of_another_shape_are_rejected(name: str) -> None:
    model = models()[name]
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"document_ids must have the \(batch, seq\) shape \(2, 8\) of "):
        model(tokens, document_ids=torch.zeros(8, dtype=torch.long))
