"""Chat rows are whole conversations: one conversation is one document, never split across rows.

Document ids come from the corpus's offsets (never from EOS tokens inside a document), conversations are
bin-packed whole into padded rows, a conversation longer than ``seq_len`` is refused naming its record
(or dropped or cut when the dataset says so), and ``source: chat`` gives the batches a prepared folder of
the same files gives.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import (  # noqa: E402
    ChatSource,
    LoaderRequest,
    TextDataLoader,
    TokenizedSource,
)
from hyper_parallel.components.dataloader._corpus import PackedSamples, corpus_in_memory  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402
from hyper_parallel.data.chat import builtin_chat  # noqa: E402
from hyper_parallel.data.packing import pack_rows  # noqa: E402
from hyper_parallel.errors import InputFileError  # noqa: E402
from tests.support.chat_data import write_chats  # noqa: E402
from tests.support.document_attention import build  # noqa: E402
from tests.support.prepared import prepare, run_prepare, tokenizer_config  # noqa: E402

ZED = [
    {"role": "user", "content": "My name is Zed"},
    {"role": "assistant", "content": "Hi Zed"},
    {"role": "user", "content": "What is my name?"},
    {"role": "assistant", "content": "Zed"},
]
OTHERS = [
    [{"role": "user", "content": "Spell cloud backwards."}, {"role": "assistant", "content": "duolc"}],
    [{"role": "user", "content": "Two and two?"}, {"role": "assistant", "content": "Four"}],
    [
        {"role": "user", "content": "A colour?"},
        {"role": "assistant", "content": "Blue"},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Green"},
    ],
]
BYTES = ByteTokenizer.Config().build()


def config_with(folder: Path, seq_len: int) -> Path:
    """The byte tokenizer's training config, with ``training.seq_len``."""
    path = tokenizer_config(folder)
    training = "  _target_: hyper_parallel.trainer.config.TrainingConfig\n"
    path.write_text(path.read_text() + f"training:\n{training}  seq_len: {seq_len}\n")
    return path


def batches(dataset: Any, seq_len: int, micro_batch_size: int = 2) -> list[dict[str, Any]]:
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, shuffle=False, dataset=dataset)
    loader = cfg.dataset.loader(
        LoaderRequest(BYTES, 0, 1, seq_len=seq_len, micro_batch_size=micro_batch_size, seed=0),
        shuffle=False,
        drop_last=False,
        infinite=False,
    )
    return list(loader)


# -- the bin packing -------------------------------------------------------------------------------------
def test_log_normal_conversations_fill_at_least_95_percent_of_the_rows() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, 20_000)), 1, 2048).astype(np.int64)
    rows = pack_rows(lengths, 2048)
    assert rows.efficiency(lengths, 2048) >= 0.95
    # Every conversation is in exactly one row, and no row holds more than seq_len tokens.
    assert sorted(rows.documents.tolist()) == list(range(lengths.size))
    filled = np.add.reduceat(lengths[rows.documents], rows.starts[:-1])
    assert int(filled.max()) <= 2048
    # The rows depend on the lengths alone.
    again = pack_rows(lengths.copy(), 2048)
    assert np.array_equal(again.starts, rows.starts)
    assert np.array_equal(again.documents, rows.documents)


def test_best_fit_decreasing_on_small_lengths() -> None:
    rows = pack_rows(np.asarray([3, 6, 2, 5, 4]), 10)
    # Decreasing: 6 -> row 0 (4 left); 5 -> row 1 (5 left); 4 -> row 0 (tightest: 4); 3 -> row 1; 2 -> row 1.
    assert [rows.row(r).tolist() for r in range(len(rows))] == [[1, 4], [0, 2, 3]]


# -- document ids from the offsets -------------------------------------------------------------------------
def test_packed_text_document_ids_come_from_the_offsets_not_from_eos_tokens() -> None:
    eos = 9
    # Document 1 holds an EOS in its middle: it is still one document.
    corpus = corpus_in_memory(iter([[1, 2], [3, eos, 4, 5], [6]]), eos)
    assert corpus.tokens == 3 + 5 + 2
    samples = PackedSamples(corpus, 5, 2, True, -100)
    first, second = samples[0], samples[1]
    assert first["input_ids"].tolist() == [1, 2, eos, 3, eos]
    assert first["document_ids"].tolist() == [0, 0, 0, 1, 1]
    assert second["input_ids"].tolist() == [4, 5, eos, 6, eos]
    assert second["document_ids"].tolist() == [0, 0, 0, 1, 1]  # the window starts inside document 1


# -- one conversation, one document ------------------------------------------------------------------------
def zed_rows(tmp_path: Path, seq_len: int) -> tuple[list[list[int]], list[dict[str, Any]]]:
    """The encoded conversations (Zed first) and the loader's batches of their prepared folder."""
    data = write_chats(tmp_path / "chat.jsonl", [ZED, *OTHERS])
    out = prepare([data], tmp_path / "prep", config_with(tmp_path / "cfg", seq_len), "--format", "chat")
    encoded = [builtin_chat(BYTES, chat)[0] for chat in [ZED, *OTHERS]]
    return encoded, batches(TokenizedSource(paths=(str(out),)), seq_len)


