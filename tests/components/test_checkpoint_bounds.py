"""Declared sizes never decide memory: a ``.metadata`` is checked against what its folder stores.

One tiny Llama 3 run (checkpoints at steps 1 and 2) is made once for the module; each test copies its
folder and plants one fault into step 2 with a manifest forged to match (so only the new checks can find
it): sizes the stored chunks do not tile, a 64 GiB declaration, a JSON part of another kind, values of the
wrong types, a tensor chunk that is a pickle, a config describing another model. Resume skips the step
for step 1 with a warning naming the file; export and generate refuse it with ``FILE: tensor NAME: ...``
and exit 2; nothing is exported that the checkpoint did not store.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from hyper_parallel.components.checkpoint._bounds import MAX_JSON_BYTES, _overlap  # noqa: E402
from hyper_parallel.components.checkpoint._manifest import write_manifest  # noqa: E402
from hyper_parallel.components.checkpoint._safe_read import read_metadata  # noqa: E402
from hyper_parallel.export import main as export_main  # noqa: E402
from hyper_parallel.export import read_checkpoint  # noqa: E402
from tests.support.damaged_checkpoint import resume_warnings, rewrite, save_two_steps  # noqa: E402

SHARD = "__0_0.distcp"
NORM = "model.norm.weight"
EMBED = "model.tok_embeddings.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint folder with the full checkpoints of steps 1 and 2 of a tiny run."""
    return save_two_steps(tmp_path_factory.mktemp("bounds") / "ckpt")


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    """A copy of the module's checkpoint folder, for one test to damage."""
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def _declare(key: str, size: list[int], chunk_sizes: list[int] | None = None) -> Callable[[Metadata], None]:
    """A change declaring ``key`` of ``size`` (and its one chunk of ``chunk_sizes`` when given)."""

    def change(metadata: Metadata) -> None:
        item = metadata.state_dict_metadata[key]
        assert isinstance(item, TensorStorageMetadata)
        item.size = torch.Size(size)
        if chunk_sizes is not None:
            (chunk,) = item.chunks
            item.chunks = [ChunkStorageMetadata(offsets=chunk.offsets, sizes=torch.Size(chunk_sizes))]

    return change


def _set(key: str, attribute: str, value: Any) -> Callable[[Metadata], None]:
    def change(metadata: Metadata) -> None:
        item = metadata.state_dict_metadata[key]
        if attribute == "dtype":
            item.properties.dtype = value  # type: ignore[union-attr]
        else:
            setattr(item, attribute, value)

    return change


def _chunk_outside(metadata: Metadata) -> None:
    item = metadata.state_dict_metadata[NORM]
    assert isinstance(item, TensorStorageMetadata)
    item.chunks = [ChunkStorageMetadata(offsets=torch.Size([8]), sizes=item.chunks[0].sizes)]


def _stored_transformed(metadata: Metadata) -> None:
    """The chunk of ``model.norm.weight`` stored "transformed" by a number (a list of names in DCP)."""
    index = MetadataIndex(NORM, [0])
    metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], transform_descriptors=5)


