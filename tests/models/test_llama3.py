"""Llama 3 runtime: build, state-dict adapter parity with transformers, weight loading (CPU, fp32)."""

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from hyper_parallel.models import llama3  # noqa: E402
from hyper_parallel.models.llama3 import Llama3Args  # noqa: E402
from hyper_parallel.models.llama3._runtime import Llama3StateDictAdapter, load_weights  # noqa: E402
from tests.support.llama3_reference import TINY, hf_model, tokens  # noqa: E402


def test_build_every_flavor_on_meta() -> None:
    for flavor, args in llama3.LLAMA3_FLAVORS.items():
        spec = llama3.create_model_spec(flavor)  # type: ignore[arg-type]
        model = spec.build_model_fn(spec.args, device="meta")
        assert isinstance(model, torch.nn.Module)
        assert all(p.is_meta for p in model.parameters())
        assert len(model.layers) == args.n_layers
        assert model.layers["0"].feed_forward.w1.weight.shape == (args.ffn_hidden_dim, args.dim)


def test_debugmodel_builds_on_cpu_and_trains_a_step() -> None:
    spec = llama3.create_model_spec("debugmodel")
    model = spec.build_model_fn(spec.args, device="cpu")
    assert all(torch.isfinite(p).all() for p in model.parameters())
    ids = tokens(spec.args, seq=32)
    logits = model(ids)
    assert logits.shape == (2, 32, spec.args.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_meta_build_then_to_empty_and_init() -> None:
    model = llama3.create_model_spec("debugmodel").build_model_fn(TINY, device="meta")
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.isfinite(model(tokens(TINY))).all()


def test_rope_frequencies_match_transformers() -> None:
    from hyper_parallel.models.llama3._modules import rope_inverse_frequencies

    reference = hf_model(TINY).model.rotary_emb.inv_freq
    ours = rope_inverse_frequencies(TINY.dim // TINY.n_heads, TINY.rope_theta, TINY.rope_scaling)
    assert torch.allclose(ours, reference, rtol=1e-6, atol=0)
    plain = rope_inverse_frequencies(16, TINY.rope_theta, None)
    assert not torch.allclose(ours, plain)  # the scaling did change some bands


@pytest.mark.parametrize(
    "args", [TINY, Llama3Args(dim=64, n_layers=1, n_heads=4, vocab_size=96, multiple_of=16)]
)
def test_from_hf_logits_match_transformers(args: Llama3Args) -> None:
    reference = hf_model(args)
    ours = llama3.create_model_spec("debugmodel").build_model_fn(args, device="cpu").eval()
    ours.load_state_dict(Llama3StateDictAdapter(args).from_hf(reference.state_dict()), strict=True)
    ids = tokens(args)
    with torch.no_grad():
        diff = (ours(ids) - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_to_hf_logits_match_transformers() -> None:
    ours = llama3.create_model_spec("debugmodel").build_model_fn(TINY, device="cpu").eval()
    reference = hf_model(TINY)
    converted = Llama3StateDictAdapter(TINY).to_hf(ours.state_dict())
    reference.load_state_dict(converted, strict=True)
    ids = tokens(TINY)
    with torch.no_grad():
        diff = (ours(ids) - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_adapter_round_trip_is_exact_and_strict() -> None:
    adapter = Llama3StateDictAdapter(TINY)
    hf_state = hf_model(TINY).state_dict()
    back = adapter.to_hf(adapter.from_hf(hf_state))
    assert back.keys() == hf_state.keys()
    assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)
    with pytest.raises(KeyError, match="unexpected names"):
        adapter.from_hf({"model.layers.0.self_attn.rotary.weight": hf_state["model.norm.weight"]})
    with pytest.raises(KeyError, match="unexpected names"):
        adapter.to_hf({"bogus": hf_state["model.norm.weight"]})


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_load_weights_from_save_pretrained(tmp_path: Path, device: str) -> None:
    reference = hf_model(TINY)
    reference.save_pretrained(tmp_path, safe_serialization=True)
    assert list(tmp_path.glob("*.safetensors"))
    spec = llama3.create_model_spec("debugmodel", weights_path=str(tmp_path))
    model = spec.build_model_fn(TINY, device=device)
    load_weights(model, spec.weights_path, spec.state_dict_adapter(TINY, spec.weights_path))
    assert not any(p.is_meta for p in model.parameters())
    ids = tokens(TINY)
    with torch.no_grad():
        diff = (model.eval()(ids) - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_load_weights_errors(tmp_path: Path) -> None:
    model = llama3.create_model_spec("debugmodel").build_model_fn(TINY, device="meta")
    with pytest.raises(ValueError, match=r"missing: model\.weights_path is not a folder"):
        load_weights(model, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_weights(model, str(tmp_path))


def _tied_hf_folder(folder: Path) -> tuple[Llama3Args, Path]:
    """A random ``LlamaForCausalLM`` with ``tie_word_embeddings: true`` saved as Llama 3.2 is."""
    import attrs

    args = attrs.evolve(TINY, tie_word_embeddings=True)
    config = transformers.LlamaConfig(**Llama3StateDictAdapter(args).hf_config())
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return args, folder


def test_a_tied_llama_3_2_checkpoint_loads_tied_with_the_logits_of_transformers(tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file

    from hyper_parallel.models import read_safetensors_folder

    args, folder = _tied_hf_folder(tmp_path / "hf")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))  # stored once
    read = Llama3StateDictAdapter.args_from_hf_config(saved)
    assert (read.tie_word_embeddings, read.ffn_hidden_dim) == (True, args.ffn_hidden_dim)
    ours = llama3.create_model_spec("debugmodel").build_model_fn(args, device="cpu").eval()
    assert ours.output.weight is ours.tok_embeddings.weight
    weights = Llama3StateDictAdapter(args).from_hf(read_safetensors_folder(folder))
    ours.load_state_dict(weights, strict=True)
    assert ours.output.weight is ours.tok_embeddings.weight
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokens(args)
    with torch.no_grad():
        assert float((ours(ids) - reference(ids).logits).abs().max()) <= 1e-5


def test_the_llama_3_2_flavors_are_tied_and_counted_once() -> None:
    from hyper_parallel.models.llama3.args import LLAMA3_FLAVORS

    def total(args: Llama3Args) -> int:
        return sum(g.copies * math.prod(g.shape) for g in args.preflight().parameters())

    one, three = LLAMA3_FLAVORS["1B"], LLAMA3_FLAVORS["3B"]
    assert one.tie_word_embeddings
    assert three.tie_word_embeddings
    assert (one.ffn_hidden_dim, three.ffn_hidden_dim) == (8192, 8192)
    assert total(one) == 1_235_814_400  # Llama 3.2 1B's published count: the shared matrix once
    assert total(three) == 3_212_749_824


def test_tied_llama_refuses_pipeline_stages_and_trains_otherwise() -> None:
    from hyper_parallel.config import ConfigError
    from tests.support.trainer import tiny_config

    with pytest.raises(ConfigError) as caught:
        tiny_config("llama3", {"model.overrides.tie_word_embeddings": "true", "parallelism.pp": "2"})
    assert [i.message for i in caught.value.issues if i.path == "parallelism.pp"] == [
        "pipeline parallelism is not supported yet with tie_word_embeddings (the embeddings on the first "
        "stage are the output projection of the last); set parallelism.pp to 1"
    ]
