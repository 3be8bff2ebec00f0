"""Every item a checkpoint stores is read within bounds set by its stored bytes and by counted work.

One tiny Llama 3 run (checkpoints at steps 1 and 2) is made once for the module; each test copies its folder
and plants one item into step 2, pointing its storage entry at bytes appended to the shard (the manifest
forged to match, as a hostile folder would): a pickled optimizer value that shares itself 40 times (M1),
a pickled item spanning a 2 GiB hole of a sparse file (M5), a tensor chunk whose zip record is deflated or
holds more than the chunk (M4). Resume skips the step for step 1 with a warning naming the file; export
exits 2 with one line. The memory cases run in a child process whose peak RSS (``resource``) is asserted.
"""

from __future__ import annotations

import io
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex  # noqa: E402

from hyper_parallel.components.checkpoint._bounds import MAX_BYTES_ITEM, MAX_ITEM_OVERHEAD  # noqa: E402
from hyper_parallel.components.checkpoint._manifest import MANIFEST, write_manifest  # noqa: E402
from hyper_parallel.components.checkpoint._safe_read import (  # noqa: E402
    MAX_PLAIN_NODES,
    _NotPlain,
    _plain_nodes,
    read_metadata,
)
from hyper_parallel.export import main as export_main  # noqa: E402
from tests.support.damaged_checkpoint import resume_warnings, rewrite, save_two_steps  # noqa: E402
from tests.support.peak_rss import RSS_BOUND, run_with_peak_rss  # noqa: E402
from tests.support.trainer import checkpointed_run_argv  # noqa: E402

EMBED = "model.tok_embeddings.weight"
NORM = "model.norm.weight"
LR = "optimizer.param_groups.0.lr"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_two_steps(tmp_path_factory.mktemp("items") / "ckpt")


@pytest.fixture
def ckpt(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def plant(step: Path, index: MetadataIndex, data: bytes, *, hole: int = 0, manifest: bool = True) -> Path:
    """Append ``hole`` bytes of a hole then ``data`` to the shard of ``index`` and point its storage entry
    at them (a hole alone when ``data`` is empty: the entry spans it); the manifest forged to match."""
    metadata = read_metadata(step / ".metadata")
    info = metadata.storage_data[index]
    shard = step / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "r+b") as stream:
        stream.truncate(offset + hole)
        stream.seek(offset + hole)
        stream.write(data)
    info.offset, info.length = (offset + hole, len(data)) if data else (offset, hole)
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    if manifest:
        write_manifest(step)
    else:
        (step / MANIFEST).unlink()
    return shard


def _saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# -- M1: a pickled item is walked once per shared part, within a budget of nodes ----------------------------
def _shared_40_times() -> list[object]:
    value: list[object] = []
    for _ in range(40):
        value = [value, value]
    return value


def test_a_shared_value_is_walked_once_and_its_tree_size_counted() -> None:
    betas = (0.9, 0.999)
    assert _plain_nodes([betas, betas, {"lr": 0.1}], {}) == 1 + 3 + 3 + 3
    with pytest.raises(_NotPlain, match=f"more than {MAX_PLAIN_NODES:,} values once its shared parts"):
        _plain_nodes(_shared_40_times(), {})
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(_NotPlain, match="a container that holds itself"):
        _plain_nodes(cycle, {})
    deep: list[object] = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(_NotPlain, match="nested more than 100 deep"):
        _plain_nodes(deep, {})


