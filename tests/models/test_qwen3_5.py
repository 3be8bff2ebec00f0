"""Qwen 3.5 runtime: hybrid model build, state-dict adapter parity with transformers, weight loading."""

from pathlib import Path
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("transformers.models.qwen3_5")

from hyper_parallel.models import qwen3_5  # noqa: E402
from hyper_parallel.models.qwen3_5 import Qwen3_5Args  # noqa: E402
from hyper_parallel.models.qwen3_5._runtime import (  # noqa: E402
    Qwen3_5StateDictAdapter,
    Qwen3_5VLStateDictAdapter,
    load_weights,
)
from tests.support.qwen3_5_reference import TINY, build, hf_model, tokens  # noqa: E402

TINY_TIED = attrs.evolve(TINY, tie_word_embeddings=True, full_attention_interval=4)


def test_build_every_flavor_on_meta_with_hybrid_layout() -> None:
    for flavor, args in qwen3_5.QWEN3_5_FLAVORS.items():
        spec = qwen3_5.create_model_spec(flavor)  # type: ignore[arg-type]
        model = spec.build_model_fn(spec.args, device="meta")
        assert all(p.is_meta for p in model.parameters())
        kinds = ["full" if layer.attention is not None else "linear" for layer in model.layers]
        assert kinds == ["full" if k == "full_attention" else "linear" for k in args.layer_types()]
        assert kinds[:4] == ["linear", "linear", "linear", "full"]
        assert (model.output.weight is model.tok_embeddings.weight) == args.tie_word_embeddings


def test_debugmodel_builds_on_cpu_and_trains_a_step() -> None:
    spec = qwen3_5.create_model_spec("debugmodel")
    model = spec.build_model_fn(spec.args, device="cpu")
    ids = tokens(spec.args, seq=16)
    logits = model(ids)
    assert logits.shape == (2, 16, spec.args.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("args", [TINY, TINY_TIED], ids=["untied", "tied"])
def test_from_hf_logits_match_transformers(args: Qwen3_5Args) -> None:
    reference = hf_model(args)
    ours = build(args).eval()
    ours.load_state_dict(Qwen3_5StateDictAdapter(args).from_hf(reference.state_dict()), strict=True)
    ids = tokens(args)
    with torch.no_grad():
        expected = reference(ids).logits
        diff = (ours(ids) - expected).abs().max().item()
    assert expected.abs().max().item() > 0.1  # not a trivially small output
    assert diff < 1e-4


def test_to_hf_logits_match_transformers() -> None:
    ours = build(TINY).eval()
    reference = hf_model(TINY)
    reference.load_state_dict(Qwen3_5StateDictAdapter(TINY).to_hf(ours.state_dict()), strict=True)
    ids = tokens(TINY)
    with torch.no_grad():
        diff = (ours(ids) - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_adapter_round_trip_and_released_layout() -> None:
    adapter = Qwen3_5StateDictAdapter(TINY)
    hf_state = hf_model(TINY).state_dict()
    back = adapter.to_hf(adapter.from_hf(hf_state))
    assert back.keys() == hf_state.keys()
    assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)
    # The released checkpoints nest the text model under model.language_model and carry mtp/visual.
    released = {k.replace("model.", "model.language_model.", 1): v for k, v in hf_state.items()}
    released["mtp.fc.weight"] = torch.zeros(1)
    released["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(1)
    ours = adapter.from_hf(released)
    assert ours.keys() == adapter.from_hf(hf_state).keys()
    with pytest.raises(KeyError, match="unexpected names"):
        adapter.from_hf({"model.layers.0.bogus.weight": torch.zeros(1)})
    wrong = dict(hf_state, **{"model.embed_tokens.weight": torch.zeros(7, TINY.dim)})
    with pytest.raises(ValueError, match="does not match"):
        adapter.from_hf(wrong)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_load_weights_from_save_pretrained(tmp_path: Path, device: str) -> None:
    reference = hf_model(TINY_TIED)
    reference.save_pretrained(tmp_path)
    spec = qwen3_5.create_model_spec("debugmodel", weights_path=str(tmp_path))
    model = spec.build_model_fn(TINY_TIED, device=device)
    load_weights(model, str(spec.weights_path), spec.state_dict_adapter(TINY_TIED, spec.weights_path))
    assert model.output.weight is model.tok_embeddings.weight
    ids = tokens(TINY_TIED)
    with torch.no_grad():
        diff = (model.eval()(ids) - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


VISION = qwen3_5.Qwen3_5VisionArgs(depth=2, hidden_size=32, n_heads=2, intermediate_size=64, patch_size=4)
# head_dim 32 gives 4 rotary frequencies, so time, height and width each get one (M-RoPE); a small
# rope_theta keeps every frequency fast enough for a wrong axis to show in the logits.
TINY_VL = qwen3_5.Qwen3_5VLArgs(text=attrs.evolve(TINY, head_dim=32, rope_theta=10.0), vision=VISION)
IMAGE_TOKEN = 5
# Two samples of 13 tokens: one image of 2x3 merged tokens; two images of 1x2 and 2x2 merged tokens.
GRID_THW = [[1, 4, 6], [1, 2, 4], [1, 4, 4]]
LAYOUT = [
    [("text", 3), ("image", 6), ("text", 4)],
    [("text", 2), ("image", 2), ("text", 3), ("image", 4), ("text", 2)],
]


def hf_vl_model(args: Any) -> Any:
    from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = hf_model(args.text).config.to_dict()
    vision = {
        "depth": args.vision.depth,
        "hidden_size": args.vision.hidden_size,
        "num_heads": args.vision.n_heads,
        "intermediate_size": args.vision.intermediate_size,
        "patch_size": args.vision.patch_size,
        "temporal_patch_size": args.vision.temporal_patch_size,
        "spatial_merge_size": args.vision.spatial_merge_size,
        "in_channels": args.vision.in_channels,
        "out_hidden_size": args.text.dim,
        "num_position_embeddings": 2304,
    }
    config = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "dt_bias", "norm1.weight", "norm2.weight")):
                param.uniform_(-0.5, 0.5) if "language_model" in name else param.uniform_(0.5, 1.5)
            elif name.startswith("model.visual") and name.endswith("bias"):
                param.normal_(0.0, 0.1)
        model.model.visual.pos_embed.weight.normal_()
    return model


def hf_vl_logits(reference: Any, ids: Any, pixels: Any, grid: Any) -> Any:
    """transformers' logits of ``ids`` with the images ``pixels`` (patches) of grids ``grid``."""
    return reference(
        input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=(ids == IMAGE_TOKEN).int()
    ).logits


def vl_inputs(args: Any) -> tuple[Any, Any, Any]:
    generator = torch.Generator().manual_seed(2)
    rows = []
    for layout in LAYOUT:
        row = []
        for kind, count in layout:
            row += (
                [IMAGE_TOKEN] * count
                if kind == "image"
                else torch.randint(10, args.text.vocab_size, (count,), generator=generator).tolist()
            )
        rows.append(row)
    grid = torch.tensor(GRID_THW)
    patch = args.vision.in_channels * args.vision.temporal_patch_size * args.vision.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch, generator=generator)
    return torch.tensor(rows), pixels, grid


