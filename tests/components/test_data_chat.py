"""Chat records: rendered with the tokenizer's template, trained on the assistant turns only."""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from hyper_parallel.components.dataloader import LoaderRequest, TextDataLoader, TokenizedSource  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer, HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.data import shards  # noqa: E402
from hyper_parallel.data.chat import builtin_chat  # noqa: E402
from hyper_parallel.data.packing import pack_rows  # noqa: E402
from tests.support.chat_data import (  # noqa: E402
    CHATS,
    QWEN_STYLE,
    documents,
    qwen_style_tokenizer,
    write_chats,
)
from tests.support.prepared import folder_bytes, prepare, run_prepare, tokenizer_config  # noqa: E402


def test_ids_and_assistant_mask_are_those_of_transformers_apply_chat_template(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = qwen_style_tokenizer(tmp_path / "tok")
    out = prepare(
        [write_chats(tmp_path / "chat.jsonl", CHATS)],
        tmp_path / "prep",
        tokenizer_config(tmp_path / "cfg", folder),
        "--format",
        "chat",
    )
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    expected = []
    for chat in CHATS:
        encoded = reference.apply_chat_template(
            chat, chat_template=QWEN_STYLE, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        expected.append((list(encoded["input_ids"]), list(encoded["assistant_masks"])))
    assert documents(out) == expected
    assert all(sum(mask) > 0 for _, mask in expected)
    # Packing appends the EOS the rendered text lacks (it ends with a newline), not trained on.
    (arrays,) = shards.open_prepared(out).shards
    assert arrays.appended.tolist() == [1, 1]
    assert shards.open_prepared(out).manifest["chat"] is True


def test_the_builtin_template_of_a_tokenizer_without_one(tmp_path: Path) -> None:
    tok = ByteTokenizer.Config().build()
    ids, mask = builtin_chat(tok, CHATS[0][1:])
    head = [256, *b"<|user|>\nWhat is two plus two?\n", *b"<|assistant|>\n"]
    assert ids == [*head, *b"Four.", 257]
    assert mask == [0] * len(head) + [1] * 6
    out = prepare(
        [write_chats(tmp_path / "chat.jsonl", [CHATS[0][1:]])],
        tmp_path / "prep",
        tokenizer_config(tmp_path / "cfg"),
        "--format",
        "chat",
    )
    assert documents(out) == [(ids, mask)]


@pytest.mark.parametrize("pack", [True, False])
def test_only_assistant_tokens_carry_labels(tmp_path: Path, pack: bool) -> None:
    folder = qwen_style_tokenizer(tmp_path / "tok")
    out = prepare(
        [write_chats(tmp_path / "chat.jsonl", CHATS * 8)],
        tmp_path / "prep",
        tokenizer_config(tmp_path / "cfg", folder),
        "--format",
        "chat",
    )
    tok = HuggingFaceTokenizer.Config(path=str(folder)).build()
    dataset = TokenizedSource(paths=(str(out),), pack_sequences=pack)
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, shuffle=False, dataset=dataset)
    loader = cfg.build(LoaderRequest(tok, 0, 1, seq_len=64, micro_batch_size=2, seed=0))
    batch = next(iter(loader))
    if pack:  # rows of whole conversations (as encoded: no appended EOS), padded
        docs = documents(out)
        rows = pack_rows(np.asarray([len(ids) for ids, _ in docs]), 64)
        ids = torch.full((2, 64), tok.pad_id)
        trained = torch.zeros((2, 64), dtype=torch.bool)
        for row in range(2):
            row_ids = [t for d in rows.row(row).tolist() for t in docs[d][0]]
            row_mask = [m for d in rows.row(row).tolist() for m in docs[d][1]]
            ids[row, : len(row_ids)] = torch.tensor(row_ids)
            trained[row, : len(row_ids)] = torch.tensor(row_mask) == 1
    else:
        (first, first_mask), (second, second_mask) = documents(out)[:2]
        ids = torch.full((2, 64), tok.pad_id)
        trained = torch.zeros((2, 64), dtype=torch.bool)
        for row, (doc, m) in enumerate(((first, first_mask), (second, second_mask))):
            ids[row, : len(doc)] = torch.tensor(doc)
            trained[row, : len(doc)] = torch.tensor(m) == 1
    assert torch.equal(batch["input_ids"], ids)
    assert torch.equal(batch["labels"], torch.where(trained, ids, torch.full_like(ids, -100)))
    assert 0 < int(trained.sum()) < trained.numel()


def test_a_template_without_generation_marks_is_refused_before_any_tokenizing(tmp_path: Path) -> None:
    folder = qwen_style_tokenizer(
        tmp_path / "tok", template="{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    status, _, err = run_prepare(
        "prepare",
        write_chats(tmp_path / "chat.jsonl", CHATS),
        "--output",
        tmp_path / "prep",
        "--config-file",
        tokenizer_config(tmp_path / "cfg", folder),
        "--format",
        "chat",
    )
    assert status == 2
    assert err == (
        "the tokenizer's chat_template has no {% generation %} marks, so no assistant token would be trained "
        "on: add them around the assistant content\n"
    )
    assert not (tmp_path / "prep").exists()


def test_a_bad_chat_record_is_located(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": CHATS[0]}) + "\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n"
    )
    status, _, err = run_prepare(
        "prepare",
        data,
        "--output",
        tmp_path / "prep",
        "--config-file",
        tokenizer_config(tmp_path / "cfg"),
        "--format",
        "chat",
    )
    assert (status, err) == (2, f"{data}:2: messages[0] is not an object with string 'role' and 'content'\n")


def test_chat_records_from_a_parquet_messages_column_give_the_jsonl_shards(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    config = tokenizer_config(tmp_path / "cfg", qwen_style_tokenizer(tmp_path / "tok"))
    chats = CHATS * 3
    from_jsonl = prepare(
        [write_chats(tmp_path / "chat.jsonl", chats)], tmp_path / "j", config, "--format", "chat"
    )
    table = pa.table({"id": list(range(len(chats))), "messages": chats})  # a list of {role, content} structs
    pq.write_table(table, tmp_path / "chat.parquet", row_group_size=4)
    from_parquet = prepare([tmp_path / "chat.parquet"], tmp_path / "p", config, "--format", "chat")

    def shard_files(folder: Path) -> dict[str, bytes]:
        return {name: data for name, data in folder_bytes(folder).items() if name.startswith("shard-")}

    assert sorted(shard_files(from_parquet)) == sorted(shard_files(from_jsonl))
    assert shard_files(from_parquet) == shard_files(from_jsonl)
    assert "shard-00000/mask.npy" in shard_files(from_parquet)
    manifest = shards.open_prepared(from_parquet).manifest
    assert (manifest["chat"], manifest["documents"]) == (True, len(chats))


def test_a_bad_parquet_chat_row_is_located(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    config = tokenizer_config(tmp_path / "cfg")
    cases = {
        "null.parquet": (pa.table({"messages": [CHATS[0], None]}), "row 1: no 'messages' list"),
        "empty.parquet": (pa.table({"messages": [[], CHATS[0]]}), "row 0: no 'messages' list"),
        "no-content.parquet": (
            pa.table({"messages": [CHATS[1], CHATS[0], [{"role": "user", "content": None}]]}),
            "row 2: messages[0] is not an object with string 'role' and 'content'",
        ),
        "text.parquet": (
            pa.table({"text": ["hi"]}),
            "no column 'messages', 'conversations' or 'instruction'/'output' (columns: ['text'])",
        ),
    }
    for name, (table, problem) in cases.items():
        pq.write_table(table, tmp_path / name, row_group_size=1)
        args = ["prepare", tmp_path / name, "--output", tmp_path / f"out-{name}", "--config-file", config]
        assert run_prepare(*args, "--format", "chat") == (2, "", f"{tmp_path / name}: {problem}\n")
        assert not (tmp_path / f"out-{name}" / "manifest.json").exists()
