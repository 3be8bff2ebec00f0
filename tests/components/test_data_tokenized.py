"""``dataset.source: tokenized``: prepared folders give the jsonl batches, memory-mapped, checked, blended."""

import pickle
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from hyper_parallel.components.dataloader import DatasetConfig, LoaderRequest, TextDataLoader, TokenizedSource  # noqa: E402
from hyper_parallel.components.dataloader._corpus import ConcatSamples  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.components.validator import LossValidator  # noqa: E402
from hyper_parallel.config import ConfigError  # noqa: E402
from tests.support.components import batches_equal, train_tokenizer, write_jsonl  # noqa: E402
from tests.support.prepared import prepare, tokenizer_config  # noqa: E402

SEQ = 6
SMALL_SHARDS = ("--shard-mb", "0.0005")


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Any, Path, Path]:
    """(tokenizer, jsonl corpus, its prepared folder in several shards)."""
    folder = train_tokenizer(tmp_path / "tok")
    data = write_jsonl(tmp_path / "train.jsonl", 45)
    prepared = prepare([data], tmp_path / "prep", tokenizer_config(tmp_path / "cfg", folder), *SMALL_SHARDS)
    return HuggingFaceTokenizer.Config(path=str(folder)).build(), data, prepared


#: Each dataset source class by its ``source:`` value.
SOURCES: dict[Any, Any] = {cls.tag(): cls for cls in DatasetConfig.__variants__}


def loader(
    source: str, paths: tuple[str, ...], tok: Any, *, rank: int = 0, world: int = 1, mbs: int = 2, **kw: Any
) -> Any:
    shuffle = kw.pop("shuffle", True)
    dataset = SOURCES[source](paths=paths, **kw)
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, dataset=dataset, shuffle=shuffle)
    return cfg.build(LoaderRequest(tok, rank, world, seq_len=SEQ, micro_batch_size=mbs, seed=3))


@pytest.mark.parametrize(
    "options",
    [{}, {"document_masking": False}, {"pack_sequences": False}, {"max_samples": 9}],
    ids=["packed", "unmasked", "padded", "capped"],
)
@pytest.mark.parametrize("world", [1, 2])
def test_a_prepared_corpus_gives_exactly_the_batches_of_its_jsonl_source(
    setup: tuple[Any, Path, Path], options: dict[str, Any], world: int
) -> None:
    tok, data, prepared = setup
    for rank in range(world):
        plain = loader("jsonl", (str(data),), tok, rank=rank, world=world, **options)
        mapped = loader("tokenized", (str(prepared),), tok, rank=rank, world=world, **options)
        assert len(plain) == len(mapped)
        count = 3 * len(plain) + 1  # across epoch ends: every epoch reshuffled the same way
        assert batches_equal(list(islice(plain, count)), list(islice(mapped, count)))


def test_the_samples_read_memory_maps_and_hold_no_per_document_lists(setup: tuple[Any, Path, Path]) -> None:
    tok, _, prepared = setup
    samples = loader("tokenized", (str(prepared),), tok).samples
    assert all(isinstance(shard.tokens, np.memmap) for shard in samples.corpus.shards)
    assert all(isinstance(shard.offsets, np.memmap) for shard in samples.corpus.shards)
    assert not any(
        isinstance(v, list) and len(v) > len(samples.corpus.shards) + 1 for v in vars(samples).values()
    )


def test_shards_prepared_with_another_tokenizer_are_refused_naming_both(
    setup: tuple[Any, Path, Path],
) -> None:
    _, _, prepared = setup
    with pytest.raises(ConfigError) as info:
        loader("tokenized", (str(prepared),), ByteTokenizer.Config().build())
    (issue,) = info.value.issues
    assert issue.location == str(prepared / "manifest.json")
    assert issue.message.startswith("prepared with tokenizer ")
    assert "(class HFTokenizer, vocab_size 18," in issue.message
    assert "but the config's tokenizer is " in issue.message
    assert "(class ByteLevelTokenizer, vocab_size 259," in issue.message


@pytest.mark.parametrize("damage", ["truncate", "change"])
def test_a_truncated_or_changed_shard_is_refused_by_name(setup: tuple[Any, Path, Path], damage: str) -> None:
    tok, _, prepared = setup
    victim = prepared / "shard-00001" / "tokens.npy"
    content = victim.read_bytes()
    victim.write_bytes(
        content[:-2] if damage == "truncate" else content[:-2] + bytes([content[-2] ^ 1]) + content[-1:]
    )
    with pytest.raises(ConfigError) as info:
        loader("tokenized", (str(prepared),), tok)
    (issue,) = info.value.issues
    assert issue.location == str(victim)
    expected = (
        f"{len(content) - 2} bytes, the manifest says {len(content)}: truncated or changed"
        if damage == "truncate"
        else "its content differs from the manifest's checksum: changed"
    )
    assert issue.message == expected


def test_an_unfinished_folder_is_refused(setup: tuple[Any, Path, Path]) -> None:
    tok, _, prepared = setup
    (prepared / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="is not a prepared corpus, or its prepare did not finish"):
        loader("tokenized", (str(prepared),), tok)


