"""A checkpoint folder is data: nothing in it runs, and a damaged step is skipped for the newest intact one.

Faults are planted into the checkpoints of a tiny run (steps 2 and 4): a pickle payload in ``.metadata``
or in a non-tensor item (a marker file would appear if it ran), 4 KiB of 0xff in a shard, a truncated or
empty ``.metadata``, a missing shard, checkpoints saved before checksums existed. Resume, the
``initial_load_path`` load and export must each refuse the payload, name the file, and resume the intact
step when there is one; with none, the launch exits 1 with one line and no traceback.
"""

import io
import json
import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from hyper_parallel.components.checkpoint import CheckpointNotResumableError, DCPCheckpoint  # noqa: E402
from hyper_parallel.components.checkpoint._manifest import MANIFEST, write_manifest  # noqa: E402
from hyper_parallel.components.checkpoint._state import decode_json  # noqa: E402
from hyper_parallel.components.dataloader import JsonlSource, LoaderRequest, TextDataLoader  # noqa: E402
from hyper_parallel.components.loss import CausalLMLoss  # noqa: E402
from hyper_parallel.components.lr_scheduler import WarmupDecay  # noqa: E402
from hyper_parallel.components.optimizer import AdamW  # noqa: E402
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from hyper_parallel.export import ExportError, export_checkpoint  # noqa: E402
from tests.support.components import TinyLM, train_tokenizer, write_jsonl  # noqa: E402
from tests.support.trainer import as_flags, debug_config_path, tiny_overrides  # noqa: E402

SHARD = "__0_0.distcp"
SINGLE_PROCESS_SAVE = "ignore:torch.distributed is disabled:UserWarning"  # these tests save without a group
MANAGER_LOG = "hyper_parallel.components.checkpoint._manager"


class Tally:
    """A trainer-side stateful, so that every per-rank part is saved."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = state["steps"]


class Run:
    """A tiny model, AdamW, the real scheduler and data loader, checkpointed to ``tmp/ckpt``."""

    def __init__(self, tmp: Path, **ckpt: Any) -> None:
        tok = HuggingFaceTokenizer.Config(path=str(tmp / "tok")).build()
        torch.manual_seed(0)
        self.model = TinyLM(tok.vocab_size)
        self.optimizer = AdamW.Config(lr=0.05).build(self.model)
        self.scheduler = WarmupDecay.Config(warmup_steps=2).build(self.optimizer, 8)
        data = TextDataLoader.Config(num_workers=0, dataset=JsonlSource(paths=(str(tmp / "train.jsonl"),)))
        self.loader = data.build(LoaderRequest(tok, 0, 1, seq_len=6, micro_batch_size=2, seed=3))
        self.tally = Tally()
        config = {"enable": True, "folder": str(tmp / "ckpt"), "interval": 2, "keep_latest_k": 0, **ckpt}
        self.ckpt = DCPCheckpoint.Config(**config).build(
            self.model, self.optimizer, self.scheduler, self.loader, train_state=self.tally, max_steps=8
        )

    def train(self, first: int, last: int) -> list[float]:
        loss_fn, batches, losses = CausalLMLoss.Config().build(), iter(self.loader), []
        for step in range(first, last + 1):
            batch = next(batches)
            loss = loss_fn(self.model(batch["input_ids"]), batch["labels"])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.tally.steps += 1
            losses.append(loss.item())
            self.ckpt.maybe_save(step)
        return losses


class Payload:
    """Unpickling this runs ``touch MARKER``: the file exists only if a loader ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    train_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "train.jsonl", 30)
    Run(tmp_path).train(1, 4)  # full checkpoints at steps 2 and 4
    return tmp_path


def step_dir(tmp: Path, step: int) -> Path:
    return tmp / "ckpt" / f"step-{step}"


def plant_metadata_payload(folder: Path, marker: Path) -> None:
    """A ``.metadata`` that runs a command when unpickled, with a manifest forged to match it."""
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(folder)


def resumed_after(tmp: Path, caplog: pytest.LogCaptureFixture) -> int:
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOG):
        return Run(tmp).ckpt.load()