@pytest.mark.timeout(120)  # before the budget, the walk of 2^40 nodes never ended
def test_a_pickled_item_sharing_itself_40_times_skips_the_step_on_resume(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bomb = _saved(_shared_40_times())
    assert len(bomb) < 4096
    shard = plant(ckpt / "step-2", MetadataIndex(LR), bomb)
    warnings = resume_warnings(ckpt, caplog)
    assert (
        f"skipping the checkpoint of step 2: {shard}: refused item {LR!r}: more than {MAX_PLAIN_NODES:,} "
        "values once its shared parts are counted each time they are referred to (MAX_PLAIN_NODES)"
    ) in warnings


# -- M5: a pickled item spanning a hole is refused before it is read -----------------------------------------
@pytest.mark.multiprocess
def test_a_pickled_item_spanning_a_2_gib_hole_is_refused_before_it_is_read(ckpt: Path) -> None:
    step = ckpt / "step-2"
    plant(step, MetadataIndex(LR), b"", hole=2 << 30, manifest=False)  # no manifest: nothing hashes the hole
    status, err, peak = run_with_peak_rss("launch", checkpointed_run_argv(ckpt, 3))
    assert status == 0, err[-2000:]
    assert (
        f"skipping the checkpoint of step 2: {step / '.metadata'}: tensor {LR}: a pickled item of {2 << 30} "
        f"bytes (at most {MAX_BYTES_ITEM}: MAX_BYTES_ITEM)"
    ) in err
    assert "Traceback" not in err
    assert peak < RSS_BOUND, f"peak RSS {peak >> 20} MiB"


# -- M4: tensor records are stored, not compressed, and no larger than their chunk --------------------------
def _deflated_tensor(tmp: Path, numel: int) -> bytes:
    """``torch.save`` of ``numel`` float32 zeros with every zip record deflated (a few hundred KB)."""
    plain, packed = tmp / "plain.pt", tmp / "packed.pt"
    torch.save(torch.zeros(numel), plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            with source.open(member) as read, target.open(member.filename, "w", force_zip64=True) as write:
                shutil.copyfileobj(read, write, 1 << 20)
    plain.unlink()
    return packed.read_bytes()


@pytest.mark.multiprocess
def test_a_deflated_chunk_is_refused_before_it_is_inflated(ckpt: Path, tmp_path: Path) -> None:
    step = ckpt / "step-2"
    deflated = _deflated_tensor(tmp_path, 32 << 20)  # 128 MiB of zeros in about 130 KB
    assert len(deflated) <= 512 * 64 * 4 + MAX_ITEM_OVERHEAD  # inside the bound on the item's bytes
    shard = plant(step, MetadataIndex(EMBED, [0, 0]), deflated)
    offset = read_metadata(step / ".metadata").storage_data[MetadataIndex(EMBED, [0, 0])].offset
    status, err, peak = run_with_peak_rss("export", [str(step), str(tmp_path / "hf")])
    assert status == 2, err[-2000:]
    assert err == (
        f"export: {str(step)!r} is damaged: {shard}: record plain/data.pkl at byte {offset} is compressed "
        "(method 8); torch.save stores its records, and a compressed one could expand past the bytes stored\n"
    )
    assert peak < RSS_BOUND, f"peak RSS {peak >> 20} MiB"
    assert not (tmp_path / "hf").exists()


def test_a_chunk_stored_larger_than_declared_is_refused(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stored record holding more than its chunk was narrowed to the chunk without a word."""
    step = ckpt / "step-2"
    shard = plant(step, MetadataIndex(NORM, [0]), _saved(torch.ones(64 + 1024)))
    offset = read_metadata(step / ".metadata").storage_data[MetadataIndex(NORM, [0])].offset
    assert export_main([str(step), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err == (
        f"export: {str(step)!r} is damaged: {shard}: record archive/data/0 at byte {offset}: the item's data "
        "records hold 4352 bytes, more than its chunk's 256\n"
    )


def test_a_chunk_stored_far_beyond_its_size_is_refused_from_the_metadata(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step = ckpt / "step-2"
    plant(step, MetadataIndex(NORM, [0]), _saved(torch.ones(64 + (1 << 15))))
    assert export_main([str(step), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"export: {str(step)!r} is damaged: {step / '.metadata'}: tensor {NORM}: chunk at [0] declares 256 "
        "bytes of torch.float32 and stores "
    )
    assert err.endswith(f" (a saved tensor adds at most {MAX_ITEM_OVERHEAD} bytes: MAX_ITEM_OVERHEAD)\n")


def test_a_list_of_chunks_shared_by_many_tensors_is_refused_before_it_is_walked_again(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pickled list referred to by every tensor costs bytes once and was walked once per tensor."""
    step = ckpt / "step-2"

    def share_the_embedding_chunks(metadata: Metadata) -> None:
        items = metadata.state_dict_metadata
        items["model.output.weight"].chunks = items[EMBED].chunks  # type: ignore[union-attr]

    rewrite(step, share_the_embedding_chunks)
    assert export_main([str(step), str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err == (
        f"export: {str(step)!r} is damaged: {step / '.metadata'}: tensor model.output.weight: shares its "
        "list of chunks with another tensor (DCP writes one per tensor)\n"
    )