def test_vl_model_matches_transformers_both_ways() -> None:
    from hyper_parallel.models.qwen3_5._runtime import build_vl_model

    reference = hf_vl_model(TINY_VL)
    adapter = Qwen3_5VLStateDictAdapter(TINY_VL)
    ours = build_vl_model(TINY_VL, device="cpu").eval()
    ours.load_state_dict(adapter.from_hf(reference.state_dict()), strict=True)
    ids, pixels, grid = vl_inputs(TINY_VL)
    with torch.no_grad():
        expected = hf_vl_logits(reference, ids, pixels, grid)
        got = ours(ids, pixels, grid, image_token_id=IMAGE_TOKEN)
        text_only = ours(ids[:, :3])
        text_expected = reference(input_ids=ids[:, :3]).logits
    assert (got - expected).abs().max().item() < 1e-4
    assert (text_only - text_expected).abs().max().item() < 1e-4
    # Reverse: our random weights into the transformers model.
    fresh = build_vl_model(TINY_VL, device="cpu").eval()
    reference.load_state_dict(adapter.to_hf(fresh.state_dict()), strict=True)
    with torch.no_grad():
        expected = hf_vl_logits(reference, ids, pixels, grid)
        got = fresh(ids, pixels, grid, image_token_id=IMAGE_TOKEN)
    assert (got - expected).abs().max().item() < 1e-4


