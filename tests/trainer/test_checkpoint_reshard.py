"""A checkpoint saved under one layout resumes under another and continues with the same losses.

Each case trains the tiny debug config for 4 steps uninterrupted under the saved layout (checkpoints at
steps 2 and 4), copies the step-2 checkpoint into a fresh folder and resumes it under another layout
(FSDP2 on two processes, tensor parallelism on two, or one process): steps 3 and 4 must give the
uninterrupted run's losses within 1e-5 (fp32). The 12 synthetic samples and the global batch of 4 make
step 4 start a new, reshuffled epoch, so the data position crosses an epoch end after the resume.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import ROOT, WORKER, as_flags, tiny_config, tiny_overrides  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]

CHECKPOINTS = {
    "checkpoint.enable": "true",
    "checkpoint.interval": "2",
    "checkpoint.keep_latest_k": "0",
    "checkpoint.last_save_model_only": "false",
    "dataloader.dataset.synthetic_num_samples": "12",
}
LAYOUTS: dict[str, dict[str, str]] = {
    "one": {"parallelism.dp_shard": "1"},
    "dp_shard2": {"parallelism.dp_shard": "2"},
    "tp2": {"parallelism.dp_shard": "1", "parallelism.tp": "2"},
}
NO_SP = {"parallelism.sequence_parallel": "false"}  # Qwen 3.5 has no sequence-parallel plan


def _overrides(model: str, layout: str, folder: Path) -> dict[str, str]:
    extra = NO_SP if model == "qwen3_5" and layout == "tp2" else {}
    return {**CHECKPOINTS, **LAYOUTS[layout], **extra, "checkpoint.folder": str(folder)}


def _run(model: str, layout: str, folder: Path, report: Path) -> dict[str, Any]:
    """Train under ``layout`` with checkpoints in ``folder``; rank 0's losses and parameter layout."""
    overrides = _overrides(model, layout, folder)
    if layout == "one":
        trainer = LLMTrainer(tiny_config(model, overrides))
        try:
            return {"losses": [r.loss for r in trainer.train()], "resumed_from": trainer.resumed_from}
        finally:
            trainer.close()
    done = torchrun(2, WORKER, "train", model, str(report), *(f"{k}={v}" for k, v in overrides.items()))
    _check(done)
    ranks = [json.loads(Path(f"{report}.rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["losses"] == ranks[1]["losses"]
    return ranks[0]


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``(model, layout) -> (losses of steps 1-4, folder holding step-2)``, each run once per module."""
    runs: dict[tuple[str, str], tuple[list[float], Path]] = {}

    def get(model: str, layout: str) -> tuple[list[float], Path]:
        if (model, layout) not in runs:
            tmp = tmp_path_factory.mktemp(f"{model}-{layout}")
            report = _run(model, layout, tmp / "ckpt", tmp / "report")
            assert len(report["losses"]) == 4
            assert sorted(p.name for p in (tmp / "ckpt").iterdir()) == ["step-2", "step-4"]
            runs[model, layout] = (report["losses"], tmp / "ckpt" / "step-2")
        return runs[model, layout]

    return get


CASES = [
    ("llama3", "dp_shard2", "tp2"),
    ("llama3", "dp_shard2", "one"),
    ("llama3", "one", "dp_shard2"),
    ("qwen3_5", "dp_shard2", "tp2"),
    ("qwen3_5", "dp_shard2", "one"),
]


@pytest.mark.parametrize(("model", "saved", "resumed"), CASES, ids=["-".join(case) for case in CASES])
def test_a_checkpoint_resumes_on_another_layout_with_the_same_losses(
    uninterrupted: Any, model: str, saved: str, resumed: str, tmp_path: Path
) -> None:
    expected, step2 = uninterrupted(model, saved)
    shutil.copytree(step2, tmp_path / "ckpt" / "step-2")
    report = _run(model, resumed, tmp_path / "ckpt", tmp_path / "report")
    assert report["losses"] == pytest.approx(expected[2:], abs=1e-5, rel=0)
    if resumed == "tp2":  # the resumed model is really tensor-parallel, not replicated
        wq = next(p for n, p in report["params"].items() if n.endswith(".attention.wq.weight"))
        assert (wq["mesh"], wq["placements"]) == (["tp"], ["Shard(dim=0)"])
        assert wq["local"][0] * 2 == wq["global"][0]
    elif resumed == "dp_shard2":
        assert {tuple(p["placements"]) for p in report["params"].values()} == {("Shard(dim=0)",)}
    else:
        assert report["resumed_from"] == 2


def test_a_layout_that_would_read_other_batches_is_refused_at_resume(tmp_path: Path) -> None:
    # 13 samples, short micro-batches kept: one process reads all 13 of an epoch, FSDP2 over 2 ranks 12
    # (6 each, 3 micro-batches of 2), so after this epoch the two would train on different batches.
    data = {"dataloader.dataset.synthetic_num_samples": "13", "dataloader.drop_last": "false"}
    saved = {**_overrides("llama3", "one", tmp_path / "ckpt"), **data, "training.max_steps": "2"}
    trainer = LLMTrainer(tiny_config("llama3", saved))
    trainer.train()
    trainer.close()
    resumed = {**_overrides("llama3", "dp_shard2", tmp_path / "ckpt"), **data}
    config = ROOT / "configs" / "llama3_debug.yaml"
    done = torchrun(
        2,
        "-m",
        "hyper_parallel.train_lm",
        "--config-file",
        str(config),
        *as_flags(tiny_overrides("llama3", **resumed)),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    step2 = str(tmp_path / "ckpt" / "step-2")
    assert (
        f"training stopped: checkpoint {step2!r}: cannot resume the data position saved with 1 data-parallel "
        "rank(s) x micro-batch 2 on 2 x 2: an epoch of 13 samples is cut to 13 samples by the saved layout "
        "and to 12 by this one, so the batches after this epoch would differ; resume with the saved layout, "
        "or train on a number of samples that training.global_batch_size divides\n"
    ) in done.stderr
