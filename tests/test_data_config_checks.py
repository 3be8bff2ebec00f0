"""Resolve-time refusals of tokenizer, dataloader and validator settings the runtime would not honour.

Torch-free: these run through ``resolve_root`` exactly as a YAML document would, and assert the field
path and message a user sees.
"""

from typing import Any

import pytest

from hyper_parallel.components.tokenizer import ByteTokenizer
from hyper_parallel.config import ConfigError, resolve_root

QWEN = "hyper_parallel.models.qwen3_5.create_model_spec"
BYTES = "hyper_parallel.components.tokenizer.ByteTokenizer.Config"
HF = "hyper_parallel.components.tokenizer.HuggingFaceTokenizer.Config"
TEXT = "hyper_parallel.components.dataloader.TextDataLoader.Config"


def doc(**groups: Any) -> dict[str, Any]:
    return {"model": {"_target_": QWEN, "flavor": "debugmodel"}, **groups}


def issues(raw: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        resolve_root(raw)
    return [(i.path, i.message) for i in info.value.issues]


def test_byte_tokenizer_resolves_from_its_target() -> None:
    cfg = resolve_root(doc(tokenizer={"_target_": BYTES, "add_bos": False}))
    assert cfg.tokenizer == ByteTokenizer.Config(add_bos=False)
    assert (cfg.tokenizer.vocab_size(), cfg.tokenizer.needs_files()) == (259, False)


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (
            {"tokenizer": {"_target_": BYTES, "path": "/tok"}},
            ("tokenizer.path", "must be null: ByteTokenizer reads no files"),
        ),
        (
            {"tokenizer": {"_target_": HF, "path": "/tok", "use_fast": False}},
            (
                "tokenizer.use_fast",
                "false is not supported yet: only the Rust 'tokenizers' library is; set it to true",
            ),
        ),
        (
            {"dataloader": {"_target_": TEXT, "dataset": {"source": "python_docs", "paths": ["/data"]}}},
            (
                "dataloader.dataset.paths",
                "must be empty when source is 'python_docs' (or set source to 'jsonl' or 'text')",
            ),
        ),
    ],
)
def test_settings_the_runtime_would_not_honour_are_refused(
    group: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert issues(doc(**group)) == [expected]
