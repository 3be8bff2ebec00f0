"""Weights across layouts: ``materialize`` and ``load_pretrained`` give the same full weights on one process,
under FSDP2 and under tensor parallelism; tied embeddings stay tied; clipping and foreach/fused AdamW work."""

from pathlib import Path
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

from hyper_parallel.models import _weights as loading  # noqa: E402
from hyper_parallel.models.spec import ModelSpec  # noqa: E402
from hyper_parallel.trainer.config import ParallelismConfig  # noqa: E402
from tests.support.parallel_models import IMAGE_TOKEN, LAYOUTS, SPECS, WORLD  # noqa: E402
from tests.support.parallel_models import full as _full  # noqa: E402
from tests.support.parallel_models import image_batch as _image_batch  # noqa: E402
from tests.support.processes import Case, SpawnedCases, spawn_each  # noqa: E402

SINGLE = ParallelismConfig(dp_shard=1)
SEED = 7


def _meta(spec: ModelSpec, parallelism: ParallelismConfig, mesh: Any) -> Any:
    model = spec.build_model_fn(spec.args, device="meta")
    return spec.parallelize_fn(model, parallelism, mesh)


def _full_state(model: Any) -> dict[str, Any]:
    return {name: _full(param).detach().clone() for name, param in model.named_parameters()}


def _embeddings(model: Any) -> Any:
    return getattr(model, "language_model", model)


def _batch(spec: ModelSpec) -> tuple[Any, tuple[Any, ...]]:
    if hasattr(spec.args, "text"):
        vision = spec.args.vision
        ids, pixels, grid = _image_batch(
            spec.args.text.vocab_size, vision.in_channels * 2 * vision.patch_size**2
        )
        return ids, (pixels, grid)
    return torch.randint(0, spec.args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3)), ()


def _loss(model: Any, ids: Any, images: tuple[Any, ...]) -> Any:
    logits = model(ids, *images, image_token_id=IMAGE_TOKEN) if images else model(ids)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _train_two_steps(model: Any, spec: ModelSpec) -> list[Any]:
    """Clip the global gradient norm, then one AdamW step with foreach and one with fused kernels."""
    ids, images = _batch(spec)
    norms = []
    for options in ({"foreach": True}, {"fused": True}):
        # eps keeps near-zero gradients from turning rounding noise into full-size steps
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, **options)
        _loss(model, ids, images).backward()
        norms.append(_full(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)).detach())
        optimizer.step()
        optimizer.zero_grad()
    return norms


def _check_weights(rank: int, model_name: str, layout: str, folder: str) -> None:
    from hyper_parallel.parallel.parallel_dims import ParallelDims

    spec = SPECS[model_name]()
    parallelism = LAYOUTS[layout]
    mesh = ParallelDims.from_config(parallelism, WORLD).build_mesh("cpu")

    # 1. Random initialisation is the same whatever the layout.
    expected = _full_state(loading.materialize(_meta(spec, SINGLE, None), spec, device="cpu", seed=SEED))
    model = loading.materialize(_meta(spec, parallelism, mesh), spec, device="cpu", seed=SEED)
    got = _full_state(model)
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name

    # 2. Pretrained weights: only rank 0 reads the files; every layout ends with the same weights.
    reads: list[int] = []
    read = loading.read_safetensors_folder
    loading.read_safetensors_folder = lambda path: reads.append(rank) or read(path)  # type: ignore[assignment]
    try:
        pretrained = attrs.evolve(spec, weights_path=folder)
        reference = loading.load_pretrained(_meta(spec, SINGLE, None), pretrained)
        reads.clear()
        model = loading.load_pretrained(_meta(spec, parallelism, mesh), pretrained)
    finally:
        loading.read_safetensors_folder = read  # type: ignore[assignment]
    assert reads == ([0] if rank == 0 else [])
    got, expected = _full_state(model), _full_state(reference)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    text = _embeddings(model)
    tied = text.args.tie_word_embeddings if hasattr(text.args, "tie_word_embeddings") else False
    assert (text.output.weight is text.tok_embeddings.weight) == tied

    # 3. Clipping and foreach/fused AdamW on every layout, equal to one process; ties survive the steps.
    if layout.startswith("tp"):
        norms, ref_norms = _train_two_steps(model, spec), _train_two_steps(reference, spec)
        torch.testing.assert_close(torch.stack(norms), torch.stack(ref_norms), rtol=1e-5, atol=1e-6)
        got, expected = _full_state(model), _full_state(reference)
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
        if tied:
            torch.testing.assert_close(_full(text.output.weight), _full(text.tok_embeddings.weight))


