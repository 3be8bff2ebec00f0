"""LLMTrainer in one process: the train step's arithmetic, resume, debug switches, metrics."""

from __future__ import annotations

import gc
import io
import json
import math
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hyper_parallel.components.dataloader import LoaderRequest  # noqa: E402
from hyper_parallel.launch import main  # noqa: E402
from hyper_parallel.trainer import (  # noqa: E402
    LLMTrainer,
    NonFiniteError,
    StepResult,
    TrainingError,
    VLTrainer,
)
from tests.support.trainer import (  # noqa: E402
    as_flags,
    debug_config_path,
    tiny_config,
    tiny_overrides,
    write_hf_weights,
)


def train(
    overrides: dict[str, Any] | None = None, model: str = "llama3"
) -> tuple[LLMTrainer, list[StepResult]]:
    trainer = LLMTrainer(tiny_config(model, overrides))
    try:
        return trainer, trainer.train()
    finally:
        trainer.close()


@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_trainer_builds_from_the_config_alone_and_trains_every_step(model: str) -> None:
    trainer, results = train(model=model)
    assert [r.step for r in results] == [1, 2, 3, 4]
    assert all(math.isfinite(r.loss) and r.loss > 0 for r in results)
    assert all(math.isfinite(r.grad_norm) for r in results)
    assert trainer.step == 4
    assert trainer.accumulation_steps == 2  # global 4 = micro 2 x accumulation 2 x dp 1
    assert results[0].tokens == 4 * 32


def test_gradient_accumulation_matches_one_micro_batch_holding_the_whole_global_batch() -> None:
    _, one = train({"training.micro_batch_size": "4"})
    _, accumulated = train({"training.micro_batch_size": "1"})
    assert [r.loss for r in accumulated] == pytest.approx([r.loss for r in one], abs=1e-5)
    assert [r.grad_norm for r in accumulated] == pytest.approx([r.grad_norm for r in one], rel=1e-4)


def test_sum_reduction_weights_every_token_equally_across_micro_batches() -> None:
    # Unpacked documents padded to seq_len count different numbers of tokens per micro-batch: the token-
    # weighted loss ('sum') then differs from the mean of micro-batch means ('mean') and equals the loss of
    # the whole global batch computed at once.
    docs = {
        "dataloader.dataset.source": "python_docs",
        "dataloader.dataset.pack_sequences": "false",
        "training.seq_len": "512",
    }
    _, mean_of_means = train({**docs, "training.max_steps": "1", "loss.reduction": "mean"})
    _, weighted = train({**docs, "training.max_steps": "1", "loss.reduction": "sum"})
    _, whole = train({**docs, "training.max_steps": "1", "training.micro_batch_size": "4"})  # the default
    assert weighted[0].loss == pytest.approx(whole[0].loss, abs=1e-5)
    assert weighted[0].loss != pytest.approx(mean_of_means[0].loss, abs=1e-4)


