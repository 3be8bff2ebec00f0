"""A ``tokenizer.json`` whose normalizer can lengthen text without bound is refused when loaded (N4), and
what one encoding holds is bounded by the growth (M8).

A ``Replace`` of one character by 1 MB made the Rust library ask for 12.6 GB and abort generate and
prepare (SIGABRT, exit 134, no message of ours). The factor is read from the normalizer's description
before anything is encoded; the tokenizers real models ship (a prepend and a one-character replace,
Unicode normalization) stay far below the bound.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tokenizers")

from tokenizers import Regex, normalizers, pre_tokenizers

from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.components.tokenizer._growth import (
    MAX_ENCODE_CHARS,
    MAX_GROWTH,
    normalizer_growth,
    pre_tokenizer_growth,
)
from hyper_parallel.data import shards
from hyper_parallel.errors import InputFileError
from tests.support.components import train_tokenizer, write_jsonl
from tests.support.prepared import prepare_in_child, run_prepare, tokenizer_config


def _with_normalizer(folder: Path, normalizer: Any) -> Path:
    from tokenizers import Tokenizer

    train_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.normalizer = normalizer
    tok.save(str(folder / "tokenizer.json"))
    return folder


HOSTILE = {
    "one character to 1 MB": (normalizers.Replace("a", "x" * (1 << 20)), "1,048,576 times"),
    "a regex inserting 2 KB everywhere": (normalizers.Replace(Regex(""), "y" * 2048), "2,049 times"),
    "a sequence compounding": (
        normalizers.Sequence([normalizers.Replace("a", "aaaaaaaa")] * 4 + [normalizers.NFKC()]),
        "73,728 times",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_normalizer_that_grows_text_is_refused_naming_the_file(tmp_path: Path, case: str) -> None:
    normalizer, figure = HOSTILE[case]
    folder = _with_normalizer(tmp_path / "tok", normalizer)
    with pytest.raises(InputFileError) as info:
        HuggingFaceTokenizer.Config(path=str(folder)).build()
    assert str(info.value) == (
        f"{folder / 'tokenizer.json'}: its normalizer can lengthen text {figure} (at most {MAX_GROWTH} "
        "accepted): refused"
    )


def test_prepare_reports_it_on_one_line_with_exit_2(tmp_path: Path) -> None:
    folder = _with_normalizer(tmp_path / "tok", HOSTILE["one character to 1 MB"][0])
    data = write_jsonl(tmp_path / "train.jsonl", 3)
    config = tokenizer_config(tmp_path / "cfg", folder)
    status, _, err = run_prepare("prepare", data, "--output", tmp_path / "out", "--config-file", config)
    assert status == 2
    assert f"{folder / 'tokenizer.json'}: its normalizer can lengthen text 1,048,576 times" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("normalizer", "growth"),
    [
        (None, 1),
        (normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), 2),  # Llama 2
        (normalizers.NFC(), 4),  # Qwen
        (normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()]), 18),
    ],
)
def test_the_normalizers_real_tokenizers_ship_are_accepted(
    tmp_path: Path, normalizer: Any, growth: int
) -> None:
    folder = _with_normalizer(tmp_path / "tok", normalizer)
    described = json.loads(json.dumps(None if normalizer is None else json.loads(normalizer.__getstate__())))
    assert normalizer_growth(described) == growth
    assert HuggingFaceTokenizer.Config(path=str(folder)).build().encode("hello world", add_eos=False)


def test_an_unreadable_description_counts_as_unbounded() -> None:
    assert normalizer_growth({"type": "Sequence", "normalizers": "x"}) == math.inf
    assert normalizer_growth("Replace") == math.inf


# -- memory (M8): the growth bounds what one encoding holds, not only lengths ---------------------------
GIB = 1 << 30


def test_a_pre_tokenizer_that_grows_text_is_refused_naming_the_file(tmp_path: Path) -> None:
    # Each ByteLevel writes a byte as a character of two: 14 in a row made 1,000 characters take 1.3 GB.
    stacked = pre_tokenizers.Sequence([pre_tokenizers.ByteLevel(use_regex=False)] * 8)
    folder = _with_pre_tokenizer(tmp_path / "tok", stacked)
    with pytest.raises(InputFileError) as info:
        HuggingFaceTokenizer.Config(path=str(folder)).build()
    assert str(info.value) == (
        f"{folder / 'tokenizer.json'}: its pre-tokenizer can lengthen text 65,536 times (at most "
        f"{MAX_GROWTH} accepted): refused"
    )


@pytest.mark.parametrize(
    ("pre", "growth"),
    [
        (None, 1),
        (pre_tokenizers.Whitespace(), 1),
        (pre_tokenizers.ByteLevel(), 4),  # GPT-2, Llama 3, Qwen
        (pre_tokenizers.Metaspace(), 2),  # SentencePiece conversions
        (pre_tokenizers.Sequence([pre_tokenizers.Digits(), pre_tokenizers.ByteLevel()]), 4),
    ],
)
def test_the_pre_tokenizers_real_tokenizers_ship_are_read(pre: Any, growth: int) -> None:
    described = None if pre is None else json.loads(pre.__getstate__())
    assert pre_tokenizer_growth(described) == growth
    assert pre_tokenizer_growth({"type": "Sequence", "pretokenizers": 3}) == math.inf


def _with_pre_tokenizer(folder: Path, pre: Any, normalizer: Any = None) -> Path:
    from tokenizers import Tokenizer

    train_tokenizer(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _prepare_jsonl(
    tmp_path: Path, folder: Path, texts: list[str], threads: int = 2
) -> tuple[Path, tuple[int, str, int]]:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    config = tokenizer_config(tmp_path / "cfg", folder)
    args = ("prepare", data, "--output", tmp_path / "out", "--config-file", config)
    return data, prepare_in_child(*args, threads=threads)


@pytest.mark.multiprocess  # prepare runs in a child, whose peak memory is read
def test_a_document_its_normalizer_grows_past_one_encoding_is_refused_at_its_line(tmp_path: Path) -> None:
    # 1,024 times is accepted; 100,000 characters of it took 1.9 GB, 1 MB asked for a billion characters.
    folder = _with_normalizer(tmp_path / "tok", normalizers.Replace("a", "a" * 1024))
    data, (status, err, peak) = _prepare_jsonl(tmp_path, folder, ["hello", "a" * 1_000_000])
    assert status == 2
    assert err == (
        f"{data}:2: a text of 1,000,000 characters grows past {MAX_ENCODE_CHARS:,} characters under the "
        "tokenizer's normalizer and pre-tokenizer, more than one encoding may hold\n"
    )
    assert peak < 1.5 * GIB, peak


@pytest.mark.multiprocess  # prepare runs in a child, whose peak memory is read
def test_a_batch_is_encoded_in_parts_that_fit_one_encoding(tmp_path: Path) -> None:
    # Eight documents of 16,000 characters, each within the bound alone but 66 million characters grown
    # together: one encoding of the batch held them at once on 8 threads (2.2 GB, 3.2 GB for 12 on 12);
    # now one at a time.
    folder = _with_normalizer(tmp_path / "tok", normalizers.Replace("a", "a" * 1024))
    _, (status, err, peak) = _prepare_jsonl(tmp_path, folder, ["a " * 8000] * 8, threads=8)
    assert status == 0, err
    (arrays,) = shards.open_prepared(tmp_path / "out").shards
    assert arrays.offsets.tolist() == [8002 * i for i in range(9)]  # BOS, 8,000 words (unknown), EOS
    assert peak < 1.5 * GIB, peak


def test_ordinary_text_past_the_static_bound_is_measured_and_encoded(tmp_path: Path) -> None:
    # NFC and ByteLevel (Qwen's) may grow text 16 times: 2 million characters of it would pass the bound,
    # but measured they grow by nothing, and encode as before.
    folder = _with_pre_tokenizer(tmp_path / "tok", pre_tokenizers.ByteLevel(), normalizers.NFC())
    tok = HuggingFaceTokenizer.Config(path=str(folder)).build()
    text = "hello world " * 100_000
    assert len(text) * 16 > MAX_ENCODE_CHARS
    assert tok.text_problem(text) is None
    assert tok.encode_batch(["hello world", text])[1][:2] == tok.encode("hello world")[:2]


def test_a_conversation_its_normalizer_grows_past_one_encoding_is_refused_by_its_index(
    tmp_path: Path,
) -> None:
    from hyper_parallel.data.chat import ChatRenderer, ConversationError

    folder = _with_normalizer(tmp_path / "tok", normalizers.Replace("a", "a" * 1024))
    template = (
        "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}"
    )
    renderer = ChatRenderer(HuggingFaceTokenizer.Config(path=str(folder)).build(), template)
    fits = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    grows = [{"role": "user", "content": "a" * 100_000}, {"role": "assistant", "content": "x"}]
    with pytest.raises(ConversationError) as caught:
        renderer.encode_batch([fits, grows])
    assert caught.value.index == 1
    assert str(caught.value) == (
        f"its rendering: a text of 100,018 characters grows past {MAX_ENCODE_CHARS:,} characters under the "
        "tokenizer's normalizer and pre-tokenizer, more than one encoding may hold"
    )
