"""Training on prepared folders: a weighted mixture logs its tokens per source and resumes bitwise."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest  # noqa: E402
from hyper_parallel.config import load_config  # noqa: E402
from hyper_parallel.data import shards  # noqa: E402
from hyper_parallel.launch import main  # noqa: E402
from hyper_parallel.trainer import LLMTrainer, StepResult  # noqa: E402
from tests.support import ROOT  # noqa: E402
from tests.support.components import write_jsonl  # noqa: E402
from tests.support.prepared import prepare, run_prepare, tokenizer_config  # noqa: E402
from tests.support.processes import torchrun  # noqa: E402
from tests.support.trainer import (  # noqa: E402
    WORKER,
    as_flags,
    debug_config_path,
    tiny_config,
    tiny_overrides,
)


@pytest.fixture
def corpora(tmp_path: Path) -> tuple[str, str]:
    """Two prepared folders (byte tokenizer, as the llama3 debug config): about 60 and 30 samples of 32."""
    config = tokenizer_config(tmp_path / "cfg")
    big = prepare([write_jsonl(tmp_path / "a.jsonl", 100)], tmp_path / "big", config)
    small = prepare([write_jsonl(tmp_path / "b.jsonl", 50, start=500)], tmp_path / "small", config)
    return str(big), str(small)


def mixture(paths: tuple[str, str], **extra: str) -> dict[str, str]:
    return {
        "dataloader.dataset.source": "tokenized",
        "dataloader.dataset.paths": json.dumps(list(paths)),
        "dataloader.dataset.weights": "[3, 1]",
        "training.max_steps": "3",
        **extra,
    }


def run(overrides: dict[str, str], steps: int | None = None) -> tuple[LLMTrainer, list[StepResult]]:
    trainer = LLMTrainer(tiny_config("llama3", overrides))
    try:
        if steps is None:
            return trainer, trainer.train()
        results = [trainer.train_step() for _ in range(steps)]
        trainer.checkpointer.save(trainer.step)
        return trainer, results
    finally:
        trainer.close()


def launch(flags: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["--config-file", str(debug_config_path("llama3")), *flags], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_a_weighted_mixture_logs_tokens_per_source_and_resumes_bitwise(
    tmp_path: Path, corpora: tuple[str, str]
) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    logging = {"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(jsonl), "metrics.log_freq": "1"}
    status, out, err = launch(as_flags({**tiny_overrides("llama3"), **mixture(corpora, **logging)}))
    assert status == 0, err
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    # Global batch 4 samples of 32 tokens per step, blended 3:1 (positions 0-3: big, big, small, big, ...).
    big, small = corpora
    assert [r["data_tokens"] for r in records] == [{big: 3 * 32 * s, small: 1 * 32 * s} for s in range(1, 4)]
    lines = [line for line in out.splitlines() if "] step " in line]
    assert len(lines) == 3
    assert all(line.endswith(f"data {big} 75% {small} 25%") for line in lines)
    checkpointing = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}
    run(mixture(corpora, **checkpointing), steps=1)
    second, resumed = run(mixture(corpora, **checkpointing))
    assert second.resumed_from == 1
    assert [r.step for r in resumed] == [2, 3]
    assert [r.loss for r in resumed] == [r["loss"] for r in records[1:]]  # bitwise (JSON floats round-trip)
    assert [r.grad_norm for r in resumed] == [r["grad_norm"] for r in records[1:]]


def records_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_mixture_checkpointed_under_two_data_parallel_ranks_resumes_in_one_process(
    tmp_path: Path, corpora: tuple[str, str]
) -> None:
    def logging(name: str) -> dict[str, str]:
        path = str(tmp_path / f"{name}.jsonl")
        return {"metrics.enable_jsonl": "true", "metrics.jsonl_path": path, "metrics.log_freq": "1"}

    # Three steps straight on two data-parallel ranks, saving after each; the blended epoch (98 samples)
    # splits evenly into the global batches of 2 under either layout.
    saving = {
        "training.global_batch_size": "2",
        "training.micro_batch_size": "1",
        "checkpoint.enable": "true",
        "checkpoint.interval": "1",
        "checkpoint.keep_latest_k": "0",
        "checkpoint.last_save_model_only": "false",
    }
    straight = {**mixture(corpora, **saving, **logging("straight")), "parallelism.dp_shard": "2"}
    straight["checkpoint.folder"] = str(tmp_path / "ckpt")
    done = torchrun(
        2, WORKER, "train", "llama3", str(tmp_path / "report"), *(f"{k}={v}" for k, v in straight.items())
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    ranks = [json.loads((tmp_path / f"report.rank{r}.json").read_text()) for r in range(2)]
    assert sorted(rank["dp_rank"] for rank in ranks) == [0, 1]  # really two data-parallel ranks
    # Step 1's checkpoint, resumed in one process for steps 2 and 3.
    shutil.copytree(tmp_path / "ckpt" / "step-1", tmp_path / "resume" / "step-1")
    resuming = {**saving, **logging("resumed"), "checkpoint.folder": str(tmp_path / "resume")}
    second, resumed = run(mixture(corpora, **resuming))
    assert second.resumed_from == 1
    assert [r.step for r in resumed] == [2, 3]
    # The same global batches: the tokens each source supplied, then the losses (fp32, another reduction
    # order under two ranks: within 1e-5).
    expected = records_of(tmp_path / "straight.jsonl")
    assert [r["step"] for r in expected] == [1, 2, 3]
    big, small = corpora
    assert expected[-1]["data_tokens"] == {big: 5 * 32, small: 1 * 32}  # 6 samples of 32 of the 3:1 blend
    event, *after = records_of(tmp_path / "resumed.jsonl")
    assert {k: event[k] for k in ("step", "event")} == {"step": 1, "event": "resumed"}
    assert [r["step"] for r in after] == [2, 3]
    assert [r["data_tokens"] for r in after] == [r["data_tokens"] for r in expected[1:]]
    assert [r.loss for r in resumed] == pytest.approx(ranks[0]["losses"][1:], abs=1e-5, rel=0)


def test_folders_prepared_with_another_tokenizer_are_an_input_error_at_launch(
    tmp_path: Path, corpora: tuple[str, str]
) -> None:
    # The same folders under a byte tokenizer that adds no BOS: another fingerprint, refused at launch.
    flags = [*as_flags({**tiny_overrides("llama3"), **mixture(corpora)}), "--tokenizer.add_bos", "false"]
    status, _, err = launch(flags)
    assert status == 2
    big, _ = corpora
    (message,) = [line for line in err.splitlines() if "warning" not in line]
    assert message.startswith(f"{big}/manifest.json: dataset.paths: prepared with tokenizer ")
    assert "add_bos True" in message
    assert "add_bos False" in message
    assert "Traceback" not in err


def test_the_shipped_prepared_config_reads_the_folder_its_header_command_prepares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ROOT / "configs" / "llama3_debug_prepared.yaml"
    command = " ".join(line.strip(" #\\") for line in config.read_text().splitlines()[2:4]).split()
    assert command[:4] == ["python", "-m", "hyper_parallel.data", "prepare"]
    args = [arg.strip("'") for arg in command[3:]]
    assert args[args.index("--output") + 1] == "runs/prepared/hyper_parallel_src"
    folder = tmp_path / "src"
    args[args.index("--output") + 1] = str(folder)
    monkeypatch.chdir(ROOT)
    status, _, err = run_prepare(*args)
    assert status == 0, err
    paths = json.dumps([str(folder)])
    cfg = load_config(config, {"dataloader.dataset.paths": paths, "validator.dataset.paths": paths})
    tokenizer = cfg.tokenizer.build()
    sources = sorted((ROOT / "hyper_parallel").rglob("*.py"))
    prepared = shards.open_prepared(folder)
    assert prepared.documents == len(sources)
    first = prepared.shards[0]
    assert first.tokens[: first.offsets[1]].tolist() == tokenizer.encode(sources[0].read_text())
    request = LoaderRequest(tokenizer, 0, 1, seq_len=cfg.training.seq_len, micro_batch_size=4, seed=0)
    train = cfg.dataloader.build(request).samples.corpus
    held = cfg.validator.build_dataloader(request).samples.corpus  # type: ignore[attr-defined]
    kept = len(sources) - int(len(sources) * 0.05)
    assert (train.documents, held.first, held.documents) == (kept, kept, len(sources) - kept)
    assert train.end == held.begin == int(first.offsets[kept])