# -- checkpoints are data ----------------------------------------------------------------------------------
def test_a_metadata_payload_is_refused_and_the_previous_step_resumed(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp / "ran"
    plant_metadata_payload(step_dir(tmp, 4), marker)
    assert resumed_after(tmp, caplog) == 2
    assert not marker.exists()
    assert (
        f"skipping the checkpoint of step 4: {step_dir(tmp, 4) / '.metadata'}: refused to unpickle global "
        "posix.system: a checkpoint's .metadata may only hold torch.distributed.checkpoint metadata"
    ) in caplog.text


def test_a_metadata_payload_is_refused_by_initial_load_path_and_export(tmp: Path) -> None:
    marker = tmp / "ran"
    source = step_dir(tmp, 4)
    plant_metadata_payload(source, marker)
    refused = f"{source / '.metadata'}: refused to unpickle global posix.system"
    with pytest.raises(CheckpointNotResumableError) as info:
        Run(tmp, folder=str(tmp / "new"), initial_load_path=str(source)).ckpt.load()
    assert str(info.value).startswith(f"checkpoint.initial_load_path {str(source)!r} is damaged: {refused}")
    with pytest.raises(ExportError) as exported:
        export_checkpoint(source, tmp / "hf")
    assert str(exported.value).startswith(f"{str(source)!r} is damaged: {refused}")
    assert not marker.exists()
    assert not (tmp / "hf").exists()


@pytest.mark.filterwarnings(SINGLE_PROCESS_SAVE)
@pytest.mark.parametrize("part", ["step", "lr_scheduler", "dataloader", "rng", "train_state"])
def test_a_pickled_payload_in_a_former_json_item_is_refused(
    tmp: Path, part: str, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp / "ran"
    state = Run(tmp).ckpt.state.full(6)
    state[part] = {"rank0": Payload(marker)} if isinstance(state[part], dict) else Payload(marker)
    folder = step_dir(tmp, 6)  # the layout of earlier versions: pickled items, no manifest
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    assert resumed_after(tmp, caplog) == 4  # refused when read: skipped like a step failing inspection
    key = f"{part}.rank0" if part in ("dataloader", "rng", "train_state") else part
    assert f"skipping the checkpoint of step 6: {folder / SHARD}: refused item {key!r}: " in caplog.text
    with pytest.raises(CheckpointNotResumableError) as info:  # named explicitly: refused, naming the file
        Run(tmp, load_step=6).ckpt.load()
    assert str(info.value).startswith(
        f"checkpoint.load_step 6: the checkpoint is damaged: {folder / SHARD}: refused item {key!r}: "
    )
    assert not marker.exists()


@pytest.mark.filterwarnings(SINGLE_PROCESS_SAVE)
def test_a_checkpoint_of_an_earlier_version_still_resumes_with_a_warning(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    straight = Run(tmp, folder=str(tmp / "straight")).train(1, 6)
    source = Run(tmp, folder=str(tmp / "old"))
    source.train(1, 4)
    state = source.ckpt.state.full(4)  # saved as earlier versions did: JSON strings, no manifest

    def as_text(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: as_text(v) for k, v in value.items()}
        return json.dumps(decode_json(value))

    for part in ("step", "lr_scheduler", "dataloader", "rng", "train_state"):
        state[part] = as_text(state[part])
    shutil.rmtree(tmp / "old")
    dcp.save(state, checkpoint_id=str(tmp / "old" / "step-4"), no_dist=True)
    resumed = Run(tmp, folder=str(tmp / "old"))
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOG):
        assert resumed.ckpt.load() == 4
    assert resumed.tally.steps == 4
    assert "holds no checksums.json (saved by an older version): loading it without verifying" in caplog.text
    assert resumed.train(5, 6) == straight[4:]  # bitwise: every part was restored from the strings


# -- integrity ----------------------------------------------------------------------------------------------
def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp: Path) -> None:
    folder = step_dir(tmp, 4)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["algorithm"] == "sha256"
    assert set(manifest["files"]) == {p.name for p in folder.iterdir()} - {MANIFEST}
    assert {".metadata", SHARD} <= set(manifest["files"])
    assert manifest["files"][SHARD]["size"] == (folder / SHARD).stat().st_size


def test_4_kib_of_0xff_in_a_shard_skips_that_step_and_resumes_the_previous(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = step_dir(tmp, 4) / SHARD
    assert shard.stat().st_size > 8192
    with open(shard, "r+b") as stream:
        stream.seek(4096)
        stream.write(b"\xff" * 4096)
    assert resumed_after(tmp, caplog) == 2
    assert (
        f"skipping the checkpoint of step 4: {shard}: checksum mismatch (its contents changed after the save)"
    ) in caplog.text


def test_a_truncated_metadata_skips_that_step(tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    meta = step_dir(tmp, 4) / ".metadata"
    size = meta.stat().st_size
    meta.write_bytes(meta.read_bytes()[: size // 2])
    assert resumed_after(tmp, caplog) == 2
    expected = f"skipping the checkpoint of step 4: {meta}: {size // 2} bytes, {size} when it was saved"
    assert expected in caplog.text


def test_an_empty_metadata_skips_that_step(tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    meta = step_dir(tmp, 4) / ".metadata"
    size = meta.stat().st_size
    meta.write_bytes(b"")
    assert resumed_after(tmp, caplog) == 2
    assert f"skipping the checkpoint of step 4: {meta}: 0 bytes, {size} when it was saved" in caplog.text


def test_a_missing_shard_skips_that_step(tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    shard = step_dir(tmp, 4) / SHARD
    shard.unlink()
    assert resumed_after(tmp, caplog) == 2
    assert f"skipping the checkpoint of step 4: {shard}: missing (listed in checksums.json)" in caplog.text


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("truncated .metadata", "{meta}: not a readable DCP .metadata file"),
        ("empty .metadata", "{meta}: empty"),
        ("truncated shard", "{shard}: truncated ("),
        ("missing shard", "{shard}: missing (named by .metadata)"),
    ],
)
def test_without_a_manifest_damage_is_still_found(
    tmp: Path, caplog: pytest.LogCaptureFixture, fault: str, problem: str
) -> None:
    folder = step_dir(tmp, 4)
    (folder / MANIFEST).unlink()  # as saved by an earlier version
    meta, shard = folder / ".metadata", folder / SHARD
    if fault == "truncated .metadata":
        meta.write_bytes(meta.read_bytes()[:-40])
    elif fault == "empty .metadata":
        meta.write_bytes(b"")
    elif fault == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        shard.unlink()
    assert resumed_after(tmp, caplog) == 2
    assert f"skipping the checkpoint of step 4: {problem.format(meta=meta, shard=shard)}" in caplog.text


def test_a_damaged_load_step_is_refused_naming_the_file(tmp: Path) -> None:
    meta = step_dir(tmp, 2) / ".metadata"
    meta.write_bytes(b"")
    with pytest.raises(CheckpointNotResumableError) as info:
        Run(tmp, load_step=2).ckpt.load()
    assert str(info.value).startswith(f"checkpoint.load_step 2: the checkpoint is damaged: {meta}: 0 bytes")


def test_export_skips_a_damaged_newest_step(tmp: Path, caplog: pytest.LogCaptureFixture) -> None:
    (step_dir(tmp, 4) / SHARD).unlink()
    with pytest.raises(ExportError) as info:  # step 2 is intact: the export gets past it to the config
        export_checkpoint(tmp / "ckpt", tmp / "hf")
    assert str(step_dir(tmp, 2)) in str(info.value)
    assert f"skipping the damaged checkpoint step-4: {step_dir(tmp, 4) / SHARD}: missing" in caplog.text


def test_every_step_corrupt_stops_the_launch_with_exit_1_and_one_line(tmp_path: Path) -> None:
    from hyper_parallel.launch import main

    folder = tmp_path / "ckpt"
    run = {
        "checkpoint.enable": "true",
        "checkpoint.interval": "1",
        "checkpoint.folder": str(folder),
        "metrics.log_freq": "1",
    }
    flags = as_flags(tiny_overrides("llama3", **{"training.max_steps": "2", **run}))
    argv = ["--config-file", str(debug_config_path("llama3")), *flags]
    assert main(argv, out=io.StringIO(), err=io.StringIO()) == 0
    for step in (1, 2):
        (folder / f"step-{step}" / ".metadata").write_bytes(b"")
    out, err = io.StringIO(), io.StringIO()
    assert main([*argv, "--training.max_steps", "3"], out=out, err=err) == 1
    meta = [folder / f"step-{step}" / ".metadata" for step in (0, 1, 2)]
    assert err.getvalue().startswith(
        f"training stopped: checkpoint.folder {str(folder)!r}: no intact checkpoint to resume "
        f"(step 2: {meta[2]}: 0 bytes, "
    )
    assert f"; step 1: {meta[1]}: 0 bytes, " in err.getvalue()
    assert err.getvalue().count("\n") == 1
    assert "Traceback" not in err.getvalue() + out.getvalue()


def test_a_damaged_newer_step_never_prunes_the_intact_ones(
    tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (step_dir(tmp, 4) / SHARD).unlink()
    run = Run(tmp, keep_latest_k=1)
    with caplog.at_level(logging.WARNING, logger=MANAGER_LOG):
        assert run.ckpt.load() == 2
    run.ckpt.save(3)
    # step 2 pruned, not 3 (.lock: the run still holds the folder)
    assert sorted(p.name for p in (tmp / "ckpt").iterdir()) == [".lock", "step-3", "step-4"]
    assert resumed_after(tmp, caplog) == 3