class _SparseLabels(LLMTrainer):
    """Fine-tuning-like labels: the n-th sequence of the run keeps only its last ``1 + 7n mod 13`` labels
    (an answer after an ignored prompt), so micro-batches count very different numbers of tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.sequences_seen = 0
        super().__init__(*args, **kwargs)

    def host_inputs(self, batch: Any) -> dict[str, Any]:
        labels = batch["labels"].clone()
        for row in range(labels.shape[0]):
            kept = 1 + (7 * self.sequences_seen) % 13
            labels[row, : labels.shape[1] - kept] = -100
            self.sequences_seen += 1
        return {**super().host_inputs(batch), "labels": labels}


def _sparse_losses(overrides: dict[str, str]) -> list[float]:
    run = {
        "training.max_steps": "3",
        "training.global_batch_size": "8",
        "training.mixed_precision_param": "float32",
        **overrides,
    }
    trainer = _SparseLabels(tiny_config("llama3", run))
    try:
        return [r.loss for r in trainer.train()]
    finally:
        trainer.close()


def test_the_default_loss_is_normalised_over_the_global_batch_so_accumulation_changes_nothing() -> None:
    # Sparse SFT-like labels (1 to 13 of 32 per sequence): one micro-batch of 8 against 4 of 2 (the same
    # global batch). The default divides by the step's supervised tokens: the same losses; the mean of
    # the micro-batch means ('mean', by name) weighs a micro-batch of few labels like one of many.
    whole = _sparse_losses({"training.micro_batch_size": "8"})
    accumulated = _sparse_losses({"training.micro_batch_size": "2"})
    assert accumulated == pytest.approx(whole, abs=1e-5, rel=0)
    by_micro_batch = _sparse_losses({"training.micro_batch_size": "2", "loss.reduction": "mean"})
    assert all(abs(a - b) > 1e-3 for a, b in zip(by_micro_batch, whole, strict=True))
    assert tiny_config("llama3").loss.reduction == "sum"


def test_one_of_max_steps_and_epochs_gives_the_run_length() -> None:
    from hyper_parallel.config import ConfigError

    with pytest.raises(ConfigError) as both:
        tiny_config("llama3", {"training.epochs": "2"})  # beside TINY_RUN's max_steps 4
    assert [(i.path, str(i.message)) for i in both.value.issues] == [
        (
            "training.epochs",
            "is 2 and max_steps is 4: give one of the two; to train by epochs, set max_steps to null",
        )
    ]
    with pytest.raises(ConfigError) as neither:
        tiny_config("llama3", {"training.max_steps": "null"})
    assert [(i.path, str(i.message)) for i in neither.value.issues] == [
        ("training.max_steps", "is null and so is epochs: give one of the two (the run's length)")
    ]
    assert (tiny_config("llama3").training.max_steps, tiny_config("llama3").training.epochs) == (4, None)


def test_epochs_train_whole_passes_log_the_epoch_and_resume_exactly(tmp_path: Path) -> None:
    # 10 samples an epoch, a global batch of 4: 2 epochs are ceil(20 / 4) = 5 steps.
    by_epochs = {
        "training.max_steps": "null",
        "training.epochs": "2",
        "dataloader.dataset.source": "python_docs",
        "dataloader.dataset.max_samples": "10",
    }
    checkpointing = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}

    def logged(name: str) -> dict[str, str]:
        path = tmp_path / f"{name}.jsonl"
        return {"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(path), "metrics.log_freq": "1"}

    out = io.StringIO()
    straight = LLMTrainer(tiny_config("llama3", {**by_epochs, **logged("straight")}), stream=out)
    try:
        expected = straight.train()
        assert (straight.max_steps, straight.samples_per_epoch, straight.dataloader.epoch) == (5, 10, 2)
    finally:
        straight.close()
    records = [json.loads(line) for line in (tmp_path / "straight.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in records] == [(1, 0.4), (2, 0.8), (3, 1.2), (4, 1.6), (5, 2.0)]
    lines = out.getvalue().splitlines()
    assert "; 5 steps (2 epochs of 10 samples)" in lines[0]  # the banner
    warned = io.StringIO()  # the periods bound by the run's steps are checked once they are counted
    LLMTrainer(tiny_config("llama3", {**by_epochs, "lr_scheduler.warmup_steps": "9"}), stream=warned).close()
    assert warned.getvalue().splitlines()[0] == (
        "warning: lr_scheduler.warmup_steps: must be <= the steps of training.epochs (5), got 9"
    )
    assert "  epoch 1.2  " in next(line for line in lines if "step 3/5" in line)

    first = LLMTrainer(tiny_config("llama3", {**by_epochs, **checkpointing}))
    for _ in range(3):
        first.train_step()
    first.checkpointer.save(first.step)
    first.close()
    second = LLMTrainer(tiny_config("llama3", {**by_epochs, **checkpointing, **logged("resumed")}))
    try:
        assert (second.step, second.dataloader.epoch) == (3, 1)  # 12 samples read: in the second epoch
        resumed = second.train()
        assert second.dataloader.epoch == 2
    finally:
        second.close()
    assert [r.loss for r in resumed] == [r.loss for r in expected[3:]]
    after = [json.loads(line) for line in (tmp_path / "resumed.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in after if "epoch" in r] == [(4, 1.6), (5, 2.0)]


def test_max_grad_norm_clips_and_null_only_measures() -> None:
    sgd = {"optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config", "optimizer.lr": "2.0"}
    _, clipped = train({**sgd, "training.max_grad_norm": "0.001", "training.max_steps": "2"})
    _, free = train({**sgd, "training.max_grad_norm": "null", "training.max_steps": "2"})
    assert clipped[0].grad_norm == pytest.approx(free[0].grad_norm, rel=1e-5)  # reported before clipping
    assert free[1].loss < clipped[1].loss - 1e-3  # the clipped update was tiny, the free one helped


def test_resume_continues_with_bitwise_equal_losses(tmp_path: Path) -> None:
    checkpointing = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}
    straight = {"training.max_steps": "6", "dataloader.dataset.source": "python_docs"}
    _, expected = train(straight)
    first = LLMTrainer(tiny_config("llama3", {**straight, **checkpointing}))
    for _ in range(3):
        first.train_step()
    first.checkpointer.save(first.step)
    first.close()
    jsonl = tmp_path / "metrics.jsonl"
    logged = {"metrics.enable_jsonl": "true", "metrics.jsonl_path": str(jsonl), "metrics.log_freq": "3"}
    second = LLMTrainer(tiny_config("llama3", {**straight, **checkpointing, **logged}))
    try:
        assert second.step == 3
        resumed = second.train()
    finally:
        second.close()
    marks = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(m["run_id"], m["step"], m.get("event")) for m in marks] == [
        (second.metrics.run_id, 3, "resumed"),
        (second.metrics.run_id, 6, None),
    ]
    assert [r.step for r in resumed] == [4, 5, 6]
    assert [r.loss for r in resumed] == [r.loss for r in expected[3:]]  # bitwise
    assert [r.grad_norm for r in resumed] == [r.grad_norm for r in expected[3:]]


def test_a_finished_run_trains_nothing_when_launched_again(tmp_path: Path, capsys: Any) -> None:
    checkpointing = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}
    train({**checkpointing, "training.max_steps": "2"})
    _, results = train({**checkpointing, "training.max_steps": "2"})
    assert results == []
    assert "nothing to train: already at step 2 of 2" in capsys.readouterr().out


def test_check_nan_inf_stops_with_a_message_naming_the_step() -> None:
    exploding = {
        "debug.check_nan_inf": "true",
        "optimizer._target_": "hyper_parallel.components.optimizer.SGD.Config",
        "optimizer.lr": "1e30",
        "training.max_grad_norm": "null",
        "training.max_steps": "10",
    }
    with pytest.raises(NonFiniteError) as caught:
        train(exploding)
    assert re.fullmatch(
        r"step \d+: the (loss|gradient norm) is (nan|inf) \(debug\.check_nan_inf\); lower optimizer\.lr, "
        r"enable training\.max_grad_norm, or set debug\.detect_anomaly to find the operation",
        str(caught.value),
    )
    assert caught.value.step >= 1


#: AdamW at lr 1e10 on the tiny llama3 run: step 1 is finite, every later loss and gradient norm is NaN.
DIVERGING = {"optimizer.lr": "1e10", "training.max_steps": "8"}
NAN_AT_STEP_2 = (
    "step 2: the loss is nan (debug.check_nan_inf); lower optimizer.lr, enable training.max_grad_norm, or "
    "set debug.detect_anomaly to find the operation"
)


def test_nan_trains_on_only_when_check_nan_inf_is_turned_off() -> None:
    _, results = train({**DIVERGING, "debug.check_nan_inf": "false"})
    assert [r.step for r in results] == list(range(1, 9))
    assert math.isfinite(results[0].loss)
    assert math.isfinite(results[0].grad_norm)
    assert all(math.isnan(r.loss) and math.isnan(r.grad_norm) for r in results[1:])


def test_check_nan_inf_is_on_by_default_and_read_on_logged_steps_naming_the_first_non_finite_step() -> None:
    assert tiny_config().debug.check_nan_inf
    trainer = LLMTrainer(tiny_config("llama3", {**DIVERGING, "metrics.log_freq": "4"}))
    try:
        with pytest.raises(NonFiniteError) as caught:
            trainer.train()
    finally:
        trainer.close()
    assert str(caught.value) == NAN_AT_STEP_2
    assert caught.value.step == 2
    assert trainer.step == 4  # the device-side flag is read on the next logged step, not every step


def test_a_diverging_run_exits_1_naming_the_first_non_finite_step_and_keeps_its_finite_checkpoint(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ckpt"
    checkpointing = {
        "checkpoint.enable": "true",
        "checkpoint.folder": str(folder),
        "checkpoint.interval": "1",
        "checkpoint.keep_latest_k": "1",  # would prune the finite step 1 if NaN step 2 were saved
    }
    out, err = io.StringIO(), io.StringIO()
    status = main(
        [
            "--config-file",
            str(debug_config_path("llama3")),
            *as_flags(tiny_overrides("llama3", **DIVERGING, **checkpointing)),
        ],
        out=out,
        err=err,
    )
    assert status == 1
    assert f"training stopped: {NAN_AT_STEP_2}\n" in err.getvalue()
    assert "done" not in out.getvalue()
    assert sorted(p.name for p in folder.iterdir() if p.name != ".lock") == ["step-1"]
    resumed = LLMTrainer(tiny_config("llama3", {**checkpointing, "training.max_steps": "2"}))
    try:
        assert resumed.step == 1
        assert all(bool(torch.isfinite(p).all()) for p in resumed.model.parameters())
        moments = [v for state in resumed.optimizer.state.values() for v in state.values()]
        assert moments
        assert all(bool(torch.isfinite(v).all()) for v in moments)
    finally:
        resumed.close()


def test_pretrained_weights_holding_nan_are_refused_at_load_naming_the_file_and_tensor(
    tmp_path: Path,
) -> None:
    pytest.importorskip("safetensors.torch")

    def poison(hf: dict[str, Any]) -> None:
        hf["model.embed_tokens.weight"][0, 1] = math.nan

    weights = write_hf_weights(tmp_path / "weights", poison)
    out, err = io.StringIO(), io.StringIO()
    saving = {"checkpoint.enable": "true", "checkpoint.folder": str(tmp_path / "ckpt")}  # a fine-tune saves
    flags = as_flags(tiny_overrides("llama3", **{"model.weights_path": str(weights)}, **saving))
    status = main(["--config-file", str(debug_config_path("llama3")), *flags], out=out, err=err)
    assert status == 2
    assert err.getvalue().splitlines()[-1] == (
        f"{weights / 'model.safetensors'}: tensor 'model.embed_tokens.weight' holds nan; these weights "
        "cannot be trained from"
    )
    assert "Traceback" not in err.getvalue()


def test_debug_switches_reach_torch() -> None:
    try:
        trainer = LLMTrainer(
            tiny_config(
                "llama3",
                {
                    "debug.deterministic": "true",
                    "debug.deterministic_warn_only": "true",
                    "debug.detect_anomaly": "true",
                    "debug.seed": "7",
                },
            )
        )
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.is_anomaly_enabled()
        assert trainer.seed == 7
        trainer.close()
    finally:
        torch.use_deterministic_algorithms(False)
        torch.autograd.set_detect_anomaly(False)


def test_debug_seed_replaces_training_seed_for_weights_and_data() -> None:
    _, by_debug = train({"debug.seed": "5", "training.max_steps": "1"})
    _, by_training = train({"training.seed": "5", "training.max_steps": "1"})
    _, other = train({"training.seed": "6", "training.max_steps": "1"})
    assert by_debug[0].loss == by_training[0].loss
    assert by_debug[0].loss != other[0].loss


def test_gc_freq_turns_off_automatic_collection_and_collects_every_n_steps() -> None:
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        train({"training.gc_freq": "2", "training.max_steps": "4"})
    finally:
        gc.callbacks.remove(count)
    assert collections.count(1) == 2  # steps 2 and 4; automatic young-generation passes were off
    assert gc.isenabled()


def test_print_config_prints_the_resolved_config_on_rank_zero(capsys: Any) -> None:
    train({"debug.print_config": "true", "training.max_steps": "1"})
    out = capsys.readouterr().out
    assert "_target_: hyper_parallel.trainer.config.DebugConfig" in out
    assert "print_config: true" in out


def test_bfloat16_without_fsdp_computes_under_autocast() -> None:
    trainer = LLMTrainer(tiny_config("llama3", {"training.mixed_precision_param": "bfloat16"}))
    seen: list[Any] = []
    projection = trainer.model.layers["0"].attention.wq
    handle = projection.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    trainer.train_step()
    handle.remove()
    trainer.close()
    assert seen == [torch.bfloat16] * 2  # two micro-batches
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights


def test_validation_computes_in_the_training_dtype() -> None:
    """Without FSDP2 the validator's forward runs under the training's autocast too (FSDP2 casts the
    weights for both): a LoRA base stored in bf16 meets its float32 adapters only there."""
    validating = {
        "training.max_steps": "2",
        "training.mixed_precision_param": "bfloat16",
        "validator.enable": "true",
        "validator.freq": "2",
        "validator.steps": "3",
        "validator.dataset.source": "synthetic",
    }
    trainer = LLMTrainer(tiny_config("llama3", validating))
    seen: list[Any] = []
    handle = trainer.model.layers["0"].attention.wq.register_forward_hook(
        lambda m, i, o: seen.append(o.dtype)
    )
    try:
        trainer.train()
    finally:
        handle.remove()
        trainer.close()
    assert seen == [torch.bfloat16] * (2 * 2 + 3)  # two steps of two micro-batches, three validation batches


def test_compiling_the_loss_uses_the_configured_backend() -> None:
    trainer, results = train(
        {"compile.enable": "true", "compile.components": "[loss]", "compile.backend": "eager"}
    )
    assert type(trainer._sum_and_count).__name__ != "method"
    assert len(results) == 4


def test_validation_runs_every_freq_steps_and_is_logged(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    train(
        {
            "validator.enable": "true",
            "validator.freq": "2",
            "validator.steps": "2",
            "validator.dataset.source": "synthetic",
            "validator.dataset.synthetic_num_samples": "16",
            "metrics.enable_jsonl": "true",
            "metrics.jsonl_path": str(jsonl),
            "metrics.log_freq": "1",
        }
    )
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    validation = [r for r in records if "validation/loss" in r]
    assert [r["step"] for r in validation] == [2, 4]
    assert all(math.isfinite(r["validation/loss"]) for r in validation)
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_second", "step_time", "eta_seconds"} <= set(
        logged[0]
    )
    assert all(r["tflops"] > 0 and r["mfu"] is None for r in logged)  # a CPU: no peak to compare with


def test_logged_records_carry_tflops_from_the_preflight_count_and_mfu_against_the_peak(
    tmp_path: Path, capsys: Any
) -> None:
    from hyper_parallel.preflight import estimate

    jsonl = tmp_path / "metrics.jsonl"
    overrides = {
        "training.peak_tflops": "0.002",
        "metrics.enable_jsonl": "true",
        "metrics.jsonl_path": str(jsonl),
        "metrics.log_freq": "2",
    }
    trainer, _ = train(overrides)
    cost = estimate(tiny_config("llama3", overrides))
    assert cost is not None
    assert trainer.flops_per_step == cost.flops_per_token * 4 * 32  # global batch 4 x seq 32, one rank
    assert trainer.peak_flops == pytest.approx(2e9)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        assert record["tflops"] > 0
        assert record["mfu"] == pytest.approx(100 * record["tflops"] / 0.002)
    out = capsys.readouterr().out
    assert (
        "; mfu against 0.002 TFLOP/s per device (training.peak_tflops); tflops and mfu count TorchTitan's "
        "convention, 6N + 12LHQT per token (attention counted whole, no recomputation)\n"
    ) in out
    assert re.search(r"step 4/4 .* tflops [0-9.e+-]+  mfu [0-9.]+%", out)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_cpu_threads_are_set_and_named_and_the_bar_is_cleared_before_the_last_line() -> None:
    before = torch.get_num_threads()
    out = Terminal()
    trainer = LLMTrainer(tiny_config("llama3", {"training.cpu_threads": "1"}), stream=out)
    try:
        assert torch.get_num_threads() == 1
        trainer.train()
    finally:
        trainer.close()
        torch.set_num_threads(before)
    text = out.getvalue()
    assert "hyper_parallel: 1 cpu thread(s) per rank (training.cpu_threads); mfu not computed" in text
    assert re.search(r"\r\[#{22}\.{8}\] 3/4  eta \d:\d\d:\d\d\x1b\[K", text)  # no record yet: no loss
    assert "\r\x1b[2Kdone: step 4, final loss" in text


def test_vl_trainer_refuses_a_text_only_model() -> None:
    with pytest.raises(TrainingError, match="VLTrainer needs a vision-language model, but 'llama3'"):
        VLTrainer(tiny_config("llama3"))


@pytest.mark.parametrize("model", ["llama3", "qwen3_5"])
def test_training_starts_from_save_pretrained_weights_with_the_loss_transformers_computes(
    model: str, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    if model == "llama3":
        from tests.support.llama3_reference import hf_model
    else:
        from tests.support.qwen3_5_reference import hf_model
    one_batch = {
        "training.max_steps": "1",
        "training.micro_batch_size": "4",
        "dataloader.dataset.source": "python_docs",
        "dataloader.dataset.document_masking": "false",  # transformers' forward sees the packed row whole
    }
    reference = hf_model(tiny_config(model, one_batch).model.args)
    reference.save_pretrained(tmp_path)
    cfg = tiny_config(model, {**one_batch, "model.weights_path": str(tmp_path)})
    trainer = LLMTrainer(cfg)
    t = cfg.training
    loader = cfg.dataloader.build(
        LoaderRequest(
            trainer.tokenizer,
            0,
            1,
            seq_len=t.seq_len,
            micro_batch_size=t.micro_batch_size,
            seed=trainer.seed,
        )
    )
    batch = next(iter(loader))
    with torch.no_grad():
        expected = float(reference(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
    result = trainer.train_step()
    trainer.close()
    assert result.loss == pytest.approx(expected, abs=1e-4)


def test_init_device_cpu_and_meta_start_from_the_same_weights() -> None:
    _, on_meta = train({"training.init_device": "meta", "training.max_steps": "2"})
    _, on_cpu = train({"training.init_device": "cpu", "training.max_steps": "2"})
    assert [r.loss for r in on_cpu] == pytest.approx([r.loss for r in on_meta], abs=1e-6)


def test_profiler_traces_the_steps_of_its_schedule(tmp_path: Path) -> None:
    train(
        {
            "profiler.enable": "true",
            "profiler.profile_freq": "2",
            "profiler.warmup": "1",
            "profiler.active": "1",
            "profiler.save_traces_folder": str(tmp_path),
        }
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iteration_2", "iteration_4"]


def test_compile_mode_and_fullgraph_reach_torch_compile_for_blocks_and_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []

    def recording_compile(fn: Any, **options: Any) -> Any:
        calls.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", recording_compile)
    train(
        {
            "compile.enable": "true",
            "compile.components": "[model, loss]",
            "compile.backend": "aot_eager",
            "compile.mode": "max-autotune-no-cudagraphs",
            "compile.fullgraph": "true",
            "training.max_steps": "1",
        }
    )
    expected = {"backend": "aot_eager", "mode": "max-autotune-no-cudagraphs", "fullgraph": True}
    assert calls == [expected] * 3  # two blocks of the tiny model, then the loss


def test_packed_documents_are_kept_apart_unless_document_masking_is_off() -> None:
    docs = {
        "dataloader.dataset.source": "python_docs",
        "dataloader.shuffle": "false",  # the first windows: short docstrings, several to a row
        "training.max_steps": "1",
        "training.seq_len": "256",
    }
    trainer = LLMTrainer(tiny_config("llama3", docs))
    batch = next(iter(trainer.dataloader))
    eos = (batch["input_ids"] == trainer.tokenizer.eos_id).long()
    assert eos.sum() > 0  # several documents share a row
    assert torch.equal(batch["document_ids"], eos.cumsum(1) - eos)  # a document ends with its EOS
    seen: list[Any] = []
    handle = trainer.model.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs.get("document_ids")), with_kwargs=True
    )
    masked = trainer.train_step().loss
    handle.remove()
    trainer.close()
    assert seen
    assert all(ids is not None for ids in seen)
    _, unmasked = train({**docs, "dataloader.dataset.document_masking": "false"})
    assert masked != pytest.approx(unmasked[0].loss, abs=1e-6)


def test_logged_steps_record_how_many_documents_the_rows_hold() -> None:
    """``documents_per_row``: the mean over the step's rows (two micro-batches here) of one more than the
    places where a row's document id changes, counted from the loader's ids; absent without them."""
    docs = {
        "dataloader.dataset.source": "python_docs",
        "dataloader.shuffle": "false",  # the first windows: short docstrings, several to a row
        "training.max_steps": "1",
        "training.seq_len": "256",
        "metrics.log_freq": "1",
    }
    trainer = LLMTrainer(tiny_config("llama3", docs))
    read: list[torch.Tensor] = []  # the ids of the batches the step reads, as the loader built them
    host_inputs = trainer.host_inputs
    trainer.host_inputs = lambda batch: (read.append(batch["document_ids"]), host_inputs(batch))[1]  # type: ignore[method-assign]
    result = trainer.train_step()
    trainer.close()
    ids = torch.cat(read)
    assert ids.shape[0] == 4  # global batch 4 = micro-batches of 2 x accumulation 2
    expected = sum(len(torch.unique(row)) for row in ids) / 4  # the ids of a row count up from 0
    assert expected > 1
    assert result.extra["documents_per_row"] == expected
    _, unmasked = train({**docs, "dataloader.dataset.document_masking": "false"})
    assert "documents_per_row" not in unmasked[0].extra


def test_a_stop_signal_saves_before_the_validation_due_at_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = LLMTrainer(
        tiny_config(
            "llama3",
            {
                "validator.enable": "true",
                "validator.freq": "1",
                "validator.steps": "1",
                "validator.dataset.source": "synthetic",
                "validator.dataset.synthetic_num_samples": "16",
                "checkpoint.enable": "true",
                "checkpoint.folder": str(tmp_path / "ckpt"),
            },
        )
    )
    validated: list[int] = []
    monkeypatch.setattr(trainer.validator, "validate", lambda model, step: validated.append(step) or {})
    step_once = trainer.train_step

    def step_then_sigterm() -> StepResult:
        result = step_once()
        signal.raise_signal(signal.SIGTERM)
        return result

    monkeypatch.setattr(trainer, "train_step", step_then_sigterm)
    try:
        results = trainer.train()
    finally:
        trainer.close()
    assert [r.step for r in results] == [1]
    assert trainer.stopped_by_signal == "SIGTERM"
    assert validated == []  # the save did not wait for a validation pass
    assert (tmp_path / "ckpt" / "step-1").is_dir()


def test_a_second_sigint_exits_at_once_with_130(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    trainer = LLMTrainer(tiny_config("llama3"))
    exits: list[int] = []

    def exit_now(status: int) -> None:
        exits.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)
    previous = trainer._install_signal_handlers()
    try:
        signal.raise_signal(signal.SIGINT)  # the first asks to stop after the step
        assert trainer.stopped_by_signal == "SIGINT"
        assert exits == []
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGINT)  # the second does not wait
    finally:
        trainer._restore_signal_handlers(previous)
        trainer.close()
    assert exits == [130]
    assert "SIGINT again: exiting now; a checkpoint being saved is incomplete" in capsys.readouterr().err


def test_sigterm_during_a_long_validation_pass_saves_after_the_batch_and_exits_143(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyper_parallel.components.validator._runtime import LossValidatorRuntime

    folder = tmp_path / "ckpt"
    overrides = tiny_overrides(
        "llama3",
        **{
            "validator.enable": "true",
            "validator.freq": "1",
            "validator.steps": "-1",  # the whole set: 32 batches of 2
            "validator.dataset.source": "synthetic",
            "validator.dataset.synthetic_num_samples": "64",
            "checkpoint.enable": "true",
            "checkpoint.folder": str(folder),
            "checkpoint.interval": "100000",
        },
    )
    batches: list[int] = []
    sum_and_count = LossValidatorRuntime._sum_and_count

    def count_then_signal(self: Any, logits: Any, labels: Any) -> Any:
        batches.append(len(batches) + 1)
        if len(batches) == 2:  # the pass has begun: the signal arrives during its second batch
            signal.raise_signal(signal.SIGTERM)
        return sum_and_count(self, logits, labels)

    monkeypatch.setattr(LossValidatorRuntime, "_sum_and_count", count_then_signal)
    out, err = io.StringIO(), io.StringIO()
    status = main(["--config-file", str(debug_config_path("llama3")), *as_flags(overrides)], out=out, err=err)
    assert status == 143, err.getvalue()[-3000:]
    assert batches == [1, 2]  # not the 32 of the pass
    assert "SIGTERM: stopped after step 1; checkpoint saved, relaunch the same command" in out.getvalue()
    assert sorted(p.name for p in folder.iterdir() if p.name != ".lock") == ["step-1"]
    assert "Traceback" not in err.getvalue()


@pytest.mark.parametrize(
    ("raised", "message"),
    [
        (
            "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:35563. This is typically "
            "caused by a remote worker crashing.",
            "rank 0: step 1: a collective lost its connection to another rank (comm.init_timeout_seconds = "
            "300): another rank stopped or is stalled",
        ),
        (
            "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 300000ms for recv operation",
            "rank 0: step 1: a collective timed out (comm.init_timeout_seconds = 300): another rank stopped "
            "or is stalled",
        ),
    ],
    ids=["connection-closed", "timed-out"],
)
def test_a_collective_cut_short_by_another_rank_is_one_line_and_exit_1(
    raised: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def peer_lost(self: Any) -> StepResult:
        raise RuntimeError(raised)

    monkeypatch.setattr(LLMTrainer, "train_step", peer_lost)
    out, err = io.StringIO(), io.StringIO()
    flags = as_flags(tiny_overrides("llama3"))
    status = main(["--config-file", str(debug_config_path("llama3")), *flags], out=out, err=err)
    assert status == 1
    assert err.getvalue().splitlines()[-1] == f"training stopped: {message}"


def test_an_unrelated_runtime_error_is_not_taken_for_a_stalled_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    def data_stalls(self: Any) -> StepResult:
        raise RuntimeError("DataLoader worker (pid 12) timed out after 5 seconds")

    monkeypatch.setattr(LLMTrainer, "train_step", data_stalls)
    with pytest.raises(RuntimeError, match="DataLoader worker") as raised:
        main(["--config-file", str(debug_config_path("llama3")), *as_flags(tiny_overrides("llama3"))])
    assert not isinstance(raised.value, TrainingError)
