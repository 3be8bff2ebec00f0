"""Data-parallel layouts through torchrun and the trainer: DDP, HSDP, TP x FSDP2, and two "nodes".

Each case trains the tiny debug config for 4 steps (fp32, gloo) and compares every step's loss with a
single-process run of the same global batch (1e-5); then it checks, from what every rank reported, that the
layout really happened: DTensor meshes, placements and local shapes, which ranks read which data, and which
ranks end with bitwise identical parameters (replicas) or different ones (shards). Global batch 8 with
micro-batches of 1 makes every layout accumulate gradients, so the gradient sync is skipped and done right.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from hyper_parallel.config import ConfigError, load_config  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun, torchrun_nodes  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    GRID,
    WORKER,
    debug_config_path,
    grid_overrides,
    saving_every_two_steps,
    tiny_config,
    train_runs_under_torchrun,
)

#: Shared by every run: the global batch, and a clipping threshold below the tiny models' gradient norms
#: (about 0.5), so each step clips by the global norm over every mesh.
SHARED = {"training.global_batch_size": "8", "training.max_grad_norm": "0.3"}
MICRO = {**SHARED, "training.micro_batch_size": "1"}
DDP = {"parallelism.dp_shard": "1", "parallelism.dp_replicate": "2"}
HSDP = {"parallelism.dp_shard": "2", "parallelism.dp_replicate": "2"}
TP_FSDP = {"parallelism.dp_shard": "2", "parallelism.tp": "2"}
#: Qwen 3.5 has no sequence-parallel plan: its tensor parallelism keeps activations replicated.
NO_SP = {"qwen3_5": {"parallelism.sequence_parallel": "false"}, "llama3": {}}


@functools.cache
def _single_process(model: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-step losses and gradient norms of one process on the same global batch."""
    trainer = LLMTrainer(tiny_config(model, SHARED))
    try:
        results = trainer.train()
    finally:
        trainer.close()
    return tuple(r.loss for r in results), tuple(r.grad_norm for r in results)


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


def _train(world: int, model: str, out: Path, overrides: dict[str, str]) -> list[dict[str, Any]]:
    """Train ``model`` on ``world`` ranks with ``overrides``; every rank's report, by global rank."""
    pairs = (f"{k}={v}" for k, v in {**MICRO, **overrides}.items())
    done = torchrun(world, WORKER, "train", model, str(out), *pairs, timeout=300)
    _check(done)
    # the global gradient norm is one all-reduce over the flattened split dimensions, not one per dimension
    assert "sequential all_reduce operations" not in done.stderr
    return _reports(out, world)


def _reports(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]


def _assert_single_process_losses(model: str, ranks: list[dict[str, Any]]) -> None:
    """Every rank's losses and global gradient norms (over all meshes, before clipping) are one process's."""
    losses, grad_norms = _single_process(model)
    for rank, report in enumerate(ranks):
        assert report["losses"] == pytest.approx(losses, abs=1e-5), f"rank {rank}"
        assert report["grad_norms"] == pytest.approx(grad_norms, rel=1e-4, abs=1e-5), f"rank {rank}"


