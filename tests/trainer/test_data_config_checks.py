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
VALIDATOR = "hyper_parallel.components.validator.LossValidator.Config"
UNREAD_SEED = "is only read to shuffle or to generate synthetic data, and neither happens; set it to null"


def doc(**groups: Any) -> dict[str, Any]:
    return {"model": {"_target_": QWEN, "flavor": "debugmodel", "weights_path": "/weights"}, **groups}


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
        (
            {
                "dataloader": {
                    "_target_": TEXT,
                    "dataset": {"source": "text", "paths": ["/d"], "text_field": "x"},
                }
            },
            (
                "dataloader.dataset.text_field",
                "is only read when source is 'jsonl' (source is 'text'); leave it out",
            ),
        ),
        (
            {
                "dataloader": {
                    "_target_": TEXT,
                    "dataset": {"source": "python_docs", "synthetic_num_samples": 5},
                }
            },
            (
                "dataloader.dataset.synthetic_num_samples",
                "is only read when source is 'synthetic' or 'shapes' (source is 'python_docs'); leave it out",
            ),
        ),
        (
            {"dataloader": {"_target_": TEXT, "dataset": {"source": "synthetic", "pack_sequences": False}}},
            (
                "dataloader.dataset.pack_sequences",
                "must be true when source is 'synthetic': its samples are full windows",
            ),
        ),
        (
            {
                "dataloader": {
                    "_target_": TEXT,
                    "shuffle": False,
                    "dataset": {"source": "python_docs", "seed": 3},
                }
            },
            ("dataloader.dataset.seed", UNREAD_SEED),
        ),
        (
            {
                "validator": {
                    "_target_": VALIDATOR,
                    "dataset": {"source": "jsonl", "paths": ["/v"], "seed": 3},
                }
            },
            ("validator.dataset.seed", UNREAD_SEED),
        ),
    ],
)
def test_settings_the_runtime_would_not_honour_are_refused(
    group: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert issues(doc(**group)) == [expected]


@pytest.mark.parametrize(
    "group",
    [
        {"dataloader": {"_target_": TEXT, "shuffle": False, "dataset": {"source": "synthetic", "seed": 3}}},
        {"dataloader": {"_target_": TEXT, "dataset": {"source": "python_docs", "seed": 3}}},  # shuffled
        {
            "validator": {
                "_target_": VALIDATOR,
                "dataset": {"source": "synthetic", "seed": 3, "synthetic_num_samples": 64},
            }
        },
        {
            "dataloader": {
                "_target_": TEXT,
                "dataset": {"source": "jsonl", "paths": ["/d"], "text_field": "x"},
            }
        },
    ],
)
def test_settings_the_runtime_reads_resolve(group: dict[str, Any]) -> None:
    resolve_root(doc(**group))


def tokenized(**dataset: Any) -> dict[str, Any]:
    return {"dataloader": {"_target_": TEXT, "dataset": {"source": "tokenized", **dataset}}}


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (
            tokenized(),
            (
                "dataloader.dataset.paths",
                "must list at least one file or directory when source is 'tokenized'",
            ),
        ),
        (
            tokenized(paths=["/a", "/b"], weights=[1.0]),
            ("dataloader.dataset.weights", "has 1 value(s) for 2 path(s): give one per path"),
        ),
        (
            tokenized(paths=["/a", "/b"], weights=[1.0, 0]),
            ("dataloader.dataset.weights", "must all be positive and finite, got [1.0, 0.0]"),
        ),
        (
            tokenized(paths=["/a"], holdout_fraction=1.0),
            ("dataloader.dataset.holdout_fraction", "must be in [0, 1), got 1.0"),
        ),
        (
            tokenized(paths=["/a"], split="holdout"),
            ("dataloader.dataset.split", "'holdout' needs holdout_fraction > 0 (the documents it reads)"),
        ),
        (
            {
                "dataloader": {
                    "_target_": TEXT,
                    "dataset": {"source": "jsonl", "paths": ["/a"], "weights": [2]},
                }
            },
            (
                "dataloader.dataset.weights",
                "is only read when source is 'tokenized' (source is 'jsonl'); leave it out",
            ),
        ),
        (
            {"validator": {"_target_": VALIDATOR, "dataset": {"holdout_fraction": 0.1}}},
            (
                "validator.dataset.holdout_fraction",
                "is only read when source is 'tokenized' (source is None); leave it out",
            ),
        ),
        (
            {"validator": {"_target_": VALIDATOR, "dataset": {"split": "holdout"}}},
            (
                "validator.dataset.split",
                "is only read when source is 'tokenized' (source is None); leave it out",
            ),
        ),
    ],
)
def test_mixture_and_holdout_settings_are_checked_without_reading_shards(
    group: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert issues(doc(**group)) == [expected]


def test_a_weighted_mixture_with_a_held_out_fraction_resolves() -> None:
    cfg = resolve_root(doc(**tokenized(paths=["/a", "/b"], weights=[3, 1], holdout_fraction=0.05)))
    assert cfg.dataloader.dataset.weights == (3.0, 1.0)  # type: ignore[attr-defined]
