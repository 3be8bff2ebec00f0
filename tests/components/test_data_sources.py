"""Dataset sources as classes: ``source:`` picks the class, each holds only what it reads, old dumps load.

Torch-free: everything here resolves, dumps and reads module text.
"""

import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from hyper_parallel.components.dataloader import (
    DatasetConfig,
    JsonlSource,
    NoSource,
    PythonDocsSource,
    ShapesSource,
    TokenizedSource,
)
from hyper_parallel.config import ConfigError, apply_overrides, dump_config, load_config, resolve_root

ROOT = Path(__file__).resolve().parents[2]
QWEN = {"_target_": "hyper_parallel.models.qwen3_5.create_vl_model_spec", "flavor": "debugmodel"}
BYTES = {"_target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config"}
TEXT = "hyper_parallel.components.dataloader.TextDataLoader.Config"

#: A dataset block as every dump wrote it before sources were classes: every source's fields, at their
#: defaults but for the ones the source reads.
FLAT = """\
    source: {source}
    paths: {paths}
    weights: null
    holdout_fraction: 0.0
    split: train
    text_field: text
    seed: 5
    pack_sequences: true
    document_masking: true
    max_samples: null
    synthetic_num_samples: 10000
    image_min_pixels: 65536
    image_max_pixels: 16777216
"""


def _write(tmp_path: Path, dataset: str) -> Path:
    path = tmp_path / "old.yaml"
    path.write_text(
        "model:\n  _target_: hyper_parallel.models.qwen3_5.create_model_spec\n  flavor: debugmodel\n"
        "  weights_path: /w\n"
        f"dataloader:\n  _target_: {TEXT}\n  dataset:\n{dataset}"
    )
    return path


@pytest.mark.parametrize(
    ("source", "paths", "expected"),
    [
        ("python_docs", "[]", PythonDocsSource(seed=5)),
        ("jsonl", "[a.jsonl]", JsonlSource(paths=("a.jsonl",), seed=5)),
        ("null", "[]", NoSource(seed=5)),
    ],
)
def test_a_dump_written_when_one_class_held_every_source_still_loads(
    source: str, paths: str, expected: DatasetConfig, tmp_path: Path
) -> None:
    cfg = load_config(str(_write(tmp_path, FLAT.format(source=source, paths=paths))))
    assert cfg.dataloader.dataset == expected  # type: ignore[attr-defined]


def test_an_old_dump_loads_to_the_config_its_own_dump_gives() -> None:
    cfg = load_config(str(ROOT / "configs" / "llama3_debug.yaml"))
    assert load_config(str(ROOT / "configs" / "llama3_debug.yaml")) == cfg
    text = dump_config(cfg)
    block = text[text.index("  dataset:\n") :].split("  shuffle:")[0]
    assert block == (
        "  dataset:\n    source: python_docs\n    seed: null\n    pack_sequences: true\n"
        "    document_masking: true\n    max_samples: null\n"
    )


def test_another_sources_field_set_in_an_old_dump_is_refused_at_its_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path, FLAT.format(source="python_docs", paths="[]").replace("text_field: text", "text_field: q")
    )
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert [str(i) for i in info.value.issues] == [
        f"{path}:13:17: dataloader.dataset.text_field: is only read when source is 'jsonl' (source is "
        "'python_docs'); leave it out"
    ]


def test_each_source_holds_only_the_fields_it_reads() -> None:
    fields = {cls.tag(): list(attrs.fields_dict(cls)) for cls in DatasetConfig.__variants__}  # type: ignore[arg-type]
    assert fields["jsonl"] == [
        "source", "paths", "text_field", "seed", "pack_sequences", "document_masking", "max_samples"
    ]  # fmt: skip
    assert fields["tokenized"][:5] == ["source", "paths", "weights", "holdout_fraction", "split"]
    assert fields["synthetic"] == ["source", "seed", "max_samples", "synthetic_num_samples"]
    assert fields["image_chat"][-2:] == ["image_min_pixels", "image_max_pixels"]
    assert [name for name, own in fields.items() if "text_field" in own] == ["jsonl"]


def test_the_base_is_not_a_dataset() -> None:
    with pytest.raises(TypeError, match="build one of NoSource, JsonlSource, TextSource"):
        DatasetConfig(source="jsonl")  # type: ignore[call-arg]


def test_the_source_names_the_class_and_an_override_switches_it() -> None:
    cfg = load_config(str(ROOT / "configs" / "llama3_debug.yaml"))
    switched = apply_overrides(
        cfg, {"dataloader.dataset.source": "tokenized", "dataloader.dataset.paths": "[/p]"}
    )
    assert switched.dataloader.dataset == TokenizedSource(paths=("/p",))  # type: ignore[attr-defined]
    shapes = resolve_root(
        {
            "model": {**QWEN, "overrides": {"image_token_id": 300, "text.vocab_size": 512}},
            "tokenizer": BYTES,
            "dataloader": {"_target_": TEXT, "dataset": {"source": "shapes"}},
        }
    )
    assert type(shapes.dataloader.dataset) is ShapesSource  # type: ignore[attr-defined]


def test_a_field_no_chosen_source_reads_is_refused_naming_those_that_do() -> None:
    raw: dict[str, Any] = {
        "model": QWEN,
        "tokenizer": BYTES,
        "dataloader": {"_target_": TEXT, "dataset": {"source": "shapes", "document_masking": False}},
    }
    with pytest.raises(ConfigError) as info:
        resolve_root(raw)
    assert [(i.path, i.message) for i in info.value.issues] == [
        (
            "dataloader.dataset.document_masking",
            "is only read when source is 'jsonl', 'text', 'tokenized', 'chat' or 'python_docs' (source "
            "is 'shapes'); leave it out",
        )
    ]


def _modules(where: Path) -> list[Path]:
    return sorted(where.rglob("*.py"))


def test_no_caller_asks_which_source_a_dataset_is() -> None:
    compare = re.compile(r"source (==|in|!=)\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _modules(ROOT / "hyper_parallel")
        if "components" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compare.search(line)
    ]
    assert found == []


def test_only_the_dataloader_imports_its_private_modules() -> None:
    private = re.compile(
        r"hyper_parallel\.components\.dataloader\._|from hyper_parallel\.components\.dataloader import _"
    )
    dataloader = ROOT / "hyper_parallel" / "components" / "dataloader"
    found = [
        str(path.relative_to(ROOT))
        for path in _modules(ROOT / "hyper_parallel")
        if dataloader not in path.parents and private.search(path.read_text())
    ]
    assert found == []
