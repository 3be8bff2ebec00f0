"""A ``tokenizer.json`` whose normalizer can lengthen text without bound is refused when loaded (N4).

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

from tokenizers import Regex, normalizers

from hyper_parallel.components.tokenizer import HuggingFaceTokenizer
from hyper_parallel.components.tokenizer._growth import MAX_GROWTH, normalizer_growth
from hyper_parallel.config.errors import InputFileError
from tests.support.components import train_tokenizer, write_jsonl
from tests.support.prepared import run_prepare, tokenizer_config


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