def test_vl_flavors_build_on_meta_and_load_weights(tmp_path: Path) -> None:
    for flavor in qwen3_5.QWEN3_5_VL_FLAVORS:
        spec = qwen3_5.create_vl_model_spec(flavor)  # type: ignore[arg-type]
        model = spec.build_model_fn(spec.args, device="meta")
        assert len(model.visual.blocks) == spec.args.vision.depth
    reference = hf_vl_model(TINY_VL)
    reference.save_pretrained(tmp_path)
    model = qwen3_5.create_vl_model_spec("debugmodel").build_model_fn(TINY_VL, device="meta")
    load_weights(model, str(tmp_path))
    ids, pixels, grid = vl_inputs(TINY_VL)
    with torch.no_grad():
        expected = hf_vl_logits(reference, ids, pixels, grid)
        diff = (model.eval()(ids, pixels, grid, image_token_id=IMAGE_TOKEN) - expected).abs().max().item()
    assert diff < 1e-4


def test_vl_positions_computed_on_the_host_give_the_same_logits_and_check_the_placeholders() -> None:
    from hyper_parallel.models.qwen3_5._runtime import build_vl_model
    from hyper_parallel.models.qwen3_5._vl import mrope_positions

    model = build_vl_model(attrs.evolve(TINY_VL, image_token_id=IMAGE_TOKEN), device="cpu").eval()
    ids, pixels, grid = vl_inputs(TINY_VL)
    positions = model.host_positions(ids, grid)
    merge = TINY_VL.vision.spatial_merge_size
    assert torch.equal(positions, mrope_positions(ids, ids == IMAGE_TOKEN, grid, merge))
    with torch.no_grad():
        assert torch.equal(model(ids, pixels, grid, positions=positions), model(ids, pixels, grid))
    with pytest.raises(
        ValueError, match=r"^grid_thw lists more images than the samples hold image placeholder"
    ):
        model.host_positions(ids, torch.cat((grid, grid[:1])))
    with pytest.raises(
        ValueError, match=r"^sample 1: image placeholder tokens at 7 but no image left in grid_thw$"
    ):
        model.host_positions(ids, grid[:2])


def test_9b_flavor_matches_the_architecture_defaults_transformers_ships() -> None:
    # transformers' default Qwen 3.5 configs describe the 9B model; the released dims we can check offline.
    text = transformers.Qwen3_5TextConfig()
    ours = qwen3_5.QWEN3_5_FLAVORS["9B"]
    assert (ours.dim, ours.n_layers, ours.ffn_hidden_dim, ours.vocab_size) == (
        text.hidden_size,
        text.num_hidden_layers,
        text.intermediate_size,
        text.vocab_size,
    )
    assert (ours.n_heads, ours.n_kv_heads, ours.head_dim) == (
        text.num_attention_heads,
        text.num_key_value_heads,
        text.head_dim,
    )
    assert (ours.linear_num_key_heads, ours.linear_num_value_heads) == (
        text.linear_num_key_heads,
        text.linear_num_value_heads,
    )
    assert (ours.linear_key_head_dim, ours.linear_value_head_dim, ours.linear_conv_kernel_dim) == (
        text.linear_key_head_dim,
        text.linear_value_head_dim,
        text.linear_conv_kernel_dim,
    )
    assert ours.layer_types() == tuple(text.layer_types)
    vision = transformers.Qwen3_5VisionConfig()
    mine = qwen3_5.QWEN3_5_VL_FLAVORS["9B"].vision
    assert (mine.depth, mine.hidden_size, mine.n_heads, mine.intermediate_size, mine.patch_size) == (
        vision.depth,
        vision.hidden_size,
        vision.num_heads,
        vision.intermediate_size,
        vision.patch_size,
    )


def test_a_saved_transformers_vl_folder_reads_back_as_the_same_model_and_passes_the_weights_check(
    tmp_path: Path,
) -> None:
    """transformers' own ``save_pretrained`` of Qwen 3.5 VL (its ``config.json`` with every default key):
    the config reads back to our arguments, our export writes the same architecture, and the torch-free
    weights check accepts the folder (the weights loaded from it give transformers' logits:
    ``test_vl_flavors_build_on_meta_and_load_weights`` above)."""
    import json

    from hyper_parallel.models import spec_from_hf_config
    from hyper_parallel.models._weights_check import check_weights

    args = attrs.evolve(TINY_VL, image_token_id=IMAGE_TOKEN)
    reference = hf_vl_model(args)
    reference.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    spec = spec_from_hf_config(saved, str(tmp_path))
    assert attrs.asdict(spec.args) == attrs.asdict(args)
    written = Qwen3_5VLStateDictAdapter(args).hf_config()
    assert written["vision_config"] == {
        key: saved["vision_config"][key] for key in written["vision_config"]
    }  # every vision field we write is what transformers wrote
    check_weights(spec)  # config.json and the safetensors headers fit the model
