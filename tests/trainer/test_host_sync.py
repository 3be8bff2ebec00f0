"""The train loop waits for the device only on the steps that need a value from it.

On an accelerator every ``.item()``, ``float(tensor)``, ``.tolist()`` or ``.cpu()`` of a device value stalls
the host until the queued work is done, emptying the device's queue. These tests count such calls made by the
project's code (the data loader, which builds batches on the host, is left out) step by step, on the CPU where
the same code runs, and the stop-flag all-reduce too (its flag is a host tensor compared over gloo, counted
so that its schedule is asserted). Reading the tensors the loader yielded is a host read too: those are not
counted, and moving one to the device gives a distinct tensor here (as on an accelerator), whose reads are.
The vision-language trainer reads its batches' image grids and tokens that way, before they move."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import hyper_parallel  # noqa: E402
from hyper_parallel.trainer import LLMTrainer, VLTrainer  # noqa: E402
from hyper_parallel.trainer._trainer import Trainer  # noqa: E402
from tests.support.trainer import tiny_config  # noqa: E402

_PACKAGE = str(Path(hyper_parallel.__file__).parent)
_HOST_SIDE = str(Path(_PACKAGE, "components", "dataloader"))
_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


class SyncCounter:
    """Counts, per optimizer step, the device reads the project's own code makes."""

    def __init__(self) -> None:
        self.per_step: list[list[str]] = []
        #: id -> tensor of every batch the loader yielded (kept, so that no other tensor reuses an id).
        self.host: dict[int, Any] = {}

    def note(self, what: str, tensor: Any = None) -> None:
        caller = sys._getframe(2).f_code.co_filename
        if tensor is not None and id(tensor) in self.host:
            return
        if caller.startswith(_PACKAGE) and not caller.startswith(_HOST_SIDE) and self.per_step:
            self.per_step[-1].append(what)

    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.note(name, tensor)
            return original(tensor, *args, **kwargs)

        return counted

    def moving(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Tensor.to`` giving a new tensor for a loader tensor, as a move to an accelerator does."""

        def to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            moved = original(tensor, *args, **kwargs)
            return moved.clone() if moved is tensor and id(tensor) in self.host else moved

        return to

    def tracked(self, batches: Any) -> Any:
        for batch in batches:
            self.host.update({id(tensor): tensor for tensor in batch.values()})
            yield batch


def _count_syncs(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str], trainer: Trainer | None = None
) -> tuple[SyncCounter, Any]:
    trainer = trainer or LLMTrainer(tiny_config("llama3", overrides))
    counter = SyncCounter()
    trainer._data = counter.tracked(iter(trainer.dataloader))
    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, counter.wrap(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.Tensor, "to", counter.moving(torch.Tensor.to))
    # As under torchrun: the ranks compare stop flags (one process here, so the all-reduce is a no-op).
    trainer._ranks_must_agree = True

    def stop_flag_all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> None:
        counter.note("all_reduce")

    monkeypatch.setattr(dist, "all_reduce", stop_flag_all_reduce)
    step_once = trainer.train_step

    def step() -> Any:
        counter.per_step.append([])  # what follows, up to the next step, belongs to this step
        return step_once()

    monkeypatch.setattr(trainer, "train_step", step)
    try:
        results = trainer.train()
    finally:
        monkeypatch.undo()
        trainer.close()
    return counter, results


def test_unlogged_steps_never_wait_for_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    counter, results = _count_syncs(
        monkeypatch,
        {"training.max_steps": "8", "metrics.log_freq": "4", "training.signal_check_freq": "100"},
    )
    syncs = {step: reads for step, reads in enumerate(counter.per_step, 1)}
    assert {step: reads for step, reads in syncs.items() if step % 4} == {s: [] for s in (1, 2, 3, 5, 6, 7)}
    for logged in (4, 8):  # the loss and grad norm are read, the non-finite flag and the stop flags compared
        assert "all_reduce" in syncs[logged]
        assert "tolist" in syncs[logged]
        assert "item" in syncs[logged]
    assert [r.step for r in results] == list(range(1, 9))
    assert all(r.loss > 0 for r in results)  # read after training: the values were kept


def test_stop_flags_are_compared_every_signal_check_freq_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    counter, _ = _count_syncs(
        monkeypatch,
        {
            "training.max_steps": "7",
            "metrics.log_freq": "1000",
            "training.signal_check_freq": "3",
            "debug.check_nan_inf": "false",
        },
    )
    compared = [step for step, reads in enumerate(counter.per_step, 1) if "all_reduce" in reads]
    assert compared == [3, 6, 7]  # every 3 steps and the last


def test_the_vision_language_step_reads_its_image_grids_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = {
        "dataloader.dataset.source": "shapes",  # one image and its caption per sample
        "training.seq_len": "56",
        "training.max_steps": "3",
        "metrics.log_freq": "3",
        "training.signal_check_freq": "100",
    }
    counter, results = _count_syncs(monkeypatch, overrides, VLTrainer(tiny_config("qwen3_5_vl", overrides)))
    assert counter.per_step[:2] == [[], []]  # the grids and the M-RoPE positions were read before the move
    assert "tolist" in counter.per_step[2]  # the logged step reads the loss
    assert [r.step for r in results] == [1, 2, 3]
    assert all(r.loss > 0 for r in results)


def test_the_mixture_of_experts_step_reads_no_device_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routing, grouping by expert and the grouped matmuls keep the counts per expert on the device."""
    overrides = {"training.max_steps": "2", "metrics.log_freq": "2", "training.signal_check_freq": "100"}
    trainer = LLMTrainer(tiny_config("qwen3_5_moe", overrides))
    counter, results = _count_syncs(monkeypatch, overrides, trainer)
    assert counter.per_step[0] == []
    assert "tolist" in counter.per_step[1]  # the logged step reads the loss and the expert load
    assert [r.step for r in results] == [1, 2]


def test_a_batch_of_single_document_rows_trains_without_a_document_mask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows that each hold one document lose their document ids on the host (plain causal attention, the
    faster kernel on CUDA); a batch with a boundary in any row keeps them."""
    import torch

    seen: list[bool] = []
    forward = LLMTrainer.forward

    def recording(self: LLMTrainer, batch: Any, head: Any = None) -> Any:
        seen.append("document_ids" in batch)
        return forward(self, batch, head)

    monkeypatch.setattr(LLMTrainer, "forward", recording)
    trainer = LLMTrainer(tiny_config("llama3", {"training.max_steps": "1"}))
    try:
        one_each = torch.tensor([[3, 3, 3, 3], [0, 0, 0, 0]])
        boundary = torch.tensor([[3, 3, 3, 3], [0, 0, 1, 1]])
        assert trainer.host_inputs({"document_ids": one_each}) == {"document_ids": None}
        assert trainer.host_inputs({"document_ids": boundary}) == {}
        assert trainer.host_inputs({"input_ids": one_each}) == {}
        trainer.device = torch.device("cuda")  # on CUDA the ids stay on the host: the model reads them there
        assert trainer.host_inputs({"document_ids": boundary})["document_ids"] is boundary
        assert trainer.host_inputs({"document_ids": one_each}) == {"document_ids": None}
        compiled = attrs.evolve(trainer.config.compile, enable=True)
        trainer.config = attrs.evolve(trainer.config, compile=compiled)  # FlexAttention compiles inline
        assert trainer.host_inputs({"document_ids": boundary}) == {}
        trainer.config = attrs.evolve(trainer.config, compile=attrs.evolve(compiled, enable=False))
        trainer.device = torch.device("cpu")
        tokens = torch.randint(0, 64, (2, 4))
        steps = trainer.accumulation_steps
        single = {"input_ids": tokens, "labels": tokens, "document_ids": one_each}
        trainer._data = iter([single] * steps + [{**single, "document_ids": boundary}] * steps)
        first, second = trainer._next_micro_batches(), trainer._next_micro_batches()
        assert all("document_ids" not in batch for batch in first)
        assert all(torch.equal(batch["document_ids"], boundary) for batch in second)
        trainer._data = None
        trainer.train()
    finally:
        trainer.close()
    assert seen  # the trainer's own step went through the same path
