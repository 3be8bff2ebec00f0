"""The train loop waits for the device only on the steps that need a value from it.

On an accelerator every ``.item()``, ``float(tensor)``, ``.tolist()`` or ``.cpu()`` of a device value stalls
the host until the queued work is done, emptying the device's queue. These tests count such calls made by the
project's code (the data loader, which builds batches on the host, is left out) step by step, on the CPU where
the same code runs, and the stop-flag all-reduce too (its flag is a host tensor compared over gloo, counted
so that its schedule is asserted)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import hyper_parallel  # noqa: E402
from hyper_parallel.trainer import LLMTrainer  # noqa: E402
from tests.support.trainer import tiny_config  # noqa: E402

_PACKAGE = str(Path(hyper_parallel.__file__).parent)
_HOST_SIDE = str(Path(_PACKAGE, "components", "dataloader"))
_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


class SyncCounter:
    """Counts, per optimizer step, the device reads the project's own code makes."""

    def __init__(self) -> None:
        self.per_step: list[list[str]] = []

    def note(self, what: str) -> None:
        caller = sys._getframe(2).f_code.co_filename
        if caller.startswith(_PACKAGE) and not caller.startswith(_HOST_SIDE) and self.per_step:
            self.per_step[-1].append(what)

    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.note(name)
            return original(tensor, *args, **kwargs)

        return counted


def _count_syncs(monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str]) -> tuple[SyncCounter, Any]:
    trainer = LLMTrainer(tiny_config("llama3", overrides))
    counter = SyncCounter()
    for name in _READS:
        monkeypatch.setattr(torch.Tensor, name, counter.wrap(name, getattr(torch.Tensor, name)))
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
