"""Every reader of a file's JSON refuses deep nesting with one line naming the file (N14).

100,000 nested brackets made ``json.loads`` raise ``RecursionError`` in each reader, a traceback each.
One helper (``hyper_parallel._json.loads``) bounds the depth; each reader reports it as it reports any
malformed JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hyper_parallel._json import MAX_DEPTH, JSONDepthError, loads

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a": ' * 2_000 + "1" + "}" * 2_000  # parses without recursion trouble, still too deep


@pytest.mark.parametrize("text", [DEEP, DEEP_OBJECT, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)])
def test_loads_refuses_documents_deeper_than_the_limit(text: str) -> None:
    with pytest.raises(JSONDepthError) as info:
        loads(text)
    assert str(info.value) == f"nested deeper than {MAX_DEPTH} levels"
    assert isinstance(info.value, json.JSONDecodeError)  # every reader's malformed-JSON handling applies


def test_loads_reads_documents_up_to_the_limit() -> None:
    text = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads(text) == json.loads(text)
    assert loads(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


def _jsonl_source(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.components.dataloader import JsonlSource

    file = tmp / "train.jsonl"
    file.write_text(DEEP + "\n")
    return lambda: list(JsonlSource(paths=(str(file),)).documents())


def _prepare_record(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.data.prepare import Piece, _record

    piece = Piece(file=str(tmp / "in.jsonl"), format="jsonl", start=0, end=len(DEEP))
    return lambda: _record(piece, 1, DEEP)


def _safetensors_header(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.models._weights_check import read_header

    raw = DEEP.encode()
    file = tmp / "model.safetensors"
    file.write_bytes(len(raw).to_bytes(8, "little") + raw)
    return lambda: read_header(file)


def _checkpoint_manifest(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.components.checkpoint._manifest import verify_files

    (tmp / "checksums.json").write_text(DEEP)
    return lambda: verify_files(tmp)


def _tokenizer_config(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.components.tokenizer._runtime import read_tokenizer_config

    (tmp / "tokenizer_config.json").write_text(DEEP)
    return lambda: read_tokenizer_config(tmp / "tokenizer_config.json")


def _metrics(tmp: Path) -> Callable[[], object]:
    from hyper_parallel.plot import read_metrics

    (tmp / "metrics.jsonl").write_text(DEEP + "\n")
    return lambda: read_metrics(tmp / "metrics.jsonl")


READERS: dict[str, tuple[Callable[[Path], Callable[[], object]], str]] = {
    "jsonl source": (_jsonl_source, "train.jsonl:1: not a JSON object: nested deeper than 100 levels"),
    "prepare record": (_prepare_record, "in.jsonl:1: not a JSON object: nested deeper than 100 levels"),
    "safetensors header": (_safetensors_header, "its header is not JSON (nested deeper than 100 levels)"),
    "checkpoint manifest": (_checkpoint_manifest, "not a readable checksum manifest (nested deeper than 100"),
    "tokenizer_config.json": (_tokenizer_config, "not a JSON file: nested deeper than 100 levels"),
    "metrics": (_metrics, "metrics.jsonl:1: not a JSON object: nested deeper than 100 levels"),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_json_reader_reports_deep_nesting_as_one_line_naming_the_file(
    tmp_path: Path, reader: str
) -> None:
    pytest.importorskip("torch")
    make, problem = READERS[reader]
    read = make(tmp_path)
    with pytest.raises(ValueError, match="nested deeper than 100 levels") as info:  # each reader's own
        read()
    text = str(info.value)
    assert problem in text
    assert str(tmp_path) in text
    assert "\n" not in text
