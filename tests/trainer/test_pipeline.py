"""Pipeline parallelism through torchrun and the trainer: the losses of one process, stages really split.

Each case trains the tiny Llama 3 debug config for 4 steps under ``torchrun`` with gloo and compares every
step's loss and gradient norm with one process training the same global batch (fp32, 1e-5). The ranks
report which parameters they hold (the stage split: embeddings on the first stage, norm and output on the
last, the blocks dealt between them, names unchanged) and the batch size of every forward call of every
stage (how the schedule cut the micro-batches). Checkpoints saved under pipelining resume in one process.
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

from hyper_parallel.sections import PP_STAGES_PER_RANK  # noqa: E402
from hyper_parallel.trainer import LLMTrainer, rules  # noqa: E402
from hyper_parallel.trainer.config import TrainerConfig  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    WORKER,
    saving_every_two_steps,
    tiny_config,
    train_runs_under_torchrun,
)

DATA = {"dataloader.dataset.source": "python_docs"}  # packed documents: document_ids reach every stage
PIPE = {"parallelism.dp_shard": "1", "parallelism.pp": "2"}
LAYERS_4 = {"model.overrides.n_layers": "4"}


def _single_process(overrides: dict[str, str]) -> tuple[list[float], list[float], set[str]]:
    trainer = LLMTrainer(tiny_config("llama3", {**DATA, **overrides}))
    try:
        results = trainer.train()
        names = {name for name, _ in trainer.model.named_parameters()}
        return [r.loss for r in results], [r.grad_norm for r in results], names
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def pp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every 2-rank pipeline run of this module, trained in one torchrun job (start-up paid once), by name;
    ``"hf"`` and ``"pp"`` are the folders of the pretrained weights and of the checkpointing run."""
    tmp = tmp_path_factory.mktemp("pipeline")
    batch = {"training.micro_batch_size": "4"}  # one micro-batch of 4 sequences per step
    runs: dict[str, dict[str, str]] = {
        schedule: {**PIPE, **model, "parallelism.pp_schedule": schedule}
        for schedule, (model, _, _) in CASES.items()
    }
    runs["microbatches-4"] = {**PIPE, **batch, "parallelism.pp_microbatches": "4"}
    runs["microbatches-default"] = {**PIPE, **batch}
    runs["checkpoint"] = {**PIPE, **saving_every_two_steps(tmp / "pp")}
    try:
        from tests.support.llama3_reference import hf_model
    except ImportError:  # transformers: the pretrained-weights test skips
        pass
    else:
        hf_model(tiny_config("llama3").model.args).save_pretrained(tmp / "hf")
        runs["pretrained"] = {**PIPE, "model.weights_path": str(tmp / "hf")}
    reports, _ = train_runs_under_torchrun(
        2, tmp, {name: ("llama3", {**DATA, **overrides}) for name, overrides in runs.items()}
    )
    return {**reports, "hf": tmp / "hf", "pp": tmp / "pp"}


def _run(world: int, overrides: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "report"
    pairs = [f"{k}={v}" for k, v in {**DATA, **overrides}.items()]
    done = torchrun(world, WORKER, "train", "llama3", str(out), *pairs, timeout=400)
    _check(done)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]