def _assert_held(params: dict[str, Any], mesh: list[str], placements: list[str], shards: int) -> None:
    """Every parameter is a DTensor on ``mesh`` with ``placements``, its dim 0 split in ``shards``."""
    for name, held in params.items():
        assert held["dtensor"], name
        assert (held["mesh"], held["placements"]) == (mesh, placements), name
        assert held["local"] == [-(-held["global"][0] // shards), *held["global"][1:]], name


def _assert_hsdp(ranks: list[dict[str, Any]]) -> None:
    """Ranks (0, 1) and (2, 3) are two replicas of a 2-way sharded model: replicas equal, shards differ."""
    assert [r["dp_rank"] for r in ranks] == [0, 1, 2, 3]  # every rank reads its own share of the batch
    _assert_held(ranks[0]["params"], ["dp_replicate", "dp_shard"], ["Replicate()", "Shard(dim=0)"], 2)
    digests = [r["digests"] for r in ranks]
    assert digests[0] == digests[2]  # the replicate dimension all-reduced the gradients
    assert digests[1] == digests[3]
    assert digests[0]["tok_embeddings.weight"] != digests[1]["tok_embeddings.weight"]  # different halves


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["llama3"])  # Qwen 3.5 under DDP runs in the layout grid
def test_ddp_matches_one_process_and_keeps_replicas_identical(model: str, tmp_path: Path) -> None:
    ranks = _train(2, model, tmp_path / "ddp", DDP)
    _assert_single_process_losses(model, ranks)
    assert [r["dp_rank"] for r in ranks] == [0, 1]  # the replicas read different micro-batches ...
    assert ranks[0]["digests"] == ranks[1]["digests"]  # ... and still end bitwise equal: grads all-reduced
    _assert_held(ranks[0]["params"], ["dp_replicate"], ["Replicate()"], 1)  # whole, on the replicate mesh


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """The 4-rank runs of this module, trained in one torchrun job (start-up paid once): HSDP and TP x FSDP2
    of both models, and the first, checkpointing HSDP run of the resume test (its folder: ``folder``)."""
    tmp = tmp_path_factory.mktemp("four-processes")
    runs: dict[str, tuple[str, dict[str, str]]] = {}
    for model in ("llama3", "qwen3_5"):
        runs[f"hsdp-{model}"] = (model, {**MICRO, **HSDP})
        runs[f"tp_fsdp-{model}"] = (model, {**MICRO, **TP_FSDP, **NO_SP[model]})
    runs["hsdp-checkpoint"] = ("llama3", {**MICRO, **HSDP, **saving_every_two_steps(tmp / "ckpt")})
    reports, stderr = train_runs_under_torchrun(4, tmp, runs)
    # the global gradient norm is one all-reduce over the flattened split dimensions, not one per dimension
    assert "sequential all_reduce operations" not in stderr
    return {**reports, "folder": tmp / "ckpt"}  # type: ignore[dict-item]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_hsdp_matches_one_process_and_shards_within_replicas(model: str, four_ranks: Any) -> None:
    ranks = four_ranks[f"hsdp-{model}"]
    _assert_single_process_losses(model, ranks)
    _assert_hsdp(ranks)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_tp_times_fsdp_matches_one_process_and_shards_on_both_dims(model: str, four_ranks: Any) -> None:
    ranks = four_ranks[f"tp_fsdp-{model}"]
    _assert_single_process_losses(model, ranks)
    assert [r["dp_rank"] for r in ranks] == [0, 0, 1, 1]  # tensor-parallel peers read the same data
    params = ranks[0]["params"]
    assert all(p["dtensor"] and p["mesh"] == ["dp_shard", "tp"] for p in params.values())
    wq = params["layers.1.attention.wq.weight"]  # a full-attention block in both models
    # column-parallel on tp, then FSDP splits the tp shard again along dim 0 (a strided shard)
    assert wq["placements"] == ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"]
    assert wq["local"][0] * 4 == wq["global"][0]
    norm = params["norm.weight"]  # not split by tp: replicated there, sharded by FSDP
    assert (norm["placements"], norm["local"][0] * 2) == (["Shard(dim=0)", "Replicate()"], norm["global"][0])
    digests = [r["digests"] for r in ranks]
    assert digests[0]["norm.weight"] == digests[1]["norm.weight"]  # tp peers hold the same FSDP shard
    assert digests[0]["norm.weight"] != digests[2]["norm.weight"]


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_hsdp_checkpoint_resumes_with_the_uninterrupted_losses(four_ranks: Any, tmp_path: Path) -> None:
    """A 4-step HSDP run saves at steps 2 and 4; step 4 lost, a relaunch resumes at 2 and repeats 3 and 4."""
    first, saved = four_ranks["hsdp-checkpoint"], four_ranks["folder"]
    assert sorted(p.name for p in saved.iterdir()) == ["step-2", "step-4"]
    folder = tmp_path / "ckpt"
    shutil.copytree(saved / "step-2", folder / "step-2")  # step 4 lost
    resumed = _train(4, "llama3", tmp_path / "resumed", {**HSDP, **saving_every_two_steps(folder)})
    _assert_single_process_losses("llama3", first)
    for before, after in zip(first, resumed, strict=True):
        assert (before["resumed_from"], after["resumed_from"]) == (0, 2)
        assert after["losses"] == pytest.approx(before["losses"][2:], abs=1e-5)
        assert after["digests"] == before["digests"]  # the same shard of the same weights after step 4


@pytest.mark.parametrize(
    "case",
    # expert parallelism under HSDP is refused (not supported yet), as the grid's runtime agrees
    [c for c in GRID if c.parallelism.get("dp_replicate", 1) != 1 and c.parallelism.get("ep", 1) == 1],
    ids=lambda c: c.name,
)
def test_replicated_layouts_of_the_grid_pass_the_dry_run(case: Any) -> None:
    """The layout grid's runtime verdicts must agree with these (tests/trainer/test_parallel.py)."""
    if case.training.get("global_batch_size") == 6:
        with pytest.raises(ConfigError) as caught:
            load_config(debug_config_path(case.model), grid_overrides(case), world_size=case.world)
        assert [(i.path, i.message) for i in caught.value.issues] == [
            (
                "training.global_batch_size",
                "must be a multiple of micro_batch_size x dp_replicate x dp_shard (4), got 6",
            )
        ]
    else:
        load_config(debug_config_path(case.model), grid_overrides(case), world_size=case.world)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_two_nodes_of_two_processes_train_hsdp_through_a_c10d_rendezvous(tmp_path: Path) -> None:
    """Two torchrun agents ("nodes") meet at one c10d endpoint, as on two machines, and train HSDP 2 x 2."""
    out = tmp_path / "nodes"
    pairs = [f"{k}={v}" for k, v in {**MICRO, **HSDP}.items()]
    for node in torchrun_nodes(2, 2, WORKER, "train", "llama3", str(out), *pairs, timeout=300):
        _check(node)
    ranks = _reports(out, 4)
    _assert_single_process_losses("llama3", ranks)
    _assert_hsdp(ranks)
