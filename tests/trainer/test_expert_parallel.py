"""Qwen 3.5 MoE under expert parallelism: same losses as one process, experts really split, checkpoints.

One launch of 4 CPU processes (``ep 2`` x ``dp_shard 4``, so each expert is also FSDP-sharded over 2
ranks) trains the tiny MoE config for 4 steps with checkpoints at steps 2 and 4 and operator-level
activation checkpointing (``selective_option`` 'op': the matmuls' and all-to-alls' outputs kept, the rest
recomputed); one process trains the same global batch without checkpointing. Losses and load-balancing
losses agree within 1e-5 (fp32; ``micro_batch_size`` 1 keeps each micro-batch the same sequence, which the
per-micro-batch auxiliary loss needs); every rank says which experts it stores and computes with. The EP
checkpoint of step 2 resumes in one process, the one-process checkpoint of step 2 resumes under ``ep 2``
on 2 processes (every block checkpointed), both with the uninterrupted losses; the EP checkpoint exports
to a folder transformers loads to the trained logits.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from hyper_parallel.export import export_checkpoint  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import WORKER, tiny_config  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

MOE = "qwen3_5_moe"
RUN = {
    "training.micro_batch_size": "1",
    "checkpoint.enable": "true",
    "checkpoint.interval": "2",
    "checkpoint.keep_latest_k": "0",
    "checkpoint.last_save_model_only": "false",
    "dataloader.dataset.synthetic_num_samples": "12",
}
# The EP launches checkpoint activations (one process does not): operator by operator with ep 2 x
# dp_shard 4 (the all-to-all outputs kept), every whole block after the resume with ep 2 (the experts'
# all-to-all recomputed in the backward).
EP4 = {
    "parallelism.dp_shard": "4",
    "parallelism.ep": "2",
    "activation_checkpoint.mode": "selective",
    "activation_checkpoint.selective_option": "op",
}
EP2 = {"parallelism.dp_shard": "2", "parallelism.ep": "2", "activation_checkpoint.mode": "full"}


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


def _launch(n: int, report: Path, overrides: dict[str, str]) -> list[dict[str, Any]]:
    done = torchrun(n, WORKER, "train", MOE, str(report), *(f"{k}={v}" for k, v in overrides.items()))
    _check(done)
    return [json.loads(Path(f"{report}.rank{r}.json").read_text()) for r in range(n)]


def _one_process(folder: Path) -> tuple[list[float], list[float], Any]:
    trainer = LLMTrainer(tiny_config(MOE, {**RUN, "checkpoint.folder": str(folder)}))
    try:
        results = trainer.train()
        return [r.loss for r in results], [float(r.extra["aux_loss"]) for r in results], trainer.model.eval()
    finally:
        trainer.close()


def _resume(source: Path, tmp: Path) -> Path:
    """A fresh checkpoint folder holding only ``source``'s step-2."""
    folder = tmp / f"resume-{source.name}"
    shutil.copytree(source / "step-2", folder / "step-2")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ep")
    ranks = _launch(4, tmp / "ep4", {**RUN, **EP4, "checkpoint.folder": str(tmp / "ep4-ckpt")})
    losses, aux, model = _one_process(tmp / "one-ckpt")
    return {"tmp": tmp, "ranks": ranks, "losses": losses, "aux": aux, "model": model}


def test_ep2_of_dp_shard4_matches_one_process_and_splits_the_experts(runs: dict[str, Any]) -> None:
    for rank, report in enumerate(runs["ranks"]):
        assert report["losses"] == pytest.approx(runs["losses"], abs=1e-5)
        assert [e["aux_loss"] for e in report["extras"]] == pytest.approx(runs["aux"], abs=1e-5)
        # ep rank j (rank % 2) computes with experts 2j, 2j+1; FSDP over the 2 ranks left stores one each
        ep_rank = rank % 2
        assert report["experts"]["computes"] == [2 * ep_rank, 2 * ep_rank + 1]
        assert report["experts"]["stored"] == [2 * ep_rank + rank // 2]
        w13 = report["params"]["layers.0.feed_forward.experts.w13"]
        assert w13["mesh"] == ["dp_shard_mod_ep", "ep"]
        assert w13["placements"] == ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"]
        assert (w13["local"], w13["global"]) == ([1, 64, 64], [4, 64, 64])
        router = report["params"]["layers.0.feed_forward.router.weight"]
        assert (router["mesh"], router["local"]) == (["dp_shard"], [1, 64])


def test_ep_checkpoint_resumes_in_one_process_and_one_process_resumes_under_ep(
    runs: dict[str, Any],
) -> None:
    tmp = runs["tmp"]
    folder = _resume(tmp / "ep4-ckpt", tmp)
    trainer = LLMTrainer(tiny_config(MOE, {**RUN, "checkpoint.folder": str(folder)}))
    try:
        assert trainer.resumed_from == 2
        resumed = [r.loss for r in trainer.train()]
    finally:
        trainer.close()
    assert resumed == pytest.approx(runs["losses"][2:], abs=1e-5)
    back = _resume(tmp / "one-ckpt", tmp)
    ranks = _launch(2, tmp / "ep2", {**RUN, **EP2, "checkpoint.folder": str(back)})
    for report in ranks:
        assert report["resumed_from"] == 2
        assert report["losses"] == pytest.approx(runs["losses"][2:], abs=1e-5)


def test_ep_checkpoint_exports_to_transformers_with_the_trained_logits(runs: dict[str, Any]) -> None:
    out = export_checkpoint(runs["tmp"] / "ep4-ckpt", runs["tmp"] / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "Qwen3_5MoeForCausalLM"
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        gap = float((runs["model"](ids) - hf(ids).logits).abs().max())
    assert gap <= 1e-4
