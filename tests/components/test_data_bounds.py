"""Prepared data is checked where it is read: a token id outside the vocabulary is an input error.

A corrupted middle of a large shard passes the launch check (which hashes its first and last MiB); here
the whole manifest is forged to match a changed shard instead, which the launch check cannot tell apart.
The first batch that reads the id stops the run with ``FILE: offset N: token id X >= vocab_size V (run
python -m hyper_parallel.data verify)``, found in the data-loader worker (on the host, no device sync),
in this process or in a worker process alike; ``train_lm`` exits 2 with that line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import DatasetConfig, LoaderRequest, TextDataLoader  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402
from hyper_parallel.config.errors import InputFileError  # noqa: E402
from hyper_parallel.data.shards import _quick_digest, file_digest  # noqa: E402
from tests.support.components import write_jsonl  # noqa: E402
from tests.support.prepared import prepare, tokenizer_config  # noqa: E402

OFFSET = 100


@pytest.fixture(scope="module")
def corrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(the prepared folder, its tokens file holding one id of vocab_size + 5 at ``OFFSET``, vocab_size)."""
    root = tmp_path_factory.mktemp("data_bounds")
    data = write_jsonl(root / "train.jsonl", 20)
    prepared = prepare([data], root / "prep", tokenizer_config(root / "cfg"))
    vocab = ByteTokenizer.Config().build().vocab_size
    tokens_file = prepared / "shard-00000" / "tokens.npy"
    tokens = np.load(tokens_file)
    assert tokens.shape[0] > OFFSET
    tokens[OFFSET] = vocab + 5
    np.save(tokens_file, tokens)
    manifest = json.loads((prepared / "manifest.json").read_text())
    size = tokens_file.stat().st_size
    entry = manifest["shards"][0]["files"]["tokens"]
    entry.update(size=size, sha256=file_digest(tokens_file), quick=_quick_digest(tokens_file, size))
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    return prepared, tokens_file, vocab


def _expected(tokens_file: Path, vocab: int) -> str:
    return (
        f"{tokens_file}: offset {OFFSET}: token id {vocab + 5} >= vocab_size {vocab} (run python -m "
        "hyper_parallel.data verify)"
    )


@pytest.mark.parametrize(
    "workers", [0, pytest.param(1, marks=[pytest.mark.multiprocess, pytest.mark.timeout(120)])]
)
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_a_token_id_outside_the_vocabulary_names_the_file_and_offset(
    corrupted: tuple[Path, Path, int], workers: int, packed: bool
) -> None:
    prepared, tokens_file, vocab = corrupted
    dataset = DatasetConfig(source="tokenized", paths=(str(prepared),), pack_sequences=packed)
    cfg = TextDataLoader.Config(num_workers=workers, pin_memory=False, dataset=dataset, shuffle=False)
    request = LoaderRequest(ByteTokenizer.Config().build(), 0, 1, seq_len=16, micro_batch_size=2, seed=3)
    with pytest.raises(InputFileError) as info:
        list(cfg.build(request))  # one epoch: some batch reads the id
    assert str(info.value) == _expected(tokens_file, vocab)


def test_train_lm_exits_2_with_the_line(corrupted: tuple[Path, Path, int]) -> None:
    from hyper_parallel.launch import main
    from tests.support.trainer import TINY_MODELS, as_flags, debug_config_path

    prepared, tokens_file, vocab = corrupted
    overrides = {
        **TINY_MODELS["llama3"],
        "tokenizer._target_": "hyper_parallel.components.tokenizer.ByteTokenizer.Config",
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": f"[{prepared}]",
        "dataloader.num_workers": "0",
        "training.max_steps": "50",
        "training.seq_len": "16",
        "training.global_batch_size": "2",
        "training.micro_batch_size": "2",
        "metrics.log_freq": "1000",
    }
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", str(debug_config_path("llama3")), *as_flags(overrides)]
    assert main(argv, out=out, err=err) == 2, err.getvalue()
    assert _expected(tokens_file, vocab) in err.getvalue()
    assert "Traceback" not in err.getvalue()
