"""The ``shapes`` dataset source: captioned images of coloured shapes for vision-language training.

Batches must be reproducible, laid out exactly as the Qwen 3.5 vision-language model reads them (patch
rows as the Qwen image processor writes them, one placeholder per merged vision token, labels that
skip the image), sharded and resumed like the text sources, and a tiny model must learn from them
with gradients reaching the vision tower.
"""

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest, ShapesSource, SyntheticSource, TextDataLoader  # noqa: E402
from hyper_parallel.components.dataloader._images import CELLS, COLOURS, PLACES, SHAPES, ShapeImages  # noqa: E402
from hyper_parallel.components.dataloader._loader import build_loader  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402
from hyper_parallel.config import ConfigError, resolve_root  # noqa: E402
from hyper_parallel.models import qwen3_5  # noqa: E402
from hyper_parallel.models.qwen3_5.images import patchify  # noqa: E402

IMAGE_TOKEN = 259  # the byte tokenizer's ids are 0-258
SEQ_LEN = 49  # bos, 9 image tokens, the longest caption (38 bytes), eos
# Debug flavor with 8-pixel patches (48-pixel images) and two text blocks: quick on a CPU.
OVERRIDES: dict[str, Any] = {
    "image_token_id": IMAGE_TOKEN,
    "text.vocab_size": 512,
    "text.n_layers": 2,
    "text.full_attention_interval": 2,
    "vision.patch_size": 8,
}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """A model this small trains faster on one thread, and far faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spec() -> Any:
    return qwen3_5.create_vl_model_spec("debugmodel", overrides=OVERRIDES)


@pytest.fixture(scope="module")
def tok() -> Any:
    return ByteTokenizer.Config().build()


def loader(
    spec: Any, tok: Any, *, dp_rank: int = 0, dp: int = 1, batch: int = 4, workers: int = 0, **dataset: Any
) -> Any:
    cfg = TextDataLoader.Config(num_workers=workers, pin_memory=False, dataset=ShapesSource(**dataset))
    return cfg.build(
        LoaderRequest(
            tok,
            dp_rank,
            dp,
            seq_len=SEQ_LEN,
            micro_batch_size=batch,
            seed=0,
            vision=spec.args.vision,
            image_token_id=IMAGE_TOKEN,
        ),
    )


def take(batches: Any, n: int) -> list[dict[str, torch.Tensor]]:
    it = iter(batches)
    return [next(it) for _ in range(n)]


def same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


def test_batches_are_reproducible_and_follow_the_seed(spec: Any, tok: Any) -> None:
    assert same(take(loader(spec, tok), 3), take(loader(spec, tok), 3))
    assert not same(take(loader(spec, tok), 3), take(loader(spec, tok, seed=1), 3))


def test_worker_processes_load_the_same_batches(spec: Any, tok: Any) -> None:
    assert same(take(loader(spec, tok, workers=1), 3), take(loader(spec, tok), 3))


def test_batch_layout_matches_what_the_model_reads(spec: Any, tok: Any) -> None:
    vision = spec.args.vision
    batch = next(iter(loader(spec, tok, batch=3)))
    side = CELLS * vision.spatial_merge_size  # patches per image side
    patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (3, SEQ_LEN),
        "labels": (3, SEQ_LEN),
        "pixel_values": (3 * side * side, patch_dim),
        "grid_thw": (3, 3),
    }
    assert batch["grid_thw"].tolist() == [[1, side, side]] * 3
    merged = side * side // vision.spatial_merge_size**2
    captions = set(ShapeImages.captions())
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
        assert ids[: 1 + merged] == [tok.bos_id] + [IMAGE_TOKEN] * merged
        assert ids.count(IMAGE_TOKEN) == merged
        end = ids.index(tok.eos_id)
        assert tok.decode(ids[1 + merged : end]) in captions
        assert ids[end + 1 :] == [tok.pad_id] * (SEQ_LEN - end - 1)
        assert labels == [
            -100 if i == IMAGE_TOKEN or p > end else i for p, i in enumerate(ids)
        ]  # the image and the padding are never predicted


def test_patch_rows_are_laid_out_as_the_qwen_image_processor_lays_them_out() -> None:
    processor = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    image = torch.randn(3, 24, 40, generator=torch.Generator().manual_seed(0))
    expected, h, w = processor.Qwen2VLImageProcessorPil().patchify(image.numpy(), 4, 2, 2)
    assert (h, w) == (6, 10)
    assert torch.equal(patchify(image, 4, 2, 2), torch.from_numpy(expected))


def test_patchify_refuses_an_image_that_is_not_whole_merge_blocks() -> None:
    with pytest.raises(
        ValueError, match=r"image 24x36 is not a whole number of 2x2 blocks of 4-pixel patches"
    ):
        patchify(torch.zeros(3, 24, 36), 4, 2, 2)


def test_each_caption_names_the_colour_shape_and_place_the_image_shows(spec: Any) -> None:
    images = ShapeImages(spec.args.vision, seed=0)
    seen = set()
    for index in range(60):
        caption, image = images.draw(index)
        colour, shape, place = next(
            (c, s, p) for c in COLOURS for s in SHAPES for p in PLACES if caption.endswith(f" {c} {s} {p}")
        )
        seen.update((colour, shape, place))
        rgb = (image + 1) / 2
        ink = (rgb - 0.12).abs().amax(0) > 0.3  # pixels far from the background
        cells = ink.view(CELLS, images.cell, CELLS, images.cell).sum((1, 3)).flatten()
        assert PLACES[int(cells.argmax())] == place, caption
        assert int((cells > 0).sum()) == 1, caption  # one shape, inside its cell
        mean = rgb[:, ink].mean(1)
        assert (mean - torch.tensor(COLOURS[colour])).abs().max() < 0.05, caption
    assert seen == {*COLOURS, *SHAPES, *PLACES}  # every word occurs


def test_the_shapes_differ_in_their_pixels(spec: Any) -> None:
    images = ShapeImages(spec.args.vision, seed=0)
    masks = {}
    for index in range(200):
        caption, image = images.draw(index)
        shape = next(s for s in SHAPES if f" {s} " in caption)
        masks.setdefault(shape, ((image + 1) / 2 - 0.12).abs().amax(0) > 0.3)
    areas = {shape: int(mask.sum()) for shape, mask in masks.items()}
    assert len(set(areas.values())) == len(SHAPES), areas


def test_a_rank_share_and_a_resumed_loader_see_the_same_samples(spec: Any, tok: Any) -> None:
    whole = take(loader(spec, tok, batch=4), 3)
    halves = [take(loader(spec, tok, dp_rank=r, dp=2, batch=2), 3) for r in range(2)]
    for step, batch in enumerate(whole):  # a global batch of 4: the same samples on 1 or 2 ranks
        ranks = [halves[r][step] for r in range(2)]
        ids = torch.cat([b["input_ids"] for b in ranks])
        assert sorted(map(tuple, ids.tolist())) == sorted(map(tuple, batch["input_ids"].tolist()))
        assert sorted(torch.cat([b["pixel_values"] for b in ranks]).sum(1).tolist()) == pytest.approx(
            sorted(batch["pixel_values"].sum(1).tolist())
        )
    first = loader(spec, tok)
    it = iter(first)
    next(it)
    state = first.state_dict()
    resumed = loader(spec, tok)
    resumed.load_state_dict(state)
    assert same(take(resumed, 2), [next(it), next(it)])


def test_one_pass_filler_batches_carry_an_image_but_no_label(spec: Any, tok: Any) -> None:
    loader = build_loader(
        ShapesSource(synthetic_num_samples=3),
        LoaderRequest(
            tok,
            dp_rank=1,
            dp_world_size=2,
            seq_len=SEQ_LEN,
            micro_batch_size=1,
            seed=0,
            vision=spec.args.vision,
            image_token_id=IMAGE_TOKEN,
        ),
        shuffle=False,
        drop_last=False,
        infinite=False,
    )
    batches = list(loader)
    assert len(batches) == 2  # rank 1 owns sample 1 only; the filler keeps it in step with rank 0
    assert batches[1]["pixel_values"].shape == batches[0]["pixel_values"].shape
    assert (batches[1]["labels"] == -100).all()
    assert (batches[0]["labels"] != -100).any()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"vision": None},
            "the shapes source needs a vision-language model: build the data loader with the model's "
            "vision arguments (vision=) and image placeholder id (image_token_id=)",
        ),
        (
            {"image_token_id": None},
            "the shapes source needs a vision-language model: build the data loader with the model's "
            "vision arguments (vision=) and image placeholder id (image_token_id=)",
        ),
        (
            {"image_token_id": ord("a")},
            "the tokenizer encodes or pads the shapes captions with the image token id 97: set the "
            "model's image_token_id to an id the tokenizer never produces",
        ),
        (
            {"image_token_id": 258},
            "the tokenizer encodes or pads the shapes captions with the image token id 258: set the "
            "model's image_token_id to an id the tokenizer never produces",
        ),
        (
            {"seq_len": 10},
            "training.seq_len 10 is too short for the shapes source: an image takes 9 tokens, so seq_len "
            "must be at least 11",
        ),
    ],
)
def test_build_refuses_what_the_shapes_source_cannot_use(
    spec: Any, tok: Any, kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {
        "seq_len": SEQ_LEN,
        "micro_batch_size": 2,
        "seed": 0,
        "vision": spec.args.vision,
        "image_token_id": IMAGE_TOKEN,
        **kwargs,
    }
    cfg = TextDataLoader.Config(num_workers=0, dataset=ShapesSource())
    with pytest.raises(ValueError, match="shapes") as info:
        cfg.build(LoaderRequest(tok, 0, 1, **args))
    assert str(info.value) == message


VL = "hyper_parallel.models.qwen3_5.create_vl_model_spec"
TEXT = "hyper_parallel.components.dataloader.TextDataLoader.Config"


def shapes_doc(**dataset: Any) -> dict[str, Any]:
    return {
        "model": {
            "_target_": VL,
            "flavor": "debugmodel",
            "overrides": {"image_token_id": IMAGE_TOKEN, "text.vocab_size": 512},
        },
        "tokenizer": {"_target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config"},
        "dataloader": {"_target_": TEXT, "shuffle": False, "dataset": {"source": "shapes", **dataset}},
    }


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        (
            {"paths": ["/data"]},
            (
                "dataloader.dataset.paths",
                "must be empty when source is 'shapes' (or set source to 'jsonl' or 'text')",
            ),
        ),
        (
            {"text_field": "caption"},
            (
                "dataloader.dataset.text_field",
                "is only read when source is 'jsonl' (source is 'shapes'); leave it out",
            ),
        ),
        (
            {"pack_sequences": False},
            (
                "dataloader.dataset.pack_sequences",
                "is not read when source is 'shapes' (each sample is one image and its caption, padded to "
                "seq_len); leave it out",
            ),
        ),
    ],
)
def test_the_shapes_source_refuses_fields_it_does_not_read(
    dataset: dict[str, Any], expected: tuple[str, str]
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_root(shapes_doc(**dataset))
    assert [(i.path, i.message) for i in info.value.issues] == [expected]


def test_the_shapes_source_reads_its_sample_count_and_seed() -> None:
    cfg = resolve_root(shapes_doc(synthetic_num_samples=64, seed=3, max_samples=32))  # seed: unshuffled
    assert (cfg.dataloader.dataset.synthetic_num_samples, cfg.dataloader.dataset.seed) == (64, 3)
    assert cfg.model.args.image_token_id == IMAGE_TOKEN


def test_text_sources_ignore_the_vision_arguments(spec: Any, tok: Any) -> None:
    cfg = TextDataLoader.Config(num_workers=0, dataset=SyntheticSource(synthetic_num_samples=8))
    plain = take(cfg.build(LoaderRequest(tok, 0, 1, seq_len=16, micro_batch_size=2, seed=0)), 2)
    with_vision = cfg.build(
        LoaderRequest(
            tok,
            0,
            1,
            seq_len=16,
            micro_batch_size=2,
            seed=0,
            vision=spec.args.vision,
            image_token_id=IMAGE_TOKEN,
        )
    )
    assert same(plain, take(with_vision, 2))


def caption_loss(
    model: Any, batch: dict[str, torch.Tensor], pixel_values: torch.Tensor | None = None
) -> torch.Tensor:
    logits = model(
        batch["input_ids"],
        pixel_values=batch["pixel_values"] if pixel_values is None else pixel_values,
        grid_thw=batch["grid_thw"],
    )
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=-100
    )


def test_the_vision_tower_gets_gradients_from_the_caption_loss(spec: Any, tok: Any) -> None:
    torch.manual_seed(0)
    model = spec.build_model_fn(spec.args, device="cpu")
    batch = next(iter(loader(spec, tok, batch=2)))
    caption_loss(model, batch).backward()  # the model's default image_token_id is the data's
    grads = {name: p.grad for name, p in model.visual.named_parameters()}
    assert len(grads) > 10
    assert [name for name, g in grads.items() if g is None or not g.abs().sum() > 0] == []


def test_a_short_training_run_learns_the_captions(spec: Any, tok: Any) -> None:
    torch.manual_seed(0)
    model = spec.build_model_fn(spec.args, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    batches = iter(loader(spec, tok, batch=4))
    losses = []
    for _ in range(24):
        loss = caption_loss(model, next(batches))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    last = sum(losses[-6:]) / 6
    assert last < 0.15 * losses[0], losses