def mixture(tmp_path: Path, sizes: tuple[int, ...]) -> tuple[Any, tuple[str, ...]]:
    folder = train_tokenizer(tmp_path / "tok")
    config = tokenizer_config(tmp_path / "cfg", folder)
    paths = []
    for i, size in enumerate(sizes):
        data = write_jsonl(tmp_path / f"s{i}.jsonl", size, start=100 * i)
        paths.append(str(prepare([data], tmp_path / f"p{i}", config)))
    return HuggingFaceTokenizer.Config(path=str(folder)).build(), tuple(paths)


def test_a_mixture_blends_sources_by_weight_in_every_window(tmp_path: Path) -> None:
    tok, paths = mixture(tmp_path, (30, 60, 20))
    mixed = loader("tokenized", paths, tok, mbs=1, weights=(0.5, 0.3, 0.2), shuffle=False)
    samples = mixed.samples
    assert isinstance(samples, ConcatSamples)
    sizes = [len(s) for s in samples.sources]
    source_of = [
        np.searchsorted(samples.starts, i, side="right") - 1 for b in mixed.epoch_batches(0) for i in b
    ]
    for window in (10, 37):
        for start in range(0, len(source_of) - window, 7):
            part = source_of[start : start + window]
            for s, w in enumerate((0.5, 0.3, 0.2)):
                assert abs(part.count(s) - w * window) <= 1.0 + 1e-9
    # Each source cycles through its own epochs: the small one is read whole before any sample repeats.
    small = [i for b in mixed.epoch_batches(0) for i in b if i >= samples.starts[2]][: sizes[2]]
    assert sorted(small) == list(range(samples.starts[2], samples.starts[3]))


def test_data_tokens_count_each_source_and_survive_a_resume(tmp_path: Path) -> None:
    tok, paths = mixture(tmp_path, (30, 60))
    mixed = loader("tokenized", paths, tok, world=1, mbs=2, weights=(1, 3))
    list(islice(mixed, 10))
    tokens = mixed.data_tokens()
    assert list(tokens) == list(paths)
    assert sum(tokens.values()) == 10 * 2 * SEQ
    assert tokens == {paths[0]: 5 * SEQ, paths[1]: 15 * SEQ}  # 20 samples at weights 1:3
    again = loader("tokenized", paths, tok, world=1, mbs=2, weights=(1, 3))
    again.load_state_dict(mixed.state_dict())
    assert again.data_tokens() == tokens
    assert batches_equal(list(islice(mixed, 5)), list(islice(again, 5)))


def test_another_data_parallel_size_resumes_the_same_global_batches_of_a_mixture(tmp_path: Path) -> None:
    tok, paths = mixture(tmp_path, (30, 60))
    one = loader("tokenized", paths, tok, mbs=4, weights=(2, 1))
    list(islice(one, 3))
    state = one.state_dict()
    expected = list(islice(one, 4))
    halves = []
    for rank in range(2):
        part = loader("tokenized", paths, tok, rank=rank, world=2, mbs=2, weights=(2, 1))
        part.load_state_dict(state)
        halves.append(list(islice(part, 4)))
    for step, batch in enumerate(expected):
        # The global batch of a step is positions [s * 4, s * 4 + 4): rank r holds positions r, r + 2.
        ids = batch["input_ids"]
        assert torch.equal(ids[0::2], halves[0][step]["input_ids"])
        assert torch.equal(ids[1::2], halves[1][step]["input_ids"])


def test_a_held_out_fraction_never_shares_a_document_with_training(setup: tuple[Any, Path, Path]) -> None:
    tok, _, prepared = setup
    train = loader("tokenized", (str(prepared),), tok, holdout_fraction=0.2, pack_sequences=False)
    held = LossValidator.Config(
        enable=True,
        dataset=TokenizedSource(
            paths=(str(prepared),),
            holdout_fraction=0.2,
            split="holdout",
            pack_sequences=False,
        ),
    ).build_dataloader(LoaderRequest(tok, 0, 1, seq_len=SEQ, micro_batch_size=2, seed=3))
    assert (len(train.samples), len(held.samples)) == (36, 9)
    everything = loader("tokenized", (str(prepared),), tok, pack_sequences=False, shuffle=False)
    docs = [everything.samples[i]["input_ids"].tolist() for i in range(45)]
    assert [train.samples[i]["input_ids"].tolist() for i in range(36)] == docs[:36]
    assert [held.samples[i]["input_ids"].tolist() for i in range(9)] == docs[36:]


def test_a_pickled_corpus_maps_its_files_again_instead_of_copying_them(setup: tuple[Any, Path, Path]) -> None:
    tok, _, prepared = setup
    samples = loader("tokenized", (str(prepared),), tok).samples
    blob = pickle.dumps(samples)
    again = pickle.loads(blob)
    for before, after in zip(samples.corpus.shards, again.corpus.shards, strict=True):
        assert isinstance(after.tokens, np.memmap)
        assert str(after.tokens.filename) == str(before.tokens.filename)  # mapped again (a copy has none)
        assert bytes(before.tokens) not in blob
    assert batches_equal([samples[i] for i in range(len(samples))], [again[i] for i in range(len(again))])


def test_a_mixture_position_is_not_resumed_under_other_weights(tmp_path: Path) -> None:
    tok, paths = mixture(tmp_path, (30, 60))
    saved = loader("tokenized", paths, tok, weights=(1, 3))
    list(islice(saved, 2))
    other = loader("tokenized", paths, tok, weights=(1, 2))
    with pytest.raises(ValueError, match=r"cannot resume the data position: mixture: saved \d+, now \d+"):
        other.load_state_dict(saved.state_dict())