#: name -> (change to step 2's .metadata, the problem after "STEP/.metadata: ").
HOSTILE: dict[str, tuple[Callable[[Metadata], None], str]] = {
    "declared larger than stored (N2)": (
        _declare(NORM, [4096]),
        f"tensor {NORM}: its chunks hold 64 of the 4096 elements its declared size [4096] has",
    ),
    "64 GiB declared with its chunk (N1)": (
        _declare(EMBED, [1 << 28, 64], [1 << 28, 64]),
        f"tensor {EMBED}: chunk at [0, 0] declares 68719476736 bytes of torch.float32 and stores ",
    ),
    "a chunk outside its tensor": (
        _chunk_outside,
        f"tensor {NORM}: chunk at [8] of size [64] lies outside its declared size [64]",
    ),
    "a JSON part declared as 2 GiB": (
        _declare("step", [1 << 31], [1 << 31]),
        f"tensor step: declared torch.uint8 of size [2147483648], where the trainer saves 1-D torch.uint8 "
        f"JSON of at most {MAX_JSON_BYTES} bytes",
    ),
    "a JSON part of floats": (
        _set("rng.rank0", "dtype", torch.float32),
        "tensor rng.rank0: declared torch.float32 of size [",
    ),
    "a size that is text": (_set(NORM, "size", "64"), f"tensor {NORM}: its size is a str, not a size"),
    "a dtype that is text": (
        _set(NORM, "dtype", "float32"),
        f"tensor {NORM}: its dtype is a str, not a torch.dtype",
    ),
    "a transform that is a number": (
        _stored_transformed,
        f"tensor {NORM}: chunk at [0] is stored transformed (5)",
    ),
    "negative sizes": (
        _set(NORM, "size", torch.Size([-64])),
        f"tensor {NORM}: its size [-64] is not a list of non-negative integers",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_declaration_is_refused_by_export_before_any_allocation(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    change, problem = HOSTILE[case]
    step = ckpt / "step-2"
    rewrite(step, change)
    assert export_main([str(step), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"export: {str(step)!r} is damaged: {step / '.metadata'}: {problem}")
    assert err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("case", ["declared larger than stored (N2)", "a JSON part declared as 2 GiB"])
def test_resume_skips_a_hostile_step_for_the_older_intact_one(
    ckpt: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    change, problem = HOSTILE[case]
    rewrite(ckpt / "step-2", change)
    warnings = resume_warnings(ckpt, caplog)
    assert f"skipping the checkpoint of step 2: {ckpt / 'step-2' / '.metadata'}: {problem}" in warnings


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_64_gib_declaration_is_refused_under_a_3_gib_address_space_cap(ckpt: Path, tmp_path: Path) -> None:
    change, problem = HOSTILE["64 GiB declared with its chunk (N1)"]
    step = ckpt / "step-2"
    rewrite(step, change)
    cap = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        "sys.argv = ['export', sys.argv[1], sys.argv[2]]; runpy.run_module('hyper_parallel.export', "
        "run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", cap, str(step), str(tmp_path / "hf")],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    assert f"{step / '.metadata'}: {problem}" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_export_holds_only_values_the_checkpoint_stored(ckpt: Path, tmp_path: Path) -> None:
    """Read back: every exported tensor equals the stored one, read by DCP into NaN-filled tensors."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict_loader import load

    from hyper_parallel.export import export_checkpoint

    step = ckpt / "step-2"
    out = export_checkpoint(step, tmp_path / "hf")
    metadata = read_metadata(step / ".metadata")
    stored = {
        key: torch.full(item.size, float("nan"), dtype=item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    load(stored, checkpoint_id=str(step), no_dist=True)
    _, cfg, ours = read_checkpoint(step)
    hf = cfg.model.state_dict_adapter(cfg.model.args).to_hf(
        {k.removeprefix("model."): v for k, v in stored.items()}
    )
    exported = load_file(str(out / "model.safetensors"))
    assert set(exported) <= set(hf)
    for name, tensor in exported.items():
        assert not tensor.isnan().any(), name
        assert torch.equal(tensor, hf[name]), name
    assert all(torch.equal(ours[k.removeprefix("model.")], v) for k, v in stored.items())


# -- a step that fails when read falls back (N7), a live folder is listed again (N9) --------------------
class Payload:
    """Unpickling this runs ``touch MARKER``: the file exists only if a loader ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def plant_pickle_chunk(step: Path, marker: Path) -> Path:
    """Overwrite the stored chunk of ``model.norm.weight`` with a pickle payload; forge the manifest."""
    metadata = read_metadata(step / ".metadata")
    info = metadata.storage_data[MetadataIndex(NORM, [0])]
    payload = pickle.dumps(Payload(marker))
    assert len(payload) <= info.length
    shard = step / info.relative_path
    with open(shard, "r+b") as stream:
        stream.seek(info.offset)
        stream.write(payload.ljust(info.length, b"\0"))
    write_manifest(step)
    return shard


def test_a_chunk_that_is_a_pickle_skips_the_step_on_resume_and_export(
    ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "ran"
    shard = plant_pickle_chunk(ckpt / "step-2", marker)
    step, _, _ = read_checkpoint(ckpt)  # export, generate: the newest step that reads
    assert step == ckpt / "step-1"
    assert (
        f"skipping the damaged checkpoint step-2: {shard}: cannot be read (UnpicklingError: " in caplog.text
    )
    caplog.clear()
    warnings = resume_warnings(ckpt, caplog)
    assert f"skipping the checkpoint of step 2: {shard}: cannot be read (UnpicklingError: " in warnings
    assert not marker.exists()


def test_a_step_pruned_while_it_is_read_makes_the_reader_list_the_folder_again(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import hyper_parallel.export as export

    original = export._read_model
    calls: list[Path] = []

    def racing(step: Path, metadata: Any) -> Any:
        calls.append(step)
        if len(calls) == 1:  # the run publishes step 3 and prunes step 2 while we read it
            shutil.copytree(step, ckpt / "step-3")
            shutil.rmtree(step)
        return original(step, metadata)

    monkeypatch.setattr(export, "_read_model", racing)
    step, _, weights = read_checkpoint(ckpt)
    assert calls == [ckpt / "step-2", ckpt / "step-3"]
    assert step == ckpt / "step-3"
    assert weights
    assert "step-2 was removed while it was read: reading the newest step again" in caplog.text
    assert "damaged" not in caplog.text


# -- models are sized by their weights (N3) -----------------------------------------------------------------
def test_a_config_with_more_layers_than_the_weights_is_refused_before_building(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = ckpt / "step-2"
    config = tmp_path / "huge.yaml"
    text = (step / "config.yaml").read_text()
    assert "n_layers: 2\n" in text
    config.write_text(text.replace("n_layers: 2\n", "n_layers: 100000\n"))
    assert export_main([str(step), str(tmp_path / "hf"), "--config-file", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"export: {step / '.metadata'}: its config describes a model of ")
    assert " parameters and the weights store " in err
    assert err.count("\n") == 1


def test_a_config_of_another_shape_names_the_tensor(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = ckpt / "step-2"
    config = tmp_path / "narrow.yaml"
    text = (step / "config.yaml").read_text()
    config.write_text(text.replace("n_layers: 2\n", "n_layers: 1\n"))
    assert export_main([str(step), str(tmp_path / "hf"), "--config-file", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"export: {step / '.metadata'}: tensor model.layers.1.attention.wk.weight (and 8 more): saved, and "
        "the config's model has no such tensor\n"
    )
    config.write_text(text.replace("vocab_size: 512\n", "vocab_size: 300\n"))
    assert export_main([str(step), str(tmp_path / "hf"), "--config-file", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"export: {step / '.metadata'}: tensor {EMBED}: saved of size [512, 64], the config's model has "
        "[300, 64]\n"
    )


# -- the tiling check itself --------------------------------------------------------------------------------
Box = tuple[tuple[int, ...], tuple[int, ...]]


@pytest.mark.parametrize(
    ("boxes", "pair"),
    [
        ([((0, 0), (2, 4)), ((2, 0), (2, 4))], None),  # rows (FSDP)
        ([((0, 0), (4, 2)), ((0, 2), (4, 2))], None),  # columns (tensor parallel)
        ([((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2)), ((2, 2), (2, 2))], None),  # a grid
        ([((0, 0), (3, 3)), ((2, 2), (2, 2))], (0, 1)),
        ([((0, 0), (4, 2)), ((0, 1), (4, 2))], (0, 1)),
        ([((0,), (4,)), ((4,), (0,)), ((1,), (2,))], (0, 2)),
    ],
)
def test_overlapping_chunks_are_found(boxes: list[Box], pair: tuple[int, int] | None) -> None:
    assert _overlap(boxes) == pair


def test_generate_refuses_a_config_json_larger_than_its_safetensors_before_building(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from hyper_parallel.export import export_checkpoint
    from hyper_parallel.generate import main as generate_main

    out = export_checkpoint(ckpt / "step-2", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    config["num_hidden_layers"] = 100000
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert generate_main([str(out), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"generate: {str(out / 'config.json')!r}: its config describes a model of ")
    assert err.count("\n") == 1


def test_evaluate_refuses_a_config_larger_than_the_checkpoint_before_building(ckpt: Path) -> None:
    from hyper_parallel.evaluate import main as evaluate_main

    step = ckpt / "step-2"
    flags = ["--validator.dataset.source", "synthetic", "--validator.steps", "1"]
    argv = ["--config-file", str(step / "config.yaml"), "--checkpoint", str(step), *flags]
    out, err = io.StringIO(), io.StringIO()
    assert evaluate_main([*argv, "--model.overrides.n_layers", "100000"], out=out, err=err) == 2
    assert err.getvalue().startswith(f"evaluate: {step / '.metadata'}: its config describes a model of ")
    assert err.getvalue().count("\n") == 1
    assert out.getvalue() == ""


# -- command-line values that ended in tracebacks or waited (N12) -------------------------------------------
@pytest.mark.timeout(60)  # reading a FIFO waits for a writer that never comes
def test_export_and_generate_values_are_one_line_and_exit_2(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hyper_parallel.generate import main as generate_main

    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    step = str(ckpt / "step-2")
    fifo_text = f"config file {str(fifo)!r} is not a regular file"
    cases = [
        (
            export_main,
            [step, str(tmp_path / "a"), "--max-shard-size", "9" * 400 + "GB"],
            "export: max_shard_size: ",
        ),
        (export_main, [step, str(tmp_path / "b"), "--config-file", str(fifo)], f"export: {fifo_text}"),
        (generate_main, [step, "--prompt", "x", "--config-file", str(fifo)], f"generate: {fifo_text}"),
        (
            generate_main,
            [step, "--prompt", "x", "--device", "foo"],
            "generate: --device: 'foo' is not a torch",
        ),
        (
            generate_main,
            [step, "--prompt", "x", "--seed", "9" * 30],
            "generate: --seed: must be in [0, 2**63)",
        ),
    ]
    capsys.readouterr()
    for main, argv, start in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(start), err
        assert err.count("\n") == 1


def test_without_a_manifest_a_flipped_byte_in_a_chunk_falls_back_on_resume(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A step saved before manifests: the CRC-32 of torch's zip records finds the change (N19)."""
    step = ckpt / "step-2"
    (step / "checksums.json").unlink()
    info = read_metadata(step / ".metadata").storage_data[MetadataIndex(EMBED, [0, 0])]
    shard = step / info.relative_path
    with open(shard, "r+b") as stream:
        stream.seek(info.offset + info.length // 2)
        byte = stream.read(1)
        stream.seek(info.offset + info.length // 2)
        stream.write(bytes([byte[0] ^ 0xFF]))
    warnings = resume_warnings(ckpt, caplog)
    assert (
        f"skipping the checkpoint of step 2: {shard}: record archive/data/0 at byte {info.offset} is damaged "
        "(Bad CRC-32 for file 'archive/data/0')"
    ) in warnings


def test_a_full_disk_during_export_is_one_line_and_publishes_nothing(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """N10: the write fails with ENOSPC (``safetensors`` made to fail as a full disk makes it)."""
    import errno

    import safetensors.torch

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[1]))

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "hf"
    assert export_main([str(ckpt / "step-2"), str(out)]) == 2
    assert capsys.readouterr().err == (
        f"export: {str(out)!r}: no space left on device (ENOSPC); nothing was published: "
        "free space or choose another output folder\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # neither OUT nor its partial folder


def test_a_full_disk_when_the_lock_is_written_is_an_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from hyper_parallel.components.checkpoint._layout import CheckpointFolderError, lock_folder

    def full(fd: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(CheckpointFolderError) as info:
        lock_folder(tmp_path / "ckpt")
    assert str(info.value) == (
        f"{tmp_path / 'ckpt' / '.lock'}: checkpoint.folder: cannot write the lock file: no space left on "
        "device (ENOSPC)"
    )
    monkeypatch.undo()
    lock_folder(tmp_path / "ckpt").release()  # nothing held: the folder is free


# -- evaluate searches a folder as export does: a step failing when read falls back (N7, N9) ----------------
EVALUATE_FLAGS = ["--validator.dataset.source", "synthetic", "--validator.steps", "1", "--json"]


def _evaluate(saved: Path, checkpoint: Path) -> tuple[int, str, str]:
    """``evaluate --checkpoint CHECKPOINT --json`` with the run's config: (status, stdout, stderr)."""
    from hyper_parallel.evaluate import main as evaluate_main

    config = saved / "step-1" / "config.yaml"
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config-file", str(config), "--checkpoint", str(checkpoint), *EVALUATE_FLAGS]
    status = evaluate_main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def evaluated(saved: Path) -> dict[int, str]:
    """What ``evaluate`` prints for each intact step (they differ, so the step used can be told)."""
    printed = {}
    for step in (1, 2):
        status, out, err = _evaluate(saved, saved / f"step-{step}")
        assert status == 0, err
        printed[step] = out
    assert printed[1] != printed[2]
    return printed


def _truncate_once_inspected(monkeypatch: pytest.MonkeyPatch, step: Path) -> Path:
    """Cut the shard holding ``step``'s embedding in the middle of it, just after the step's inspection
    passed (a file truncated under the reader, after the folder was listed and checked); the shard."""
    import hyper_parallel.components.checkpoint._manager as manager

    info = read_metadata(step / ".metadata").storage_data[MetadataIndex(EMBED, [0, 0])]
    shard = step / info.relative_path
    original = manager.inspect

    def inspect_then_truncate(folder: Path, **kwargs: Any) -> Any:
        inspection = original(folder, **kwargs)
        if folder == step:
            os.truncate(shard, info.offset + info.length // 2)
        return inspection

    monkeypatch.setattr(manager, "inspect", inspect_then_truncate)
    return shard


def _our_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings of our loggers (DCP logs its own failed reads as errors)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("hyper_parallel")
    ]


@pytest.mark.parametrize("fault", ["a chunk that is a pickle", "a shard truncated after the listing"])
def test_evaluate_skips_a_step_that_fails_when_read_for_the_older_one(
    saved: Path,
    ckpt: Path,
    evaluated: dict[int, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fault: str,
) -> None:
    marker = tmp_path / "ran"
    if fault == "a chunk that is a pickle":
        shard = plant_pickle_chunk(ckpt / "step-2", marker)
        problem = (
            f"{shard}: cannot be read (UnpicklingError: a pickle that is not a saved tensor, refused by "
            "torch's weights-only loader)"
        )
    else:
        shard = _truncate_once_inspected(monkeypatch, ckpt / "step-2")
        problem = (
            f"{shard}: cannot be read (RuntimeError: PytorchStreamReader failed reading zip archive: "
            "failed finding central directory)"
        )
    with caplog.at_level(logging.WARNING):
        status, out, err = _evaluate(saved, ckpt)
    assert (status, err) == (0, "")
    assert out == evaluated[1]  # step 1's weights, not step 2's
    warnings = _our_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings == [f"skipping the damaged checkpoint step-2: {problem}"]
    assert not marker.exists()


def test_evaluate_of_a_folder_with_no_readable_step_is_one_line_and_exit_2(
    saved: Path, ckpt: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shards = [plant_pickle_chunk(ckpt / f"step-{n}", tmp_path / "ran") for n in (1, 2)]
    with caplog.at_level(logging.WARNING):
        status, out, err = _evaluate(saved, ckpt)
    problems = [f"{shard}: cannot be read (UnpicklingError: " for shard in reversed(shards)]
    assert (status, out) == (2, "")
    assert err.startswith(f"evaluate: {str(ckpt)!r}: no intact checkpoint to evaluate ({problems[0]}")
    assert f"; {problems[1]}" in err
    assert err.count("\n") == 1
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping")]
    assert [line.split(":")[0] for line in skipped] == [
        "skipping the damaged checkpoint step-2",
        "skipping the damaged checkpoint step-1",
    ]
    # A step folder given directly is not searched past: its own problem is the error.
    status, out, err = _evaluate(saved, ckpt / "step-2")
    assert (status, out) == (2, "")
    assert err.startswith(f"evaluate: {str(ckpt / 'step-2')!r} is damaged: {problems[0]}")
    assert err.count("\n") == 1


def test_evaluate_lists_the_folder_again_when_the_step_it_reads_is_pruned(
    saved: Path,
    ckpt: Path,
    evaluated: dict[int, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hyper_parallel.components.checkpoint._manager import CheckpointManager

    original = CheckpointManager.load_model_from
    calls: list[Path] = []

    def racing(self: CheckpointManager, step: Path) -> None:
        calls.append(step)
        if len(calls) == 1:  # the run publishes step 3 (step 2's weights) and prunes step 2 meanwhile
            shutil.copytree(step, ckpt / "step-3")
            shutil.rmtree(step)
        original(self, step)

    monkeypatch.setattr(CheckpointManager, "load_model_from", racing)
    with caplog.at_level(logging.WARNING):
        status, out, err = _evaluate(saved, ckpt)
    assert (status, err) == (0, "")
    assert calls == [ckpt / "step-2", ckpt / "step-3"]
    assert out == evaluated[2]
    assert _our_warnings(caplog) == [
        f"{ckpt / 'step-2'} was removed while it was read: reading the newest step again"
    ]


def _staggered(rows: int, *, overlap: bool = False) -> tuple[list[Box], tuple[int, int]]:
    """A ``rows x rows`` tensor, each row cut at its own column (the layout a sweep is slowest on)."""
    boxes: list[Box] = []
    for r in range(rows):
        cut = 1 + r % (rows - 1)
        boxes += [((r, 0), (1, cut)), ((r, cut), (1, rows - cut))]
    if overlap:
        boxes[-1] = ((rows - 1, 0), (1, rows))  # the last row whole, over its first piece
    return boxes, (rows, rows)


@pytest.mark.parametrize(
    ("boxes", "size", "exact"),
    [
        ([((0, 0), (2, 4)), ((2, 0), (2, 4))], (4, 4), True),
        ([((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2)), ((2, 2), (2, 2))], (4, 4), True),
        ([((0, 0), (3, 3)), ((2, 2), (2, 2))], (4, 4), False),
        ([((0, 0), (4, 2)), ((0, 1), (4, 2))], (4, 4), False),  # as many elements, overlapping: not a tiling
        ([((0,), (2,)), ((2,), (0,)), ((2,), (2,))], (4,), True),  # an empty chunk counts for nothing
        ([((0, 0, 0), (1, 2, 2)), ((1, 0, 0), (1, 2, 2))], (2, 2, 2), True),
        ([((0, 0, 0), (2, 2, 2)), ((0, 0, 0), (1, 1, 1))], (2, 2, 2), False),
        (*_staggered(8), True),
        (*_staggered(8, overlap=True), False),
    ],
)
def test_a_tiling_is_told_from_its_signed_corners(
    boxes: list[Box], size: tuple[int, ...], exact: bool
) -> None:
    from hyper_parallel.components.checkpoint._bounds import tiles

    assert tiles(boxes, size) is exact


def test_a_staggered_hostile_layout_is_checked_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of staggered chunks (each row cut at its own column): the exact tiling passes without the
    sweep (about n^2 / 4 comparisons there), in CPU time linear in the chunks; an overlap among them is
    refused, the sweep that names the pair held to its budget."""
    from hyper_parallel.components.checkpoint import _bounds

    def no_sweep(boxes: list[Box], budget: int | None = None) -> None:
        raise AssertionError("a valid tiling needs no sweep")

    monkeypatch.setattr(_bounds, "_overlap", no_sweep)
    seconds = []
    for rows in (1000, 4000):
        boxes, size = _staggered(rows)
        started = time.process_time()
        assert _bounds.tiles(boxes, size) is True
        seconds.append(time.process_time() - started)
    assert seconds[1] < 8 * max(seconds[0], 1e-3)  # 4x the chunks: about 4x the work (a sweep: 16x)
    monkeypatch.undo()
    bad, size = _staggered(4000, overlap=True)
    assert _bounds.tiles(bad, size) is False
    assert _bounds._overlap(bad, budget=100) is None  # gave up naming the pair within its budget
    assert _bounds._overlap(bad) is not None


def test_chunks_split_along_more_dimensions_than_checked_are_refused() -> None:
    """The tiling check costs 2^split per chunk: a layout split along 9 dimensions (no trainer makes one)
    is refused rather than checked for 512 corners per chunk."""
    from hyper_parallel.components.checkpoint._bounds import MAX_SPLIT_DIMS, _Refused, tiles

    size = (2,) * (MAX_SPLIT_DIMS + 1)
    halves = [((0,) * d + (1,) + (0,) * (len(size) - d - 1), (2,) * d + (1,) + (2,) * (len(size) - d - 1))
              for d in range(len(size))]  # fmt: skip
    with pytest.raises(_Refused) as caught:
        tiles(halves, size)
    assert str(caught.value) == "its chunks are split along 9 dimensions (at most 8)"
    assert tiles([*halves[:1], ((0,) * len(size), (1,) + (2,) * (len(size) - 1))], size) is True
