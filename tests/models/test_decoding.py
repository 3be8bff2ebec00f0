"""Decoding with the inference cache gives what recomputing the whole sequence gives.

The debug models of Llama 3 (a key/value cache per attention block), Qwen 3.5 (key/value caches and the
Gated DeltaNet blocks' convolution inputs and recurrent state) and Qwen 3.5 MoE (the same token mixers, each
token routed to its experts as it comes; shrunk to tiny experts) decode a prompt longer than one Gated
DeltaNet chunk; every new token must be the token full recomputation picks, and the logits of a sequence
fed in pieces (prompt, one token, several tokens) must be those of one forward.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.models._inference import InferenceCache, causal_mask, generate_ids  # noqa: E402
from hyper_parallel.models.llama3 import create_model_spec as llama3  # noqa: E402
from hyper_parallel.models.qwen3_5 import create_model_spec as qwen3_5  # noqa: E402
from hyper_parallel.models.qwen3_5_moe import create_model_spec as qwen3_5_moe  # noqa: E402

FACTORIES = {"llama3": llama3, "qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe}
#: Overrides of the debug flavors: a vocabulary of 512, and small experts (the token mixers stay as they are).
OVERRIDES: dict[str, dict[str, int | float | bool | str | None]] = {
    "llama3": {"vocab_size": 512},
    "qwen3_5": {"vocab_size": 512},
    "qwen3_5_moe": {
        "vocab_size": 512,
        "n_experts": 4,
        "ffn_hidden_dim": 32,
        "shared_expert_hidden_dim": 64,
    },
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """Decoding is many small operations: threads only contend (10x slower on a busy CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(FACTORIES))
def model(request: pytest.FixtureRequest) -> Any:
    spec = FACTORIES[request.param]("debugmodel", overrides=OVERRIDES[request.param])
    torch.manual_seed(0)
    return spec.build_model_fn(spec.args, device="cpu").eval()


def _prompt(length: int = 70) -> list[int]:  # longer than a Gated DeltaNet chunk (64)
    return torch.randint(0, 512, (length,), generator=torch.Generator().manual_seed(1)).tolist()


def test_cached_greedy_decoding_picks_the_tokens_of_full_recomputation(model: Any) -> None:
    cached = generate_ids(model, _prompt(), max_new_tokens=10)
    recomputed = generate_ids(model, _prompt(), max_new_tokens=10, use_cache=False)
    assert cached == recomputed
    assert len(cached) == 10
    moe_layers = getattr(model, "moe_layers", None)
    if callable(moe_layers):  # decoding (no gradients) leaves no routing statistics for the trainer
        assert [layer.stats for layer in moe_layers()] == [None] * len(model.layers)
        model(torch.tensor([_prompt(5)]))
        assert all(layer.stats.tokens == 5 for layer in moe_layers())
        for layer in moe_layers():
            layer.stats = None


def test_a_sequence_fed_in_pieces_gives_the_logits_of_one_forward(model: Any) -> None:
    ids = torch.tensor([_prompt(80)])
    cache = InferenceCache(capacity=40)  # smaller than the sequence: the attention buffers grow
    with torch.no_grad():
        whole = model(ids)
        pieces = [model(ids[:, :30], cache=cache), model(ids[:, 30:31], cache=cache)]
        pieces.append(model(ids[:, 31:], cache=cache))
    assert cache.position == 80
    assert torch.allclose(torch.cat(pieces, dim=1), whole, atol=1e-4, rtol=0)


def test_sampling_repeats_with_its_seed_and_a_tiny_top_p_is_greedy(model: Any) -> None:
    def sample(seed: int, top_p: float = 1.0) -> list[int]:
        return generate_ids(model, _prompt(8), max_new_tokens=8, temperature=1.5, top_p=top_p, seed=seed)

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    assert sample(5, top_p=1e-6) == generate_ids(model, _prompt(8), max_new_tokens=8)


def test_decoding_stops_at_a_stop_id(model: Any) -> None:
    greedy = generate_ids(model, _prompt(8), max_new_tokens=12)
    stopped = generate_ids(model, _prompt(8), max_new_tokens=12, stop_ids={greedy[3]})
    assert stopped == greedy[: greedy.index(greedy[3]) + 1]


def test_new_tokens_see_every_cached_key_and_the_new_ones_up_to_themselves() -> None:
    assert causal_mask(4, 4, torch.device("cpu")) == (None, True)
    assert causal_mask(1, 9, torch.device("cpu")) == (None, False)
    mask, is_causal = causal_mask(2, 5, torch.device("cpu"))
    assert not is_causal
    assert mask is not None
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize(
    ("factory", "flavors"),
    [
        ("llama3", ["debugmodel", "8B", "70B", "405B"]),
        ("qwen3_5", ["debugmodel", "0.8B", "2B", "4B", "9B"]),
        ("qwen3_5_moe", ["debugmodel", "35B-A3B", "122B-A10B", "397B-A17B"]),
    ],
)
def test_a_config_json_reads_back_to_the_model_that_wrote_it(factory: str, flavors: list[str]) -> None:
    from hyper_parallel.models._hf_config import spec_from_hf_config

    for flavor in flavors:
        spec = FACTORIES[factory](flavor)
        written = spec.state_dict_adapter(spec.args).hf_config()
        again = spec_from_hf_config(written, "/weights")
        assert (again.name, again.flavor, again.weights_path) == (spec.name, flavor, "/weights")
        assert again.state_dict_adapter(again.args).hf_config() == written
        assert again.args.ffn_hidden_dim == spec.args.ffn_hidden_dim
        if factory != "llama3":  # every argument back (Llama 3's feed-forward size returns as multiple_of)
            assert again.args == spec.args
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a model this project builds"):
        spec_from_hf_config({"model_type": "gpt2"})
    with pytest.raises(ValueError, match=r"model_type 'llama': missing 'hidden_size'"):
        spec_from_hf_config({"model_type": "llama"})
