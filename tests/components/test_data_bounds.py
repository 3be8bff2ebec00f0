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
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest, TextDataLoader, TokenizedSource  # noqa: E402
from hyper_parallel.components.tokenizer import ByteTokenizer  # noqa: E402
from hyper_parallel.data.shards import _quick_digest, file_digest  # noqa: E402
from hyper_parallel.errors import InputFileError  # noqa: E402
from tests.support.components import write_jsonl  # noqa: E402
from tests.support.prepared import prepare, tokenizer_config  # noqa: E402

OFFSET = 100


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared folder (byte tokenizer, one shard)."""
    root = tmp_path_factory.mktemp("data_bounds")
    data = write_jsonl(root / "train.jsonl", 20)
    return prepare([data], root / "prep", tokenizer_config(root / "cfg"))


@pytest.fixture(scope="module")
def corrupted(clean: Path) -> tuple[Path, Path, int]:
    """(the prepared folder, its tokens file holding one id of vocab_size + 5 at ``OFFSET``, vocab_size)."""
    prepared = Path(shutil.copytree(clean, clean.parent / "corrupted"))
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
    dataset = TokenizedSource(paths=(str(prepared),), pack_sequences=packed)
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
        "metrics.enable_jsonl": "false",  # the debug config's sink writes under the working folder
        "metrics.jsonl_path": "metrics.jsonl",
    }
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", str(debug_config_path("llama3")), *as_flags(overrides)]
    assert main(argv, out=out, err=err) == 2, err.getvalue()
    assert _expected(tokens_file, vocab) in err.getvalue()
    assert "Traceback" not in err.getvalue()


# -- hostile manifests: one line, exit 2, in verify and in training (N8, N18) ----------------------------
def _nested(manifest: dict[str, Any]) -> Any:
    return "[" * 100_000 + "]" * 100_000


def _with(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def change(manifest: dict[str, Any]) -> Any:
        manifest.update(changes)
        return manifest

    return change


def _shard(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def change(manifest: dict[str, Any]) -> Any:
        manifest["shards"][0].update(changes)
        return manifest

    return change


HOSTILE_MANIFESTS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "nested 100,000 deep": (_nested, "not JSON (nested deeper than 100 levels)"),
    "shards not a list": (_with(shards={"a": 1}), "not a valid manifest: 'shards' is not a list"),
    "a shard outside the folder": (
        _shard(name="../../elsewhere"),
        "not a valid manifest: shard entry 0 names '../../elsewhere', not a shard-NNNNN folder of its own",
    ),
    "an absolute shard path": (
        _shard(name="/etc"),
        "not a valid manifest: shard entry 0 names '/etc', not a shard-NNNNN folder of its own",
    ),
    "an object dtype": (
        _with(dtype="object"),
        "not a valid manifest: token dtype 'object' (prepare writes uint16 or uint32)",
    ),
    "negative counts": (
        _shard(documents=-1),
        "not a valid manifest: shard shard-00000: its documents and tokens are not non-negative integers",
    ),
    "totals that are not the sums": (
        _with(tokens=10**15),
        "not a valid manifest: its totals (",
    ),
    "a shard entry that is a string": (
        _with(shards=["x"]),
        "not a valid manifest: shard entry 0 is not an object",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_MANIFESTS))
def test_a_hostile_manifest_is_one_line_and_exit_2_in_verify_and_training(
    clean: Path, tmp_path: Path, case: str
) -> None:
    from hyper_parallel.components.dataloader._prepared import PreparedDataError
    from tests.support.prepared import run_prepare

    change, problem = HOSTILE_MANIFESTS[case]
    folder = Path(shutil.copytree(clean, tmp_path / "prep"))
    manifest_file = folder / "manifest.json"
    changed = change(json.loads(manifest_file.read_text()))
    manifest_file.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    status, out, err = run_prepare("verify", folder)
    assert status == 2
    assert err.startswith(f"{manifest_file}: {problem}")
    assert err.count("\n") == 1
    assert out == ""
    dataset = TokenizedSource(paths=(str(folder),))
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, dataset=dataset)
    request = LoaderRequest(ByteTokenizer.Config().build(), 0, 1, seq_len=16, micro_batch_size=2, seed=3)
    with pytest.raises(PreparedDataError) as info:
        cfg.build(request)
    assert str(info.value).startswith(f"{manifest_file}: dataset.paths: {problem}")


def test_offsets_that_do_not_cover_the_tokens_are_refused(clean: Path, tmp_path: Path) -> None:
    from hyper_parallel.components.dataloader._prepared import PreparedDataError

    folder = Path(shutil.copytree(clean, tmp_path / "prep"))
    offsets_file = folder / "shard-00000" / "offsets.npy"
    offsets = np.load(offsets_file)
    offsets[1] = offsets[-1] + 10  # a document past the end, then offsets going back
    np.save(offsets_file, offsets)
    manifest = json.loads((folder / "manifest.json").read_text())
    size = offsets_file.stat().st_size
    entry = manifest["shards"][0]["files"]["offsets"]
    entry.update(size=size, sha256=file_digest(offsets_file), quick=_quick_digest(offsets_file, size))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    dataset = TokenizedSource(paths=(str(folder),))
    cfg = TextDataLoader.Config(num_workers=0, pin_memory=False, dataset=dataset)
    request = LoaderRequest(ByteTokenizer.Config().build(), 0, 1, seq_len=16, micro_batch_size=2, seed=3)
    with pytest.raises(PreparedDataError) as info:
        cfg.build(request)
    assert str(info.value) == (
        f"{folder / 'shard-00000'}: dataset.paths: offsets.npy decreases somewhere: documents would overlap"
    )


@pytest.mark.timeout(60)  # the former glob never ended here
def test_a_glob_never_follows_links_to_folders(tmp_path: Path) -> None:
    """Two links back up the tree made ``glob(recursive=True)`` walk 2^40 paths; they are not entered."""
    from hyper_parallel.data.prepare import find_inputs

    data = tmp_path / "data" / "inner"
    data.mkdir(parents=True)
    write_jsonl(data / "train.jsonl", 3)
    (data / "up").symlink_to("..")
    (data / "self").symlink_to(".")
    (tmp_path / "data" / "linked.jsonl").symlink_to(data / "train.jsonl")  # a link to a file is an input
    found = find_inputs([f"{tmp_path}/data/**/*.jsonl"], None)
    assert found == [
        (tmp_path / "data" / "inner" / "train.jsonl", "jsonl"),
        (tmp_path / "data" / "linked.jsonl", "jsonl"),
    ]
    assert find_inputs([f"{tmp_path}/data/*/train.jsonl"], None) == [(data / "train.jsonl", "jsonl")]


def test_prepare_refuses_a_folder_another_prepare_is_writing(tmp_path: Path) -> None:
    import fcntl
    import os

    from tests.support.prepared import run_prepare

    data = write_jsonl(tmp_path / "train.jsonl", 3)
    output = tmp_path / "out"
    output.mkdir()
    held = os.open(output / ".prepare.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running prepare holds it
        status, _, err = run_prepare(
            "prepare", data, "--output", output, "--config-file", tokenizer_config(tmp_path / "cfg")
        )
    finally:
        os.close(held)
    assert status == 2
    assert (
        err
        == f"{output}: another prepare is writing this folder; wait for it to end or give another --output\n"
    )
    assert sorted(p.name for p in output.iterdir()) == [".prepare.lock"]  # nothing written
    assert prepare([data], output, tokenizer_config(tmp_path / "cfg")) == output  # free again: it runs


@pytest.mark.timeout(60)  # backtracking took C(90, 30) steps here (N16)
def test_a_pattern_of_many_double_stars_matches_in_polynomial_time() -> None:
    from hyper_parallel.data.prepare import _parts_match

    assert not _parts_match(("**",) * 30 + ("y",), ("a",) * 60)
    assert _parts_match(("**",) * 30 + ("y",), ("a",) * 60 + ("y",))
    assert not _parts_match(("**", "*.jsonl"), (".hidden", "x.jsonl"))


def test_a_full_disk_during_prepare_is_one_line_exit_2_and_keeps_the_finished_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N10: the second shard's write fails with ENOSPC (injected at ``np.save``, the call that writes)."""
    import errno
    import os

    from hyper_parallel.data import shards
    from tests.support.prepared import run_prepare

    data = [write_jsonl(tmp_path / f"part{i}.jsonl", 40, start=40 * i) for i in range(2)]
    config = tokenizer_config(tmp_path / "cfg")
    output = tmp_path / "out"
    real_save = np.save

    def save(handle: Any, array: Any, **kwargs: Any) -> None:
        if Path(handle.name).parent.name == ".shard-00001.tmp":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(handle, array, **kwargs)

    monkeypatch.setattr(shards.np, "save", save)
    argv = ["prepare", *data, "--output", output, "--config-file", config, "--shard-mb", "0.001"]
    status, out, err = run_prepare(*argv)
    assert (status, out) == (2, "")
    assert err.splitlines()[-1] == (
        f"{output / 'shard-00001'}: no space left on device (ENOSPC); the shards finished so far are kept: "
        "free space and run the same command again to continue"
    )
    assert "Traceback" not in err
    assert not (output / ".shard-00001.tmp").exists()  # the half-written shard gives its space back
    kept = (output / "shard-00000" / "tokens.npy").stat().st_ino
    monkeypatch.undo()
    status, out, err = run_prepare(*argv)
    assert status == 0, err
    assert (output / "shard-00000" / "tokens.npy").stat().st_ino == kept  # not written again


