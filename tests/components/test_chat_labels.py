"""Chat labels are real or refused: record shapes, roles, ``train_on``, generation marks, label counts.

Issue 43 item 3: a template without ``{% generation %}`` marks passed a substring test (every Hugging Face
template holds ``add_generation_prompt``), records without an assistant turn or with ShareGPT roles gave
zero labels silently, and a run on zero labels logged ``loss 0.0000`` and exited 0.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jinja2")

from hyper_parallel.components.dataloader._prepared_check import PreparedDataError, open_for_training
from hyper_parallel.components.tokenizer import ByteTokenizer
from hyper_parallel.data import shards
from hyper_parallel.data.chat import ChatRenderer
from tests.support.prepared import run_prepare, tokenizer_config

#: The ids of the built-in format (byte tokenizer: bos 256, eos 257) for user "hi", assistant "yo".
USER_HEAD, USER_HI = [256, *b"<|user|>\n"], [*b"hi\n"]
ASSISTANT_HEAD, ASSISTANT_YO = [*b"<|assistant|>\n"], [*b"yo", 257]
HI_YO = [*USER_HEAD, *USER_HI, *ASSISTANT_HEAD, *ASSISTANT_YO]
#: Only the answer and its EOS carry labels (train_on: assistant).
HI_YO_MASK = [0] * (len(USER_HEAD) + len(USER_HI) + len(ASSISTANT_HEAD)) + [1, 1, 1]

CHATML = (  # ChatML as Qwen ships it: no generation marks, but the word in add_generation_prompt
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (  # Llama 3's layout (it trims each content), without generation marks
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
    "+ '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
#: Llama 3's layout with the assistant turn inside generation marks.
LLAMA3_MARKED = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}"
)
NO_MARKS = (
    "the tokenizer's chat_template has no {% generation %} marks, so no assistant token would be trained "
    "on: add them around the assistant content"
)


class OffsetsTokenizer:
    """What a template renderer needs of a tokenizer (rendering never encodes)."""

    bos_token, eos_token, pad_token = "<|begin_of_text|>", "", ""

    def encode_with_offsets(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        raise NotImplementedError


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def hi_yo(role_key: str = "role", text_key: str = "content", user: str = "user") -> list[dict[str, str]]:
    return [
        {role_key: user, text_key: "hi"},
        {role_key: "assistant" if user == "user" else "gpt", text_key: "yo"},
    ]


def documents(folder: Path) -> list[tuple[list[int], list[int]]]:
    (shard,) = shards.open_prepared(folder).shards
    assert shard.mask is not None
    bounds = shard.offsets.tolist()
    return [(shard.tokens[a:b].tolist(), shard.mask[a:b].tolist()) for a, b in itertools.pairwise(bounds)]


def run_chat(tmp_path: Path, data: Path, *extra: str, output: str = "out") -> tuple[int, str, str]:
    config = tokenizer_config(tmp_path / "cfg")
    return run_prepare(
        "prepare", data, "--output", tmp_path / output, "--config-file", config, "--format", "chat", *extra
    )


# -- generation marks, from the parsed template ---------------------------------------------------------
@pytest.mark.parametrize("template", [CHATML, LLAMA3, "{# generation #}{{ messages[0].content }}"])
def test_a_template_without_a_generation_block_is_refused_though_it_holds_the_word(template: str) -> None:
    assert "generation" in template
    with pytest.raises(ValueError, match=r"^the tokenizer's chat_template has no") as info:
        ChatRenderer(OffsetsTokenizer(), template)
    assert str(info.value) == NO_MARKS


def test_a_template_without_marks_is_refused_by_prepare_in_one_line_exit_2(tmp_path: Path) -> None:
    from tests.support.chat_data import qwen_style_tokenizer

    folder = qwen_style_tokenizer(tmp_path / "tok", template=CHATML)
    data = write(tmp_path / "chat.jsonl", [{"messages": hi_yo()}])
    args: list[str | Path] = [
        "--output",
        tmp_path / "out",
        "--config-file",
        tokenizer_config(tmp_path / "cfg", folder),
    ]
    assert run_prepare("prepare", data, *args, "--format", "chat") == (2, "", NO_MARKS + "\n")
    assert not (tmp_path / "out").exists()


def test_a_marked_llama3_template_trains_the_answers_and_their_end() -> None:
    renderer = ChatRenderer(OffsetsTokenizer(), LLAMA3_MARKED)
    text, spans = renderer.render(
        [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
    )
    assert [text[a:b] for a, b in spans] == ["yo<|eot_id|>"]


def test_train_on_user_marks_the_user_content_as_the_template_writes_it() -> None:
    # Llama 3 trims contents: the marks go inside the whitespace, so the trained span is the text written.
    renderer = ChatRenderer(OffsetsTokenizer(), LLAMA3_MARKED, train_on=("user", "assistant"))
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  hi there \n"},
        {"role": "assistant", "content": "yo"},
    ]
    text, spans = renderer.render(chat)
    assert text == ChatRenderer(OffsetsTokenizer(), LLAMA3_MARKED).render(chat)[0]
    assert [text[a:b] for a, b in spans] == ["hi there", "yo<|eot_id|>"]
    # Without assistant in train_on, a template needs no generation block, and its blocks train nothing.
    user_only = ChatRenderer(OffsetsTokenizer(), LLAMA3, train_on=("user",))
    text, spans = user_only.render(chat)
    assert [text[a:b] for a, b in spans] == ["hi there"]


@pytest.mark.parametrize("written", ["m.content[:3]", "m.content[1:]", "m.content | length"])
def test_a_template_that_cuts_a_trained_content_is_refused_for_that_conversation(written: str) -> None:
    cutting = (
        f"{{% for m in messages %}}{{{{ {written} }}}}{{% generation %}}.{{% endgeneration %}}{{% endfor %}}"
    )
    renderer = ChatRenderer(OffsetsTokenizer(), cutting, train_on=("assistant", "user"))
    with pytest.raises(ValueError, match=r"^the chat_template does not write") as info:
        renderer.render(hi_yo())
    assert str(info.value) == (
        "the chat_template does not write the content of user messages as given (it cuts or tests it), so "
        "its tokens cannot be found exactly: leave user out of train_on with this template"
    )


# -- record shapes and roles ---------------------------------------------------------------------------
def test_openai_sharegpt_and_alpaca_records_give_the_same_ids_and_labels(tmp_path: Path) -> None:
    data = write(
        tmp_path / "chat.jsonl",
        [
            {"messages": hi_yo()},
            {"conversations": hi_yo("from", "value", user="human")},
            {"instruction": "hi", "output": "yo"},
            {"instruction": "hi", "input": "", "output": "yo"},
            {"instruction": "Say", "input": "hi", "output": "yo"},
        ],
    )
    status, out, err = run_chat(tmp_path, data)
    assert (status, err) == (0, "")
    said = [*USER_HEAD, *b"Say\n\nhi\n", *ASSISTANT_HEAD, *ASSISTANT_YO]
    assert documents(tmp_path / "out") == [(HI_YO, HI_YO_MASK)] * 4 + [
        (said, [0] * (len(said) - 3) + [1, 1, 1])
    ]
    tokens = 4 * len(HI_YO) + len(said)
    assert out.splitlines()[-1] == f"{tmp_path / 'out'}: 15 tokens carry labels ({15 / tokens:.1%} of all)"
    manifest = shards.open_prepared(tmp_path / "out").manifest
    assert (manifest["label_tokens"], manifest["unlabeled_dropped"], manifest["tokens"]) == (15, 0, tokens)


def test_roles_are_read_as_written_and_sharegpt_roles_are_mapped(tmp_path: Path) -> None:
    chat = [
        {"from": "system", "value": "s"},
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "a"},
        {"from": "tool", "value": "t"},
        {"from": "assistant", "value": "b"},
    ]
    data = write(tmp_path / "chat.jsonl", [{"conversations": chat}])
    assert run_chat(tmp_path, data)[0] == 0
    ((ids, mask),) = documents(tmp_path / "out")
    expected = [
        256,
        *b"<|system|>\ns\n<|user|>\nq\n<|assistant|>\na",
        257,
        *b"<|tool|>\nt\n<|assistant|>\nb",
        257,
    ]
    assert ids == expected
    trained = [i for i, m in zip(ids, mask, strict=True) if m]
    assert trained == [ord("a"), 257, ord("b"), 257]


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]},
            "messages[1] has role 'bot', not one of system, user, assistant, tool",
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "model", "value": "yo"}]},
            "conversations[1] has from 'model', not one of human, gpt, system, user, assistant, tool",
        ),
        (
            {"conversations": [{"role": "user", "content": "hi"}]},
            "conversations[0] is not an object with string 'from' and 'value'",
        ),
        (
            {"instruction": "hi", "input": 3, "output": "yo"},
            "an Alpaca record needs string 'instruction' and 'output' ('input': a string or absent)",
        ),
        (
            {"text": "hi"},
            "not a chat record: expected 'messages' (OpenAI: role/content), 'conversations' (ShareGPT: "
            "from/value) or 'instruction'/'input'/'output' (Alpaca)",
        ),
    ],
)
def test_a_record_of_no_shape_or_an_unknown_role_is_located(
    tmp_path: Path, record: dict[str, Any], problem: str
) -> None:
    data = write(tmp_path / "chat.jsonl", [{"messages": hi_yo()}, record])
    assert run_chat(tmp_path, data) == (2, "", f"{data}:2: {problem}\n")


def test_chat_rows_of_each_shape_from_parquet_columns(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(
        pa.table({"conversations": [hi_yo("from", "value", user="human")] * 2}), tmp_path / "s.parquet"
    )
    pq.write_table(
        pa.table({"instruction": ["hi", "Say"], "input": [None, "hi"], "output": ["yo", "yo"]}),
        tmp_path / "a.parquet",
    )
    assert run_chat(tmp_path, tmp_path / "s.parquet", output="s")[0] == 0
    assert documents(tmp_path / "s") == [(HI_YO, HI_YO_MASK)] * 2
    assert run_chat(tmp_path, tmp_path / "a.parquet", output="a")[0] == 0
    said = [*USER_HEAD, *b"Say\n\nhi\n", *ASSISTANT_HEAD, *ASSISTANT_YO]
    assert documents(tmp_path / "a") == [(HI_YO, HI_YO_MASK), (said, [0] * (len(said) - 3) + [1, 1, 1])]


# -- train_on ------------------------------------------------------------------------------------------
def test_train_on_user_labels_the_user_content_and_its_newline(tmp_path: Path) -> None:
    data = write(tmp_path / "chat.jsonl", [{"messages": hi_yo()}])
    status, out, _ = run_chat(tmp_path, data, "--train-on", "assistant,user")
    assert status == 0
    ((ids, mask),) = documents(tmp_path / "out")
    assert ids == HI_YO
    assert mask == [0] * len(USER_HEAD) + [1, 1, 1] + [0] * len(ASSISTANT_HEAD) + [1, 1, 1]
    assert out.splitlines()[-1] == f"{tmp_path / 'out'}: 6 tokens carry labels ({6 / len(HI_YO):.1%} of all)"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--train-on", "assistant,bot"],
            "--train-on: 'bot' is not a role: the roles are system, user, assistant, tool",
        ),
        (["--train-on", ""], "--train-on: '' is not a role: the roles are system, user, assistant, tool"),
    ],
)
def test_a_bad_train_on_is_one_line_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    data = write(tmp_path / "chat.jsonl", [{"messages": hi_yo()}])
    assert run_chat(tmp_path, data, *flags) == (2, "", message + "\n")


def test_train_on_and_drop_unlabeled_are_chat_options(tmp_path: Path) -> None:
    data = write(tmp_path / "docs.jsonl", [{"text": "hi"}])
    config = tokenizer_config(tmp_path / "cfg")
    for flags, name in ((["--train-on", "user"], "--train-on"), (["--drop-unlabeled"], "--drop-unlabeled")):
        status, _, err = run_prepare(
            "prepare", data, "--output", tmp_path / "o", "--config-file", config, *flags
        )
        assert (status, err) == (2, f"{name}: only read with --format chat\n")


# -- records without labels ----------------------------------------------------------------------------
def test_records_without_a_trained_turn_are_counted_and_refused_then_dropped_on_request(
    tmp_path: Path,
) -> None:
    questions = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(6)]
    records = [questions[0], {"messages": hi_yo()}, *questions[1:]]
    data = write(tmp_path / "chat.jsonl", records)
    status, out, err = run_chat(tmp_path, data)
    named = ", ".join(f"{data}:{line}" for line in (1, 3, 4, 5, 6))
    assert (status, out) == (2, "")
    assert err == (
        f"{data}:1: no token carries a label (no turn of a role train_on names: assistant); "
        f"6 record(s) in all carry none ({named}, ...): fix them, or leave them out with --drop-unlabeled\n"
    )
    assert [p.name for p in (tmp_path / "out").iterdir()] == [".prepare.lock"]  # the same folder can be used
    # Records spread over shards encoded by two workers, in any order: the same records named, in order.
    sharded = run_chat(tmp_path, data, "--shard-mb", "0.00002", "--workers", "2", output="sharded")
    assert sharded == (2, "", err)
    status, out, err = run_chat(tmp_path, data, "--drop-unlabeled")
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"packing at seq_len 2048: 1 conversations in 1 rows, efficiency {len(HI_YO) / 2048:.1%} "
        "(real tokens / row tokens; no conversation split)",
        f"{tmp_path / 'out'}: 1 documents, {len(HI_YO)} tokens in 1 shard(s) (uint16)",
        f"{tmp_path / 'out'}: 3 tokens carry labels ({3 / len(HI_YO):.1%} of all); "
        "6 record(s) without one dropped",
    ]
    assert documents(tmp_path / "out") == [(HI_YO, HI_YO_MASK)]
    assert shards.open_prepared(tmp_path / "out").manifest["unlabeled_dropped"] == 6


def test_a_corpus_with_no_label_at_all_is_refused(tmp_path: Path) -> None:
    data = write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "q"}]}] * 2)
    status, out, err = run_chat(tmp_path, data, "--drop-unlabeled")
    assert (status, out) == (2, "")
    assert err == (
        f"{tmp_path / 'out'}: no token carries a label (2 record(s) without one dropped): a run would train "
        "on nothing (train_on: assistant)\n"
    )
    assert not (tmp_path / "out" / "manifest.json").exists()


# -- at launch -----------------------------------------------------------------------------------------
def hand_made(folder: Path, mask: list[int], label_tokens: int | None) -> Path:
    """A chat folder written with the format's own writers: ``label_tokens`` None is one prepared before
    the count was recorded."""
    import numpy as np

    tokenizer = ByteTokenizer.Config().build()
    fingerprint, description = shards.tokenizer_fingerprint(tokenizer)
    arrays = shards.ShardArrays(
        np.array(HI_YO, dtype=np.uint16),
        np.array([0, len(HI_YO)], dtype=np.int64),
        np.zeros(1, dtype=np.uint8),
        np.array(mask, dtype=np.uint8),
    )
    folder.mkdir(parents=True)
    entry = shards.write_shard(folder, shards.shard_name(0), arrays)
    entry.pop("label_tokens")
    manifest = {
        "format": shards.FORMAT,
        "version": shards.FORMAT_VERSION,
        "tokenizer": {"fingerprint": fingerprint, "description": description},
        "dtype": "uint16",
        "chat": True,
        "shards": [entry],
        "documents": 1,
        "tokens": len(HI_YO),
    }
    if label_tokens is not None:
        manifest["label_tokens"] = label_tokens
    shards.write_manifest(folder, manifest)
    return folder


def test_a_folder_without_labels_is_refused_at_launch_counted_from_the_mask_when_unrecorded(
    tmp_path: Path,
) -> None:
    fingerprint = shards.tokenizer_fingerprint(ByteTokenizer.Config().build())
    assert (
        open_for_training(str(hand_made(tmp_path / "old", HI_YO_MASK, None)), fingerprint, None).label_tokens
        == 3
    )
    for name, recorded in (("zero-old", None), ("zero", 0)):
        folder = hand_made(tmp_path / name, [0] * len(HI_YO), recorded)
        with pytest.raises(PreparedDataError) as info:
            open_for_training(str(folder), fingerprint, None)
        assert str(info.value) == (
            f"{folder}: dataset.paths: chat data in which no token carries a label (0 of {len(HI_YO)}): "
            "a run would train on nothing; prepare it again (prepare names the records without a trained "
            "turn)"
        )


def test_a_folder_without_labels_is_refused_at_dry_run_exit_2(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from hyper_parallel.launch import main
    from tests.support.trainer import as_flags, debug_config_path, tiny_overrides

    folder = hand_made(tmp_path / "zero", [0] * len(HI_YO), None)
    overrides = {
        **tiny_overrides("llama3"),
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": json.dumps([str(folder)]),
    }
    out, err = io.StringIO(), io.StringIO()
    flags = ["--config-file", str(debug_config_path("llama3")), *as_flags(overrides), "--dry-run"]
    assert main(flags, out=out, err=err) == 2
    problems = [line for line in err.getvalue().splitlines() if "warning" not in line]
    assert f"{folder}: dataset.paths: chat data in which no token carries a label (0 of 30)" in problems[0]
    assert "Traceback" not in err.getvalue()


def test_train_on_user_through_a_hugging_face_template_labels_exactly_the_user_tokens(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
    from tests.support.chat_data import CHATS, qwen_style_tokenizer

    folder = qwen_style_tokenizer(tmp_path / "tok")
    data = write(tmp_path / "chat.jsonl", [{"messages": CHATS[0]}])
    config = tokenizer_config(tmp_path / "cfg", folder)
    args: list[str | Path] = ["--output", tmp_path / "out", "--config-file", config, "--format", "chat"]
    status, _, err = run_prepare("prepare", data, *args, "--train-on", "user,assistant")
    assert (status, err) == (0, "")
    tokenizer = HuggingFaceTokenizer.Config(path=str(folder)).build()
    ((ids, mask),) = documents(tmp_path / "out")
    trained = [tokenizer.decode([i]) for i, m in zip(ids, mask, strict=True) if m]
    assert "".join(trained) == "What is two plus two?Four.<|im_end|>"
