"""The trainer under ``torchrun --nproc-per-node 2`` with gloo: same losses as one process, real sharding.

Each case trains the tiny debug config for 4 steps on 2 CPU processes and compares every step's loss with a
single-process run of the same global batch (fp32, 1e-5), then checks from the ranks' own report that the
parameters really are sharded as the layout says; Qwen 3.5 MoE on micro-batches of 2 sequences trains to
the same losses with expert parallelism (``ep 2`` of ``dp_shard 2``) and operator-level activation
checkpointing as without either (1e-6). The layout grid runs 50 layouts through the resolver's checks
(``--dry-run``) and through the runtime with those checks bypassed: the verdicts must agree.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from hyper_parallel.config import ConfigError, load_config  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    GRID,
    WORKER,
    as_flags,
    debug_config_path,
    grid_overrides,
    tiny_config,
    tiny_overrides,
    train_runs_under_torchrun,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

LAYOUTS = {
    "dp_shard2": {"parallelism.dp_shard": "2"},
    "tp2": {"parallelism.dp_shard": "1", "parallelism.tp": "2"},
    "tp2-no-sp": {
        "parallelism.dp_shard": "1",
        "parallelism.tp": "2",
        "parallelism.sequence_parallel": "false",
    },
}
#: Qwen 3.5 MoE on micro-batches of 2 sequences (the tiny run's), without and with expert parallelism.
#: The ep run also checkpoints every block at the operator level (``selective_option`` 'op'), which
#: recomputes the element-wise operators in the backward and keeps the matmuls and the all-to-all outputs.
MOE_LAYOUTS = {
    "dp_shard2": LAYOUTS["dp_shard2"],
    "ep2": {
        "parallelism.dp_shard": "2",
        "parallelism.ep": "2",
        "activation_checkpoint.mode": "selective",
        "activation_checkpoint.selective_option": "op",
    },
}
DATA = {"dataloader.dataset.source": "python_docs"}
#: Whole documents padded to 512 tokens: each sequence counts another number of tokens (the loss ignores
#: the padding), as sparse fine-tuning labels do.
PADDED = {
    **DATA,
    "dataloader.dataset.pack_sequences": "false",
    "training.seq_len": "512",
    "training.mixed_precision_param": "float32",
}
TIMEOUTS = {"comm.init_timeout_seconds": "123", "comm.train_timeout_seconds": "45"}


def _single_process(model: str) -> list[float]:
    trainer = LLMTrainer(tiny_config(model, DATA))
    try:
        return [r.loss for r in trainer.train()]
    finally:
        trainer.close()


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every ``model-layout`` run of this module, trained in one torchrun job (start-up paid once)."""
    runs = {
        f"{model}-{layout}": (model, {**DATA, **TIMEOUTS, **LAYOUTS[layout]})
        for model in ("llama3", "qwen3_5")
        for layout in LAYOUTS
    }
    runs.update(
        {f"qwen3_5_moe-{layout}": ("qwen3_5_moe", {**DATA, **MOE_LAYOUTS[layout]}) for layout in MOE_LAYOUTS}
    )
    runs["llama3-padded-dp_shard2"] = ("llama3", {**PADDED, **LAYOUTS["dp_shard2"]})
    runs["llama3-padded-dp_shard2-mean"] = (
        "llama3",
        {**PADDED, **LAYOUTS["dp_shard2"], "loss.reduction": "mean"},
    )
    return train_runs_under_torchrun(2, tmp_path_factory.mktemp("two-processes"), runs)[0]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_two_processes_match_one_and_really_shard(
    model: str, layout: str, two_process_runs: dict[str, list[dict[str, Any]]]
) -> None:
    ranks = two_process_runs[f"{model}-{layout}"]
    expected = _single_process(model)
    for report in ranks:
        assert report["losses"] == pytest.approx(expected, abs=1e-5)
        # comm: the start-up timeout while a run is built, then the training one (the first run of the
        # job builds the process group; later runs find it and set the same two timeouts again)
        assert report["timeouts"] == [123.0, 45.0]
    params = ranks[0]["params"]
    assert all(p["dtensor"] for p in params.values()), [n for n, p in params.items() if not p["dtensor"]]
    if layout == "dp_shard2":
        assert [r["dp_rank"] for r in ranks] == [0, 1]
        for name, held in params.items():
            assert held["mesh"] == ["dp_shard"], name
            assert held["placements"] == ["Shard(dim=0)"], name
            assert held["local"][0] == -(-held["global"][0] // 2), name
    else:
        assert [r["dp_rank"] for r in ranks] == [0, 0]  # TP peers read the same data
        wq = next(p for n, p in params.items() if n.endswith(".attention.wq.weight"))
        assert wq["placements"] == ["Shard(dim=0)"]
        assert wq["local"][0] * 2 == wq["global"][0]
        norms = {n: (p["mesh"], p["placements"]) for n, p in params.items() if n.endswith("norm.weight")}
        assert "norm.weight" in norms  # the final norm, besides every block's
        assert norms == dict.fromkeys(norms, (["tp"], ["Replicate()"]))
    # The residual stream as the first block's ffn_norm returns it: (micro batch 2, seq_len 32, dim 64).
    residual = [r["residual_norm_output"] for r in ranks]
    if layout == "tp2":  # sequence parallel: each rank holds its half of the sequence
        assert residual == [{"dtensor": True, "placements": ["Shard(dim=1)"], "local": [2, 16, 64]}] * 2
    else:
        assert residual == [{"dtensor": False, "placements": [], "local": [2, 32, 64]}] * 2


def test_the_loss_is_normalised_over_the_tokens_of_every_data_parallel_rank(
    two_process_runs: dict[str, list[dict[str, Any]]],
) -> None:
    # Two ranks of one micro-batch of 2 each give the losses of one process holding the global batch of 4
    # in one micro-batch: the step's supervised tokens are counted over both ranks (loss.reduction 'sum').
    trainer = LLMTrainer(tiny_config("llama3", {**PADDED, "training.micro_batch_size": "4"}))
    try:
        whole = [r.loss for r in trainer.train()]
    finally:
        trainer.close()
    for report in two_process_runs["llama3-padded-dp_shard2"]:
        assert report["losses"] == pytest.approx(whole, abs=1e-5, rel=0)
    # The mean of each rank's micro-batch mean, by name, weighs the ranks' tokens unequally: other losses.
    by_rank = two_process_runs["llama3-padded-dp_shard2-mean"][0]["losses"]
    assert abs(by_rank[0] - whole[0]) > 1e-3


def test_expert_parallelism_with_op_checkpointing_on_micro_batches_of_two_matches_fsdp_alone(
    two_process_runs: dict[str, list[dict[str, Any]]],
) -> None:
    # the reference is the same layout without ep or checkpointing, not one process: with micro-batches
    # of 2 one process groups the sequences differently, and the load-balancing loss is per micro-batch
    plain, ep = two_process_runs["qwen3_5_moe-dp_shard2"], two_process_runs["qwen3_5_moe-ep2"]
    for rank in range(2):
        # micro-batches of 2 sequences of 32 tokens on both layouts
        assert plain[rank]["residual_norm_output"]["local"] == [2, 32, 64]
        assert ep[rank]["residual_norm_output"]["local"] == [2, 32, 64]
        # the same per-step losses, load-balancing losses and expert loads, and gradient norms, to
        # rounding: the routed outputs are scaled by their routing weights after the experts under
        # expert parallelism, on the experts' hidden state without it (the same product)
        assert ep[rank]["losses"] == pytest.approx(plain[rank]["losses"], abs=1e-6, rel=0)
        assert ep[rank]["grad_norms"] == pytest.approx(plain[rank]["grad_norms"], abs=0, rel=1e-6)
        for ours, theirs in zip(ep[rank]["extras"], plain[rank]["extras"], strict=True):
            assert ours == pytest.approx(theirs, abs=1e-6, rel=0)
        assert plain[rank]["experts"]["computes"] == [0, 1, 2, 3]
        assert ep[rank]["experts"]["computes"] == [2 * rank, 2 * rank + 1]  # the all-to-all really ran


def test_train_lm_under_torchrun_trains_and_only_rank_zero_prints(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    overrides = tiny_overrides(
        "llama3",
        **{"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(jsonl), "metrics.log_freq": "1"},
    )
    done = torchrun(
        2,
        "-m",
        "hyper_parallel.train_lm",
        "--config-file",
        str(debug_config_path("llama3")),
        *as_flags(overrides),
    )
    _check(done)
    assert done.stdout.count("hyper_parallel: llama3 debugmodel") == 1
    assert "2 rank(s) [dp_shard=2] on cpu (gloo)" in done.stdout
    assert [json.loads(line)["step"] for line in jsonl.read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.timeout(900)
def test_async_checkpoints_under_fsdp_finish_and_resume(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    overrides = tiny_overrides(
        "llama3",
        **{
            "checkpoint.enable": "true",
            "checkpoint.folder": str(folder),
            "checkpoint.interval": "1",
            "checkpoint.async_mode": "async",
            "checkpoint.keep_latest_k": "2",
            "checkpoint.last_save_model_only": "false",
        },
    )
    command = ["-m", "hyper_parallel.train_lm", "--config-file", str(debug_config_path("llama3"))]
    _check(torchrun(2, *command, *as_flags(overrides), timeout=300))
    assert sorted(p.name for p in folder.iterdir()) == ["step-3", "step-4"]
    longer = {**overrides, "training.max_steps": "6"}
    resumed = torchrun(2, *command, *as_flags(longer), timeout=300)
    _check(resumed)
    assert "resuming at step 4" in resumed.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["step-5", "step-6"]


def _dry_run_verdict(case: Any) -> str:
    try:
        load_config(debug_config_path(case.model), grid_overrides(case), world_size=case.world)
    except ConfigError as exc:
        return f"rejected: {exc.issues[0].path}: {exc.issues[0].message}"
    return "ran"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 4])
def test_dry_run_and_runtime_agree_on_every_layout_of_the_grid(world: int, tmp_path: Path) -> None:
    out = tmp_path / "verdicts.json"
    _check(torchrun(world, WORKER, "grid", str(world), str(out), timeout=600))
    runtime = json.loads(out.read_text())
    cases = [case for case in GRID if case.world == world]
    assert sorted(runtime) == sorted(case.name for case in cases)
    disagreements = {}
    for case in cases:
        dry = _dry_run_verdict(case)
        if (dry == "ran") != (runtime[case.name] == "ran"):
            disagreements[case.name] = {"dry-run": dry, "runtime": runtime[case.name]}
    assert disagreements == {}
