"""A checkpoint saved under one layout resumes under another and continues with the same losses.

Each case trains the tiny debug config for 4 steps uninterrupted under the saved layout (checkpoints at
steps 2 and 4), copies the step-2 checkpoint into a fresh folder and resumes it under another layout
(FSDP2 on two processes, tensor parallelism on two, or one process): steps 3 and 4 must give the
uninterrupted run's losses within 1e-5 (fp32). The 12 synthetic samples and the global batch of 4 make
step 4 start a new, reshuffled epoch, so the data position crosses an epoch end after the resume.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    ROOT,
    as_flags,
    tiny_config,
    tiny_overrides,
    train_runs_under_torchrun,
)

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


def _one_process(model: str, folder: Path) -> dict[str, Any]:
    """Train in this process with checkpoints in ``folder``: the losses and the step it resumed from."""
    trainer = LLMTrainer(tiny_config(model, _overrides(model, "one", folder)))
    try:
        return {"losses": [r.loss for r in trainer.train()], "resumed_from": trainer.resumed_from}
    finally:
        trainer.close()


def _two_processes(runs: dict[str, tuple[str, str, Path]], folder: Path) -> dict[str, dict[str, Any]]:
    """``name -> (model, layout, checkpoint folder)`` trained in one 2-rank job; rank 0's report by name."""
    jobs = {name: (model, _overrides(model, layout, ckpt)) for name, (model, layout, ckpt) in runs.items()}
    reports, _ = train_runs_under_torchrun(2, folder, jobs)
    for ranks in reports.values():
        assert ranks[0]["losses"] == ranks[1]["losses"]
    return {name: ranks[0] for name, ranks in reports.items()}


CASES = [
    ("llama3", "dp_shard2", "tp2"),
    ("llama3", "dp_shard2", "one"),
    ("llama3", "one", "dp_shard2"),
    ("qwen3_5", "dp_shard2", "tp2"),
    ("qwen3_5", "dp_shard2", "one"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted runs (steps 1-4, saving at 2 and 4), then every resumed run that needs two
    processes, each from a copy of its saved run's step-2: two torchrun jobs in all. ``"saved"`` maps
    ``(model, layout)`` to (losses, step-2 folder); ``"resumed"`` a case's id to its report."""
    tmp = tmp_path_factory.mktemp("reshard")
    saved_layouts = sorted({(model, saved) for model, saved, _ in CASES})
    uninterrupted = {
        f"{model}-{layout}": (model, layout, tmp / f"{model}-{layout}")
        for model, layout in saved_layouts
        if layout != "one"
    }
    reports = _two_processes(uninterrupted, tmp / "first")
    for model, layout in saved_layouts:
        if layout == "one":
            reports[f"{model}-{layout}"] = _one_process(model, tmp / f"{model}-{layout}")
    saved = {}
    for model, layout in saved_layouts:
        folder = tmp / f"{model}-{layout}"
        assert len(reports[f"{model}-{layout}"]["losses"]) == 4
        assert sorted(p.name for p in folder.iterdir()) == ["step-2", "step-4"]
        saved[model, layout] = (reports[f"{model}-{layout}"]["losses"], folder / "step-2")
    resumed_by_two = {}
    for model, layout, resumed in CASES:
        if resumed != "one":
            ckpt = tmp / "-".join((model, layout, resumed))
            shutil.copytree(saved[model, layout][1], ckpt / "step-2")
            resumed_by_two["-".join((model, layout, resumed))] = (model, resumed, ckpt)
    return {"saved": saved, "resumed": _two_processes(resumed_by_two, tmp / "resumed")}


@pytest.mark.parametrize(("model", "saved", "resumed"), CASES, ids=["-".join(case) for case in CASES])
def test_a_checkpoint_resumes_on_another_layout_with_the_same_losses(
    runs: dict[str, Any], model: str, saved: str, resumed: str, tmp_path: Path
) -> None:
    expected, step2 = runs["saved"][model, saved]
    if resumed == "one":
        shutil.copytree(step2, tmp_path / "ckpt" / "step-2")
        report = _one_process(model, tmp_path / "ckpt")
    else:
        report = runs["resumed"]["-".join((model, saved, resumed))]
    assert report["resumed_from"] == 2
    assert report["losses"] == pytest.approx(expected[2:], abs=1e-5, rel=0)
    if resumed == "tp2":  # the resumed model is really tensor-parallel, not replicated
        wq = next(p for n, p in report["params"].items() if n.endswith(".attention.wq.weight"))
        assert (wq["mesh"], wq["placements"]) == (["tp"], ["Shard(dim=0)"])
        assert wq["local"][0] * 2 == wq["global"][0]
    elif resumed == "dp_shard2":
        assert {tuple(p["placements"]) for p in report["params"].values()} == {("Shard(dim=0)",)}


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