def _check(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"


def _blocks(names: set[str] | list[str]) -> list[int]:
    return sorted({int(name.split(".")[1]) for name in names if name.startswith("layers.")})


def _top(names: set[str] | list[str]) -> set[str]:
    return {name for name in names if not name.startswith("layers.")}


def _calls(calls: list[int]) -> list[int]:
    """Forward calls of a stage without the first, when torch inferred the stage's shapes by running it
    once on the first micro-batch (it does in torch 2.13: one call more than micro-batches)."""
    return calls[1:] if len(calls) % 2 else calls


# schedule -> model overrides, the stages each of the 2 ranks holds and the blocks of each rank
CASES = {
    "1F1B": ({}, [[0], [1]], [[0], [1]]),
    "GPipe": ({}, [[0], [1]], [[0], [1]]),
    "Interleaved1F1B": (LAYERS_4, [[0, 2], [1, 3]], [[0, 2], [1, 3]]),
}


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", list(CASES))
def test_pipeline_matches_one_process_and_each_rank_holds_its_stages(schedule: str, pp_runs: Any) -> None:
    model, stages, blocks = CASES[schedule]
    ranks = pp_runs[schedule]
    losses, norms, names = _single_process(model)
    for report in ranks:
        assert report["losses"] == pytest.approx(losses, abs=1e-5)
        assert report["grad_norms"] == pytest.approx(norms, abs=1e-5)  # clipped over both stages
    held = [list(report["params"]) for report in ranks]
    assert [sorted(map(int, report["stages"])) for report in ranks] == stages
    assert [_blocks(h) for h in held] == blocks
    assert _top(held[0]) == {"tok_embeddings.weight"}  # the first stage embeds
    assert _top(held[1]) == {"norm.weight", "output.weight"}  # the last projects to the vocabulary
    assert sorted(held[0] + held[1]) == sorted(names)  # every name of the whole model, held once
    for report in ranks:  # 4 steps x 2 micro-batches of 2 sequences, cut in 2 (pp_microbatches null: pp)
        assert all(_calls(calls) == [1] * 16 for calls in report["stages"].values()), report["stages"]
        assert not any(p["dtensor"] for p in report["params"].values())  # pp alone shards nothing else


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pp_microbatches_sets_the_schedule_micro_batches(pp_runs: Any) -> None:
    ranks = pp_runs["microbatches-4"]
    losses, norms, _ = _single_process({"training.micro_batch_size": "4"})
    for report in ranks:
        assert report["losses"] == pytest.approx(losses, abs=1e-5)
        assert report["grad_norms"] == pytest.approx(norms, abs=1e-5)
        assert [_calls(c) for c in report["stages"].values()] == [[1] * 16]  # 4 steps x 4 micro-batches of 1
    default = pp_runs["microbatches-default"]
    assert [_calls(c) for c in default[0]["stages"].values()] == [[2] * 8]  # null: pp = 2 micro-batches of 2


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pipeline_with_fsdp_on_four_processes(tmp_path: Path) -> None:
    ranks = _run(4, {"parallelism.dp_shard": "2", "parallelism.pp": "2"}, tmp_path)
    losses, norms, _ = _single_process({})
    for report in ranks:
        assert report["losses"] == pytest.approx(losses, abs=1e-5)
        assert report["grad_norms"] == pytest.approx(norms, abs=1e-5)
    # ranks row-major over (pp, dp_shard): 0 and 1 hold the first stage, 2 and 3 the last
    assert [sorted(map(int, r["stages"])) for r in ranks] == [[0], [0], [1], [1]]
    assert [r["dp_rank"] for r in ranks] == [0, 1, 0, 1]
    assert [_top(r["params"]) for r in ranks] == [{"tok_embeddings.weight"}] * 2 + [
        {"norm.weight", "output.weight"}
    ] * 2
    for report in ranks:
        for name, held in report["params"].items():
            assert held["mesh"] == ["dp_shard"], name
            assert held["placements"] == ["Shard(dim=0)"], name
            assert held["local"][0] == -(-held["global"][0] // 2), name


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_pretrained_weights_reach_every_stage(pp_runs: Any) -> None:
    """Rank 0 reads the Hugging Face folder of the whole model; each stage keeps its own tensors."""
    pytest.importorskip("transformers")
    weights = {"model.weights_path": str(pp_runs["hf"])}
    ranks = pp_runs["pretrained"]
    losses, norms, _ = _single_process(weights)
    seeded, _, _ = _single_process({})
    assert losses[0] != pytest.approx(seeded[0], abs=1e-3)  # the files, not the seed, gave the weights
    for report in ranks:
        assert report["losses"] == pytest.approx(losses, abs=1e-5)
        assert report["grad_norms"] == pytest.approx(norms, abs=1e-5)


def _resume_to_step_6(folder: Path) -> list[float]:
    trainer = LLMTrainer(
        tiny_config("llama3", {**DATA, **saving_every_two_steps(folder), "training.max_steps": "6"})
    )
    try:
        assert trainer.resumed_from == 4
        return [r.loss for r in trainer.train()]
    finally:
        trainer.close()


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_a_pipeline_checkpoint_resumes_in_one_process(pp_runs: Any, tmp_path: Path) -> None:
    """Saved by two pipeline stages (names of the whole model), resumed by one process: steps 5 and 6 are
    those of a one-process run resumed from its own step-4 checkpoint (the schedule depends on max_steps,
    so an uninterrupted 6-step run is no reference)."""
    ranks, saved = pp_runs["checkpoint"], pp_runs["pp"]
    assert sorted(p.name for p in saved.iterdir()) == ["step-2", "step-4"]
    shutil.copytree(saved, tmp_path / "pp")  # the resumed run saves beside them
    losses, _, _ = _single_process(saving_every_two_steps(tmp_path / "one"))
    assert ranks[0]["losses"] == pytest.approx(losses, abs=1e-5)
    assert _resume_to_step_6(tmp_path / "pp") == pytest.approx(_resume_to_step_6(tmp_path / "one"), abs=1e-5)


def test_resolve_time_schedule_rules_agree_with_torch_schedules() -> None:
    """Every (schedule, pp, micro-batches) the resolver accepts builds in torch and every one it refuses
    fails there, checked on a fake process group."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torch.testing._internal.distributed.fake_pg import FakeStore

    batch = "27720"  # every count from 1 to 12 divides it: only the schedule's own rules can refuse
    base = tiny_config(
        "llama3",
        {
            "model.overrides.n_layers": "8",
            "training.micro_batch_size": batch,
            "training.global_batch_size": batch,
        },
    )
    disagreements = []
    for pp in (2, 3, 4):
        dist.init_process_group("fake", rank=0, world_size=pp, store=FakeStore())
        try:
            for schedule, per_rank in PP_STAGES_PER_RANK.items():
                ids = [0, 2 * pp - 1] if schedule == "ZBVZeroBubble" else [r * pp for r in range(per_rank)]
                stages = [
                    PipelineStage(torch.nn.Linear(2, 2), i, pp * per_rank, torch.device("cpu")) for i in ids
                ]
                cls = get_schedule_class(schedule)
                for count in range(1, 13):
                    refused = list(rules.pipeline_issues(_evolved(base, pp, schedule, count), pp))
                    try:
                        cls(stages[0] if issubclass(cls, PipelineScheduleSingle) else stages, count)
                        built = True
                    except ValueError:
                        built = False
                    if built == bool(refused):
                        disagreements.append((schedule, pp, count, refused))
        finally:
            dist.destroy_process_group()
    assert disagreements == []


def _evolved(base: TrainerConfig, pp: int, schedule: str, count: int) -> TrainerConfig:
    import attrs

    parallelism = attrs.evolve(base.parallelism, pp=pp, pp_schedule=schedule, pp_microbatches=count)
    return attrs.evolve(base, parallelism=parallelism)
