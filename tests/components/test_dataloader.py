"""DataLoader.Config.build(LoaderRequest(tokenizer, dp_rank, dp_world_size, ...)): packing, sharding, resume.

Also shuffling and the validation loader's dealing.
"""

import re
from itertools import islice
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.dataloader import (  # noqa: E402
    DataLoader,
    JsonlSource,
    LoaderRequest,
    SyntheticSource,
    TextDataLoader,
    TextSource,
)
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.components.validator import LossValidator  # noqa: E402
from tests.support.components import batches_equal, document, train_tokenizer, write_jsonl  # noqa: E402

SEQ = 6


@pytest.fixture
def tok(tmp_path: Path) -> Any:
    return HuggingFaceTokenizer.Config(path=str(train_tokenizer(tmp_path / "tok"))).build()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", 40)


def loader_cfg(path: Path, **kw: Any) -> TextDataLoader.Config:
    dataset = JsonlSource(paths=(str(path),), **kw.pop("dataset", {}))
    return TextDataLoader.Config(num_workers=kw.pop("num_workers", 0), dataset=dataset, **kw)


def build(
    cfg: TextDataLoader.Config, tok: Any, rank: int = 0, world: int = 1, mbs: int = 2, seed: int = 7
) -> Any:
    return cfg.build(LoaderRequest(tok, rank, world, seq_len=SEQ, micro_batch_size=mbs, seed=seed))


def stream(tok: Any, count: int) -> list[int]:
    return [t for i in range(count) for t in tok.encode(document(i))]