def test_document_ids_change_exactly_where_a_conversation_starts(tmp_path: Path) -> None:
    encoded, loaded = zed_rows(tmp_path, 128)
    assert encoded[0].count(BYTES.eos_id) == 2  # each of Zed's answers ends with EOS
    rows = pack_rows(np.asarray([len(ids) for ids in encoded]), 128)
    ids = torch.cat([batch["input_ids"] for batch in loaded])
    documents = torch.cat([batch["document_ids"] for batch in loaded])
    labels = torch.cat([batch["labels"] for batch in loaded])
    assert ids.shape[0] == len(rows) < len(encoded)  # several conversations share a row
    for r in range(len(rows)):
        docs = rows.row(r).tolist()
        expected_ids = [t for d in docs for t in encoded[d]]
        fill = 128 - len(expected_ids)
        assert ids[r].tolist() == expected_ids + [BYTES.pad_id] * fill
        # One id per conversation, in row order, and one more for the padding: no change at an EOS.
        expected = [n for n, d in enumerate(docs) for _ in encoded[d]] + [len(docs)] * fill
        assert documents[r].tolist() == expected
        assert labels[r, len(expected_ids) :].eq(-100).all()
    zed = next(r for r in range(len(rows)) if 0 in rows.row(r).tolist())
    start = sum(len(encoded[d]) for d in rows.row(zed).tolist()[: rows.row(zed).tolist().index(0)])
    assert documents[zed, start : start + len(encoded[0])].unique().numel() == 1


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_a_conversation_packed_with_others_gives_its_logits_alone(tmp_path: Path, name: str) -> None:
    model = build(name)
    model.eval()
    encoded, loaded = zed_rows(tmp_path, 192)
    ids, documents = loaded[0]["input_ids"][:1], loaded[0]["document_ids"][:1]
    assert ids[0, : len(encoded[0])].tolist() == encoded[0]  # Zed's, then another, then padding
    assert documents.max() == 2
    with torch.no_grad():
        packed = model(ids, document_ids=documents)
        start = 0
        for number in range(int(documents.max())):  # every conversation (the last id is the padding)
            length = int((documents == number).sum())
            alone = model(ids[:, start : start + length])
            assert ids[0, start : start + length].tolist() in encoded
            torch.testing.assert_close(packed[:, start : start + length], alone, rtol=0, atol=1e-5)
            start += length


# -- never split, never cut silently -----------------------------------------------------------------------
def test_prepare_refuses_a_conversation_longer_than_seq_len_at_its_line(tmp_path: Path) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [*OTHERS, ZED])
    config = config_with(tmp_path / "cfg", 80)
    length = len(builtin_chat(BYTES, ZED)[0])
    assert length > 80
    status, out, err = run_prepare(
        "prepare", data, "--format", "chat", "--output", tmp_path / "prep", "--config-file", config
    )
    assert status == 2
    assert err == (
        f"{data}:4: a conversation of {length} tokens, longer than training.seq_len 80 of {config} (1 of 4 "
        "conversations are): give --overlong drop or truncate (and set dataloader.dataset.overlong to the "
        "same), or raise training.seq_len\n"
    )
    # The shards are kept: the same prepare with --overlong drop finishes them and says what it drops.
    status, out, err = run_prepare(
        "prepare", data, "--format", "chat", "--output", tmp_path / "prep", "--config-file", config,
        "--overlong", "drop",
    )  # fmt: skip
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "overlong: 1 of 4 conversations are longer than seq_len 80: dropped when training (overlong: drop)"
    )
    assert lines[1] == (  # (53 + 42 + 77) / (3 * 80): no two of them fit one row
        "packing at seq_len 80: 3 conversations in 3 rows, efficiency 71.7% (real tokens / row tokens; no "
        "conversation split)"
    )


def test_the_loader_refuses_drops_or_cuts_an_overlong_conversation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [*OTHERS, ZED])
    out = prepare(
        [data], tmp_path / "prep", config_with(tmp_path / "cfg", 80), "--format", "chat", "--overlong", "drop"
    )
    length = len(builtin_chat(BYTES, ZED)[0])
    expected = (
        f"{data}:4: a conversation of {length} tokens, longer than training.seq_len 80 (1 of 4 conversations "
        "are): set dataloader.dataset.overlong to 'drop' or 'truncate', or raise training.seq_len"
    )
    for source in (TokenizedSource(paths=(str(out),)), ChatSource(paths=(str(data),))):
        with pytest.raises(InputFileError) as refused:  # --dry-run's check, then the launch's
            source.check_encoded(BYTES, None, 80)
        assert str(refused.value) == expected
        with pytest.raises(InputFileError) as refused:
            batches(source, 80)
        assert str(refused.value) == expected
        with caplog.at_level(logging.WARNING):
            dropped = batches(attrs.evolve(source, overlong="drop"), 80, micro_batch_size=1)
            cut = batches(attrs.evolve(source, overlong="truncate"), 80, micro_batch_size=1)
        rows = [b["input_ids"][0].tolist() for b in dropped]
        assert not any(row[: len(ZED[0]["content"])] == list(ZED[0]["content"].encode()) for row in rows)
        zed = builtin_chat(BYTES, ZED)[0]
        assert any(b["input_ids"][0].tolist() == zed[:80] for b in cut)  # its first 80 tokens, a row alone
        assert (
            "1 of 4 conversations are longer than training.seq_len 80: dropped (overlong: drop)"
            in caplog.text
        )
        assert "cut to their first 80 tokens (overlong: truncate)" in caplog.text
        caplog.clear()