def _save_hf_folder(spec: ModelSpec, folder: Path) -> None:
    """A Hugging Face style safetensors folder of a random model (lm_head left out when tied, as HF does)."""
    from safetensors.torch import save_file

    torch.manual_seed(11)
    model = spec.build_model_fn(spec.args, device="cpu")
    hf = spec.state_dict_adapter(spec.args).to_hf(model.state_dict())
    text = getattr(spec.args, "text", spec.args)
    if getattr(text, "tie_word_embeddings", False):
        hf.pop("lm_head.weight")
    save_file({k: v.detach().clone().contiguous() for k, v in hf.items()}, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def across_layouts(tmp_path_factory: pytest.TempPathFactory) -> SpawnedCases:
    """Every model x layout check, run one after the other in one spawned group (start-up paid once)."""
    cases: dict[str, Case] = {}
    for model_name in SPECS:
        folder = tmp_path_factory.mktemp(model_name)
        _save_hf_folder(SPECS[model_name](), folder)
        for layout in LAYOUTS:
            cases[f"{model_name}-{layout}"] = (_check_weights, (model_name, layout, str(folder)))
    return spawn_each(cases, nprocs=WORLD)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model_name", list(SPECS))
def test_weights_match_across_layouts(model_name: str, layout: str, across_layouts: SpawnedCases) -> None:
    across_layouts.check(f"{model_name}-{layout}")


@pytest.mark.parametrize("model_name", list(SPECS))
def test_single_process_materialize_and_load(model_name: str, tmp_path: Path) -> None:
    spec = SPECS[model_name]()
    _save_hf_folder(spec, tmp_path)
    pretrained = attrs.evolve(spec, weights_path=str(tmp_path))
    plain = loading.load_pretrained(spec.build_model_fn(spec.args, device="cpu"), pretrained)
    on_meta = loading.load_pretrained(spec.build_model_fn(spec.args, device="meta"), pretrained)
    assert _full_state(plain).keys() == _full_state(on_meta).keys()
    for name, tensor in _full_state(plain).items():
        assert torch.equal(tensor, _full_state(on_meta)[name]), name
    text = _embeddings(on_meta)
    assert (text.output.weight is text.tok_embeddings.weight) == getattr(
        text.args, "tie_word_embeddings", False
    )
    a = loading.materialize(spec.build_model_fn(spec.args, device="meta"), spec, device="cpu", seed=1)
    b = loading.materialize(spec.build_model_fn(spec.args, device="meta"), spec, device="cpu", seed=1)
    c = loading.materialize(spec.build_model_fn(spec.args, device="meta"), spec, device="cpu", seed=2)
    for name, tensor in _full_state(a).items():
        assert torch.equal(tensor, _full_state(b)[name]), name
        if tensor.numel() > 16 and tensor.std() > 0:  # random, not a constant init
            assert not torch.equal(tensor, _full_state(c)[name]), name


def test_materialized_weights_follow_the_model_distributions() -> None:
    """``init_fn`` draws what ``init_weights`` draws: same means and spreads, parameter by parameter."""
    for make in SPECS.values():
        spec = make()
        torch.manual_seed(0)
        native = {k: v.detach() for k, v in spec.build_model_fn(spec.args, device="cpu").named_parameters()}
        materialized = loading.materialize(
            spec.build_model_fn(spec.args, device="meta"), spec, device="cpu", seed=0
        )
        ours = {k: v.detach() for k, v in materialized.named_parameters()}
        assert list(ours) == list(native)
        for name, tensor in native.items():
            if tensor.numel() < 256:  # too few draws to compare statistics (per-head vectors)
                continue
            torch.testing.assert_close(ours[name].std(), tensor.std(), rtol=0.25, atol=1e-3, msg=name)
            spread = 6 * float(tensor.std()) / tensor.numel() ** 0.5 + 1e-6  # of the mean of n draws
            assert abs(float(ours[name].mean()) - float(tensor.mean())) <= spread, name


def test_load_pretrained_without_weights_path() -> None:
    spec = SPECS["llama3"]()
    with pytest.raises(ValueError, match=r"model\.weights_path is not set for llama3 debugmodel"):
        loading.load_pretrained(spec.build_model_fn(spec.args, device="meta"), spec)
    assert not dist.is_initialized()
