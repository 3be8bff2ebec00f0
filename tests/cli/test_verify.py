"""``python -m hyper_parallel.data verify`` checks what training checks: a prepared folder training refuses
(a manifest that is no manifest, shards whose arrays disagree, a token id outside the vocabulary) is one
line and exit 2 in ``verify`` too, never a pass or a traceback."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest, TextDataLoader, TokenizedSource
from hyper_parallel.components.tokenizer import ByteTokenizer
from hyper_parallel.config import ConfigError
from hyper_parallel.data.shards import _quick_digest, file_digest
from tests.support.components import write_jsonl
from tests.support.prepared import prepare, run_prepare, tokenizer_config

VOCAB = 259  # the byte tokenizer's


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify")
    return prepare([write_jsonl(root / "train.jsonl", 20)], root / "prep", tokenizer_config(root / "cfg"))


def _rewrite(folder: Path, name: str, change: Callable[[np.ndarray[Any, Any]], None]) -> Path:
    """Change shard 0's ``name`` array and record its new size and digests, as a careful forger would."""
    file = folder / "shard-00000" / f"{name}.npy"
    array = np.load(file)
    change(array)
    np.save(file, array)
    manifest = json.loads((folder / "manifest.json").read_text())
    size = file.stat().st_size
    manifest["shards"][0]["files"][name].update(
        size=size, sha256=file_digest(file), quick=_quick_digest(file, size)
    )
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return file


def _tokenizer_a_string(folder: Path) -> str:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tokenizer"] = "bytes"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return (
        f"{folder / 'manifest.json'}: not a valid manifest: 'tokenizer' is not an object with a string "
        "'fingerprint' (the tokenizer it was prepared with)"
    )


def _offsets_past_the_tokens(folder: Path) -> str:
    def past(offsets: np.ndarray[Any, Any]) -> None:
        offsets[1] = offsets[-1] + 10

    file = _rewrite(folder, "offsets", past)
    return f"{file.parent}: offsets.npy decreases somewhere: documents would overlap"


def _a_token_outside_the_vocabulary(folder: Path) -> str:
    def outside(tokens: np.ndarray[Any, Any]) -> None:
        tokens[100] = VOCAB + 5

    file = _rewrite(folder, "tokens", outside)
    return f"{file}: offset 100: token id {VOCAB + 5} >= vocab_size {VOCAB}"


CASES = {
    "tokenizer a string": _tokenizer_a_string,
    "offsets past the tokens": _offsets_past_the_tokens,
    "a token outside the vocabulary": _a_token_outside_the_vocabulary,
}


@pytest.mark.parametrize("case", list(CASES))
def test_verify_refuses_what_training_refuses(clean: Path, tmp_path: Path, case: str) -> None:
    folder = Path(shutil.copytree(clean, tmp_path / "prep"))
    message = CASES[case](folder)
    assert run_prepare("verify", folder) == (2, "", message + "\n")
    dataset = TokenizedSource(paths=(str(folder),))
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, dataset=dataset, shuffle=False)
    request = LoaderRequest(ByteTokenizer.Config().build(), 0, 1, seq_len=16, micro_batch_size=2, seed=3)
    with pytest.raises(ConfigError) as caught:  # training refuses it (at open, or as it reads the id)
        list(cfg.build(request))
    where, problem = message.split(": ", 1)
    assert str(caught.value).startswith(where)
    assert problem in str(caught.value)


def test_an_intact_folder_passes(clean: Path) -> None:
    assert run_prepare("verify", clean) == (0, f"{clean}: every shard matches the manifest\n", "")