def test_packed_batches_are_the_document_stream_cut_into_windows(tok: Any, corpus: Path) -> None:
    loader = build(loader_cfg(corpus, shuffle=False), tok)
    expected = stream(tok, 40)
    assert all(tok.encode(document(i))[-1] == tok.eos_id for i in range(40))
    n = len(expected) // SEQ
    assert len(loader) == n // 2
    got = list(islice(loader, len(loader)))
    for batch in got:
        assert batch["input_ids"].shape == (2, SEQ)
        assert batch["input_ids"].dtype == torch.int64
        assert torch.equal(batch["labels"], batch["input_ids"])
    flat = torch.cat([b["input_ids"].reshape(-1) for b in got]).tolist()
    assert flat == expected[: len(flat)]
    assert len(flat) == (n // 2) * 2 * SEQ


def test_text_source_reads_directories_one_document_per_file(tok: Any, tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    for i in range(6):
        (folder / ("sub" if i % 2 else "") / f"{i:02d}.txt").write_text(document(i))
    (folder / "notes.md").write_text("ignored")
    cfg = TextDataLoader.Config(num_workers=0, shuffle=False, dataset=TextSource(paths=(str(folder),)))
    order = [0, 2, 4, 1, 3, 5]  # sorted paths: 00.txt, 02.txt, 04.txt, sub/01.txt ...
    expected = [t for i in order for t in tok.encode(document(i))]
    got = list(islice(build(cfg, tok, mbs=1), len(expected) // SEQ))
    assert torch.cat([b["input_ids"].reshape(-1) for b in got]).tolist() == expected[: len(got) * SEQ]


def test_unpacked_documents_are_padded_with_ignored_labels(tok: Any, corpus: Path) -> None:
    cfg = loader_cfg(corpus, shuffle=False, dataset={"pack_sequences": False})
    first = next(
        iter(
            cfg.build(
                LoaderRequest(
                    tok,
                    0,
                    1,
                    seq_len=SEQ,
                    micro_batch_size=3,
                    seed=0,
                    ignore_index=-7,
                )
            )
        )
    )
    for i in range(3):
        ids = tok.encode(document(i))[:SEQ]
        row = first["input_ids"][i].tolist()
        assert row == ids + [tok.pad_id] * (SEQ - len(ids))
        assert first["labels"][i].tolist() == ids + [-7] * (SEQ - len(ids))


def test_ranks_get_disjoint_equal_shares_of_every_sample(tok: Any, corpus: Path) -> None:
    cfg = loader_cfg(corpus)
    whole = build(cfg, tok, mbs=1)  # one rank: every sample of the epoch, in the shuffled order
    n = len(whole)
    assert n == len(whole.samples)
    every = [b["input_ids"][0].tolist() for b in islice(whole, n)]
    share = n // 3
    loaders = [build(cfg, tok, rank=r, world=3, mbs=1) for r in range(3)]
    assert [len(lo) for lo in loaders] == [share] * 3
    for r, lo in enumerate(loaders):
        got = [b["input_ids"][0].tolist() for b in islice(lo, share)]
        # Round-robin over the common epoch order: rank r gets positions r, r + 3, r + 6, ...
        assert got == every[r : share * 3 : 3]
    idx = [i for lo in loaders for batch in lo.epoch_batches(0) for i in batch]
    assert len(idx) == len(set(idx)) == share * 3  # disjoint


def test_shuffle_is_seeded_and_changes_every_epoch(tok: Any, corpus: Path) -> None:
    cfg = loader_cfg(corpus)
    a, b, c = build(cfg, tok, seed=1), build(cfg, tok, seed=1), build(cfg, tok, seed=2)
    assert a.epoch_batches(0) == b.epoch_batches(0)
    assert a.epoch_batches(0) != c.epoch_batches(0)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    n = len(a.samples)
    used = [i for batch in a.epoch_batches(0) for i in batch]
    assert len(used) == len(set(used)) == 2 * len(a) == n - n % 2  # odd n: one sample waits an epoch
    assert set(used) <= set(range(n))
    fixed = build(loader_cfg(corpus, dataset={"seed": 5}), tok, seed=1)
    assert fixed.epoch_batches(0) == build(cfg, tok, seed=5).epoch_batches(0)
    unshuffled = build(loader_cfg(corpus, shuffle=False), tok)
    assert unshuffled.epoch_batches(0)[:2] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("workers", [0, 1])
def test_resume_sees_exactly_the_remaining_batches(tok: Any, corpus: Path, workers: int) -> None:
    cfg = loader_cfg(corpus, num_workers=workers)
    reference = build(cfg, tok, rank=1, world=2)
    per_epoch = len(reference)
    expected = list(islice(reference, per_epoch * 2 + 3))  # into the third epoch
    for cut in (3, per_epoch, per_epoch + 1):
        first = build(cfg, tok, rank=1, world=2)
        head = list(islice(first, cut))  # workers may have prefetched further: not counted
        state = first.state_dict()
        assert (state["epoch"], state["batch_index"]) == divmod(cut, per_epoch)
        resumed = build(cfg, tok, rank=1, world=2)
        resumed.load_state_dict(state)
        tail = list(islice(resumed, len(expected) - cut))
        assert batches_equal(head + tail, expected)


PERSISTENT = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 2}


@pytest.mark.parametrize("workers", [{}, pytest.param(PERSISTENT, marks=pytest.mark.multiprocess)])
def test_position_survives_a_new_iterator(tok: Any, corpus: Path, workers: dict[str, Any]) -> None:
    loader = build(loader_cfg(corpus, **workers), tok)
    expected = list(islice(build(loader_cfg(corpus), tok), 2 * len(loader) + 3))
    got = list(islice(loader, 2)) + list(islice(loader, 3)) + list(islice(loader, len(expected) - 5))
    assert batches_equal(got, expected)
    assert loader.state_dict()["epoch"] == 2


def _rows(batches: list[Any]) -> list[tuple[int, ...]]:
    return sorted(tuple(row) for batch in batches for row in batch["input_ids"].tolist())


@pytest.mark.parametrize(("world", "mbs"), [(1, 2), (1, 4), (4, 1)])
def test_a_position_saved_on_two_ranks_resumes_on_another_layout(
    tok: Any, corpus: Path, world: int, mbs: int
) -> None:
    # 12 samples, a global batch of 4: every layout consumes all 12 per epoch; steps cross epoch ends.
    cfg = loader_cfg(corpus, dataset={"max_samples": 12})
    saved = [build(cfg, tok, rank=r, world=2, mbs=2) for r in range(2)]
    for loader in saved:
        list(islice(loader, 4))  # four steps of one micro-batch each: into the second epoch
    states = [loader.state_dict() for loader in saved]
    assert states[0]["epoch"] == 1
    expected = [_rows([next(iter(loader)) for loader in saved]) for _ in range(5)]
    for state in states:  # either rank's position holds the global one
        resumed = [build(cfg, tok, rank=r, world=world, mbs=mbs) for r in range(world)]
        for loader in resumed:
            loader.load_state_dict(state)
        per_step = 4 // (world * mbs)
        iters = [iter(loader) for loader in resumed]
        got = [_rows([next(it) for it in iters for _ in range(per_step)]) for _ in range(5)]
        assert got == expected


@pytest.mark.parametrize(
    ("samples", "saved_batches", "mbs", "message"),
    [
        (
            9,
            0,
            3,
            "cannot resume the data position saved with 2 data-parallel rank(s) x micro-batch 2 on 1 x 3: "
            "an epoch of 9 samples is cut to 8 samples by the saved layout and to 9 by this one, so the "
            "batches after this epoch would differ; resume with the saved layout, or train on a number of "
            "samples that training.global_batch_size divides",
        ),
        (
            12,
            1,
            3,
            "cannot resume the data position saved with 2 data-parallel rank(s) x micro-batch 2 on 1 x 3: "
            "4 samples of the epoch are consumed, not a whole number of this layout's 3-sample rounds",
        ),
    ],
)
def test_a_position_another_layout_cannot_continue_is_refused(
    tok: Any, corpus: Path, samples: int, saved_batches: int, mbs: int, message: str
) -> None:
    cfg = loader_cfg(corpus, dataset={"max_samples": samples})
    saved = build(cfg, tok, world=2)
    list(islice(saved, saved_batches))
    with pytest.raises(ValueError, match="cannot resume the data position") as error:
        build(cfg, tok, world=1, mbs=mbs).load_state_dict(saved.state_dict())
    assert str(error.value) == message


def test_a_position_of_other_data_is_refused(tok: Any, corpus: Path) -> None:
    state = build(loader_cfg(corpus, dataset={"max_samples": 12}), tok, world=2).state_dict()
    with pytest.raises(ValueError, match="cannot resume the data position: num_samples: saved 12, now 8"):
        build(loader_cfg(corpus, dataset={"max_samples": 8}), tok).load_state_dict(state)


def test_max_samples_and_drop_last(tok: Any, corpus: Path) -> None:
    capped = build(loader_cfg(corpus, shuffle=False, dataset={"max_samples": 5}), tok)
    assert len(capped) == 2  # 5 samples, batches of 2, short one dropped
    kept = build(loader_cfg(corpus, shuffle=False, drop_last=False, dataset={"max_samples": 5}), tok)
    batches = list(islice(kept, 3))
    assert [b["input_ids"].shape[0] for b in batches] == [2, 2, 1]
    assert batches[2]["input_ids"][0].tolist() == stream(tok, 40)[4 * SEQ : 5 * SEQ]


def test_synthetic_source(tok: Any) -> None:
    cfg = TextDataLoader.Config(num_workers=0, dataset=SyntheticSource(synthetic_num_samples=12))
    a = list(islice(build(cfg, tok, mbs=4, seed=3), 3))
    b = list(islice(build(cfg, tok, mbs=4, seed=3), 3))
    assert batches_equal(a, b)
    ids = torch.cat([x["input_ids"] for x in a])
    assert ids.shape == (12, SEQ)
    assert int(ids.min()) >= 0
    assert int(ids.max()) < tok.vocab_size
    assert len({tuple(r) for r in ids.tolist()}) == 12
    c = list(islice(build(cfg, tok, mbs=4, seed=4), 1))
    assert not torch.equal(c[0]["input_ids"], a[0]["input_ids"])


def test_errors(tok: Any, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too few for one batch"):
        build(loader_cfg(corpus, dataset={"max_samples": 3}), tok, world=2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "dog"}\n{"body": "cat"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no string field 'text'"):
        build(loader_cfg(bad), tok)
    with pytest.raises(ValueError, match=r"missing\.jsonl: dataset path is neither a file nor a directory"):
        build(loader_cfg(tmp_path / "missing.jsonl"), tok)


def test_base_config_names_the_class(tok: Any) -> None:
    with pytest.raises(NotImplementedError, match=r"DataLoader\.Config"):
        DataLoader.Config(num_workers=0).build(
            LoaderRequest(
                tok,
                0,
                1,
                seq_len=4,
                micro_batch_size=1,
                seed=0,
            )
        )


# One pass (validation): every sample once, equal batch counts on every rank.


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_one_pass_deals_every_sample_and_evens_the_batch_counts(tok: Any, corpus: Path, world: int) -> None:
    cfg = LossValidator.Config(dataset=JsonlSource(paths=(str(corpus),)))
    loaders = [
        cfg.build_dataloader(
            LoaderRequest(
                tok,
                r,
                world,
                seq_len=SEQ,
                micro_batch_size=2,
                seed=0,
                ignore_index=-5,
            )
        )
        for r in range(world)
    ]
    n = len(loaders[0].samples)
    assert n % 2 == 1  # an odd count: shares and last batches differ between ranks
    assert len({len(lo) for lo in loaders}) == 1
    seen: list[list[int]] = []
    for r, lo in enumerate(loaders):
        batches = list(lo)
        assert len(batches) == len(lo)
        for batch in batches:
            for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
                if labels == [-5] * SEQ:  # filler: a real window whose every label is ignored
                    assert ids == loaders[0].samples[0]["input_ids"].tolist()
                else:
                    assert labels == ids
                    seen.append(ids)
        assert [i for b in lo.epoch_batches(0) for i in b if i >= 0] == list(range(r, n, world))
    whole = [loaders[0].samples[i]["input_ids"].tolist() for i in range(n)]
    assert sorted(seen) == sorted(whole)


@pytest.mark.parametrize(("steps", "mbs", "expected"), [(-1, 2, None), (3, 2, 6), (2, 3, 6), (1000, 2, None)])
def test_validator_steps_fix_the_set_in_samples(
    tok: Any, corpus: Path, steps: int, mbs: int, expected: int | None
) -> None:
    cfg = LossValidator.Config(steps=steps, dataset=JsonlSource(paths=(str(corpus),)))
    whole = len(build(loader_cfg(corpus), tok).samples)
    for world in (1, 2):
        loader = cfg.build_dataloader(LoaderRequest(tok, 0, world, seq_len=SEQ, micro_batch_size=mbs, seed=0))
        assert len(loader.samples) == (whole if expected is None else expected)


# Fields of the Config classes that change what the runtime does.


def test_unpacked_samples_are_padded_on_the_tokenizers_padding_side(tmp_path: Path, corpus: Path) -> None:
    folder = train_tokenizer(tmp_path / "left")
    left = HuggingFaceTokenizer.Config(path=str(folder), padding_side="left").build()
    cfg = loader_cfg(corpus, shuffle=False, dataset={"pack_sequences": False})
    first = next(
        iter(
            cfg.build(
                LoaderRequest(
                    left,
                    0,
                    1,
                    seq_len=SEQ,
                    micro_batch_size=1,
                    seed=0,
                    ignore_index=-7,
                )
            )
        )
    )
    ids = left.encode(document(0))
    assert len(ids) < SEQ
    fill = SEQ - len(ids)
    assert first["input_ids"][0].tolist() == [left.pad_id] * fill + ids
    assert first["labels"][0].tolist() == [-7] * fill + ids


def test_seq_len_longer_than_model_max_length_is_refused(tmp_path: Path, corpus: Path) -> None:
    folder = train_tokenizer(tmp_path / "short")
    short = HuggingFaceTokenizer.Config(path=str(folder), model_max_length=SEQ - 1).build()
    message = (
        "training.seq_len 6 exceeds the tokenizer's model_max_length 5; raise tokenizer.model_max_length"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        build(loader_cfg(corpus), short)
    exact = HuggingFaceTokenizer.Config(path=str(folder), model_max_length=SEQ).build()
    assert len(build(loader_cfg(corpus), exact)) > 0


@pytest.mark.parametrize("accelerator", [False, True])
def test_worker_and_memory_options_reach_the_torch_loader(
    tok: Any, corpus: Path, accelerator: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: accelerator)
    loader = build(loader_cfg(corpus, pin_memory=True, **PERSISTENT), tok)._torch_loader
    assert loader.pin_memory is accelerator  # pinning only helps copies to an accelerator
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 2, True)
    plain = build(loader_cfg(corpus, pin_memory=False), tok)._torch_loader
    assert (plain.pin_memory, plain.num_workers, plain.prefetch_factor, plain.persistent_workers) == (
        False,
        0,
        None,
        False,
    )