def test_without_packing_one_conversation_per_row_never_cut_silently(tmp_path: Path) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [ZED, *OTHERS])
    source = ChatSource(paths=(str(data),), pack_sequences=False)
    rows = [b["input_ids"][0].tolist() for b in batches(source, 128, micro_batch_size=1)]
    encoded = [builtin_chat(BYTES, chat)[0] for chat in [ZED, *OTHERS]]
    assert rows == [ids + [BYTES.pad_id] * (128 - len(ids)) for ids in encoded]
    with pytest.raises(InputFileError, match=rf"^{data}:1: a conversation of {len(encoded[0])} tokens"):
        batches(source, 80)


# -- source: chat ------------------------------------------------------------------------------------------
def test_the_chat_source_gives_the_batches_of_its_prepared_folder(tmp_path: Path) -> None:
    data = write_chats(tmp_path / "chat.jsonl", [ZED, *OTHERS] * 3)
    out = prepare([data], tmp_path / "prep", config_with(tmp_path / "cfg", 96), "--format", "chat")
    prepared = batches(TokenizedSource(paths=(str(out),)), 96)
    direct = batches(ChatSource(paths=(str(data),)), 96)
    assert len(prepared) == len(direct) > 1
    for a, b in zip(prepared, direct, strict=True):
        assert a.keys() == b.keys() == {"input_ids", "labels", "document_ids"}
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_the_chat_source_refuses_records_without_a_label_and_drops_them_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    no_answer = [{"role": "user", "content": "Anyone there?"}]
    data = write_chats(tmp_path / "chat.jsonl", [ZED, no_answer, OTHERS[0], no_answer])
    with pytest.raises(InputFileError) as refused:
        batches(ChatSource(paths=(str(data),)), 96)
    assert str(refused.value) == (
        f"{data}:2: no token carries a label (no turn of a role train_on names: assistant); 2 record(s) in "
        f"all carry none ({data}:2, {data}:4): fix them, or leave them out with "
        "dataloader.dataset.drop_unlabeled: true"
    )
    with caplog.at_level(logging.WARNING):
        kept = batches(ChatSource(paths=(str(data),), drop_unlabeled=True), 96, micro_batch_size=4)
    assert "2 chat record(s) without a label left out (drop_unlabeled)" in caplog.text
    rows = [row[row != BYTES.pad_id].tolist() for batch in kept for row in batch["input_ids"]]
    expected = sorted((builtin_chat(BYTES, chat)[0] for chat in (ZED, OTHERS[0])), key=len, reverse=True)
    assert sorted(rows, key=len, reverse=True) == expected
    # train_on user labels the user turn, so the record trains and nothing is refused
    user = batches(ChatSource(paths=(str(data),), train_on=("user", "assistant")), 96, micro_batch_size=4)
    assert sum(int((batch["labels"] != -100).sum()) for batch in user) > 0


def test_a_bad_chat_file_is_located_before_anything_is_built(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "hello"}\n')
    with pytest.raises(InputFileError) as refused:
        ChatSource(paths=(str(bad),)).check_files()
    assert str(refused.value) == f"{bad}:1: no 'messages' list"


def test_document_ids_of_windows_across_shards_and_a_held_out_split() -> None:
    from hyper_parallel.components.dataloader._corpus import Corpus
    from hyper_parallel.data.shards import ShardArrays

    rng = np.random.default_rng(3)
    shards, every = [], []
    for _ in range(3):
        lengths = rng.integers(1, 9, size=7)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        shards.append(ShardArrays(rng.integers(0, 50, int(offsets[-1])), offsets, np.zeros(7, np.uint8)))
        every.extend(lengths.tolist())
    corpus = Corpus(shards, first=2, documents=17)
    selected = every[2:19]
    owner = np.repeat(np.arange(len(selected)), selected)  # each token's document, from the lengths
    samples = PackedSamples(corpus, 6, corpus.tokens // 6, True, -100)
    for index in range(len(samples)):
        window = owner[index * 6 : (index + 1) * 6]
        expected = np.cumsum(np.concatenate([[0], window[1:] != window[:-1]]))
        assert samples[index]["document_ids"].tolist() == expected.tolist()