# -- work linear in the input, however it is shaped (N16) ---------------------------------------------------
def _glob_steps(tmp_path: Path, depth: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Component matches a ``**`` glob makes over a chain of ``depth`` folders, each holding one file."""
    from hyper_parallel.data import prepare as module

    root = tmp_path / f"chain{depth}"
    folder = root
    for _ in range(depth):
        folder = folder / "d"
        folder.mkdir(parents=True)
        (folder / "x.txt").write_text("x\n")
    calls = [0]
    original = module._component_matches

    def counted(pattern: str, name: str) -> bool:
        calls[0] += 1
        return original(pattern, name)

    monkeypatch.setattr(module, "_component_matches", counted)
    found = module.find_inputs([f"{root}/**/d/*.txt"], None)
    monkeypatch.undo()
    assert len(found) == depth
    return calls[0]


def test_a_deep_tree_costs_the_glob_work_linear_in_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Matching each entry's whole path again cost depth^2 component matches (16x for 4x the depth)."""
    small, large = (_glob_steps(tmp_path, depth, monkeypatch) for depth in (40, 160))
    assert large / small < 4.5, (small, large)


def test_cutting_a_file_at_every_line_searches_each_byte_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1-byte cut (``--shard-mb`` tiny) counted every block from its start at each cut: lines^2 bytes."""
    from hyper_parallel.data import prepare as module

    searched = [0]
    original = module._newlines

    def counted(block: bytes, begin: int, end: int) -> int:
        searched[0] += end - begin
        return original(block, begin, end)

    monkeypatch.setattr(module, "_newlines", counted)
    for lines in (1000, 4000, 300_000):  # the last spans a second 1 MiB block
        path = tmp_path / f"{lines}.jsonl"
        path.write_bytes(b"{}\n" * lines)
        searched[0] = 0
        _, pieces = module._scan_lines(path, 1)
        assert searched[0] == path.stat().st_size
        assert [p.first_line for p in pieces[:3]] == [1, 2, 3]
        assert pieces[-1].first_line == lines
        assert len(pieces) == lines
