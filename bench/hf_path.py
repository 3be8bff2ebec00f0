"""``python -m bench models`` rows of the transformers path: ``LLMTrainer`` against a bare loop, and
the native Llama 3 against the transformers path, on the same shape, weights and data.

The shape is the shipped Llama 3 debug config's (dim 256, 4 layers, 8 heads, 4 key/value heads, vocabulary
512): ``bench.models._pair`` copies our module's weights into ``LlamaForCausalLM``, which writes a folder
(``save_pretrained``) that both runs load. Every run trains the debug config's batches (global batch 8 of
micro-batches 4 x 256 tokens, from its ``python_docs`` loader), optimizer, schedule and clipping, in one
process: the trainer applies FSDP2 across ranks only, so neither side wraps the model here.

- ``trainer / bare loop``: the config with ``model: {_target_: hyper_parallel.models.hf.create_model_spec,
  path: FOLDER}`` through ``LLMTrainer.train()``, against the loop a transformers user writes around
  ``AutoModelForCausalLM.from_pretrained(FOLDER)``: forward with ``labels`` (transformers' own loss),
  backward, clip, step. With document masking both keep the packed documents apart the same way (position
  ids that restart at every document, ``use_cache=False``: transformers then masks across documents); the
  row without it turns ``dataloader.dataset.document_masking`` off for both. The ratio is the trainer's
  whole cost per step (its bookkeeping between steps included) over the loop's.
- ``native / transformers path``: ``LLMTrainer`` steps of the native ``llama3`` model (the same weights,
  from the folder) against those of the transformers path, document masking on (the default).

Steps are interleaved one by one (one of each, in turn), so drift on a shared machine hits both alike; the
first ``warmup`` steps of each are not timed; a ratio is of the summed step times (tokens per second).
Both sides see the same batches, so the losses are printed beside the ratio as a check (``max diff``).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["DEBUG_CONFIG", "HEADER", "ROWS", "TARGET", "TITLE", "bare_loop", "hf_model_text", "trainer_rows"]

#: The shipped Llama 3 debug config (found from this file: the suite runs the rows from any folder).
DEBUG_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "llama3_debug.yaml")
#: Least tokens per second of the transformers path through the trainer, as a fraction of the bare loop's.
TARGET = 0.97
#: The rows, in order: the trainer against the bare loop with and without document masking, native against it.
ROWS = (
    "hf trainer / bare loop, document masking",
    "hf trainer / bare loop, no document masking",
    "native llama3 / hf trainer, document masking",
)
TITLE = (
    "the transformers path through LLMTrainer: Llama 3 debug shape as LlamaForCausalLM, batch 8 x 256, "
    "one process (no FSDP2 on either side), tokens/s"
)


def hf_model_text(config: Path, folder: Path, init: str | None = None) -> str:
    """``config``'s text with its model section replaced by the transformers path over ``folder``
    (``init``: the section's ``init``, left out when None), everything else as written."""
    text = config.read_text(encoding="utf-8")
    start, end = text.index("model:\n"), text.index("\ntokenizer:")
    model = (
        f"model:\n  _target_: hyper_parallel.models.hf.create_model_spec\n  path: {json.dumps(str(folder))}\n"
    )
    if init is not None:
        model += f"  init: {init}\n"
    return text[:start] + model + text[end:]


def _write_folder(folder: Path, shape: Mapping[str, Any]) -> None:
    """The debug shape (``shape``: overrides of it) as ``LlamaForCausalLM``, with our Llama 3's weights
    (through its state-dict adapter)."""
    from bench.models import _pair

    _, theirs, _ = _pair("llama3", {"vocab_size": 512, **shape})
    theirs.save_pretrained(folder)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers' progress bars (writing and loading the folder) off while the rows run, as they were
    after."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _configs(
    folder: Path, steps: int, threads: int, masking: bool, shape: Mapping[str, Any]
) -> tuple[Any, Any]:
    """The native and the transformers-path configs of the debug run over ``folder``'s weights (of the
    debug shape with ``shape``)."""
    from bench.train import _QUIET  # quiet, file-free runs: no metrics files, checkpoints, profiler
    from hyper_parallel.config import load_config

    overrides = {
        **_QUIET,
        "training.max_steps": str(steps),
        "training.cpu_threads": str(threads),
        "dataloader.dataset.document_masking": str(masking).lower(),
    }
    hf_text = hf_model_text(Path(DEBUG_CONFIG), folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        native_shape = {f"model.overrides.{key}": str(value) for key, value in shape.items()}
        native = load_config(DEBUG_CONFIG, {**overrides, **native_shape, "model.weights_path": str(folder)})
        hf = load_config(DEBUG_CONFIG, overrides, text=hf_text)
    return native, hf


def bare_loop(cfg: Any, model: Any, device: Any) -> Callable[[], Any]:
    """The loop a transformers user writes around ``model`` (on ``device``), doing what the trainer does
    in one process: ``cfg``'s optimizer (:meth:`build`, the same parameter groups), schedule, clipping and
    batches (its data loader), computing under ``torch.autocast`` to ``training.mixed_precision_param``.
    Each call is one optimizer step: per micro-batch ``model(input_ids, position_ids, labels=...)``
    (transformers' own loss; position ids that restart at every document where the batch carries document
    ids, ``use_cache=False``: transformers then masks across documents), backward; clipping, the
    optimizer's and the schedule's step. It returns the step's loss (a tensor on ``device``: no
    synchronisation)."""
    import torch

    from hyper_parallel.components.dataloader import LoaderRequest
    from hyper_parallel.models.hf._module import document_positions

    training = cfg.training
    optimizer = cfg.optimizer.build(model)
    scheduler = cfg.lr_scheduler.build(optimizer, training.max_steps)
    request = LoaderRequest(cfg.tokenizer.build(None), 0, 1, seq_len=training.seq_len,
                            micro_batch_size=training.micro_batch_size, seed=cfg.run_seed())  # fmt: skip
    batches = iter(cfg.dataloader.build(request))
    accumulation = training.global_batch_size // training.micro_batch_size
    dtype = getattr(torch, training.mixed_precision_param)
    max_norm = training.max_grad_norm if training.max_grad_norm is not None else float("inf")

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for _ in range(accumulation):
            batch = next(batches)
            documents = batch.get("document_ids")
            positions = None if documents is None else document_positions(documents).to(device)
            ids = batch["input_ids"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss
            (loss / accumulation).backward()
            step_loss += loss.detach() / accumulation
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        optimizer.step()
        scheduler.step()
        return step_loss

    return step


def _bare_loop(cfg: Any, folder: Path, losses: list[float]) -> Callable[[], None]:
    """:func:`bare_loop` around ``AutoModelForCausalLM.from_pretrained(folder)`` on the CPU, each step's
    loss appended to ``losses``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.run_seed())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
    step = bare_loop(cfg, model, torch.device("cpu"))
    return lambda: losses.append(float(step()))


def _trainer(cfg: Any) -> Any:
    from hyper_parallel.trainer import LLMTrainer

    return LLMTrainer(cfg, stream=io.StringIO())


def _trainer_against(
    cfg: Any, other: Callable[[], object], clock: Callable[[], float]
) -> tuple[list[float], list[float], list[float]]:
    """``LLMTrainer.train()`` of ``cfg`` with ``other()`` run (and timed) before each of its steps: the
    seconds of each trainer step with the bookkeeping after it, of each ``other()``, and the losses."""
    from hyper_parallel.trainer import LLMTrainer

    class Interleaved(LLMTrainer):
        def __init__(self) -> None:
            super().__init__(cfg, stream=io.StringIO())
            self.ours: list[float] = []
            self.theirs: list[float] = []
            self.since: float | None = None

        def train_step(self) -> Any:
            now = clock()
            if self.since is not None:
                self.ours.append(now - self.since)
            start = clock()
            other()
            self.theirs.append(clock() - start)
            self.since = clock()
            return super().train_step()

    trainer = Interleaved()
    try:
        results = trainer.train()
        assert trainer.since is not None
        trainer.ours.append(clock() - trainer.since)  # the last step and the loop's end
    finally:
        trainer.close()
    return trainer.ours, trainer.theirs, [r.loss for r in results]


def _alternating(
    configs: list[Any], steps: int, clock: Callable[[], float]
) -> list[tuple[list[float], list[float]]]:
    """``steps`` steps of a trainer of each config, one of each in turn: each one's step times and losses."""
    trainers = [_trainer(cfg) for cfg in configs]
    seconds: list[list[float]] = [[] for _ in trainers]
    results: list[list[Any]] = [[] for _ in trainers]
    try:
        for _ in range(steps):
            for trainer, taken, found in zip(trainers, seconds, results, strict=True):
                start = clock()
                found.append(trainer.train_step())
                taken.append(clock() - start)
    finally:
        for trainer in trainers:
            trainer.close()
    return [(taken, [r.loss for r in found]) for taken, found in zip(seconds, results, strict=True)]


def _ratio(ours: list[float], theirs: list[float], warmup: int) -> float:
    """Tokens per second of ``ours`` over ``theirs`` (the same tokens per step): their summed times."""
    return sum(theirs[warmup:]) / sum(ours[warmup:])


def trainer_rows(
    steps: int,
    warmup: int,
    threads: int,
    clock: Callable[[], float],
    only: str = "",
    shape: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The rows (printed as they come): trainer / bare loop with and without document masking, and the
    native Llama 3 / the transformers path; ``shape`` overrides the debug shape (the suite's tiny one)."""
    shape = dict(shape or {})
    rows: list[dict[str, Any]] = []
    total = warmup + steps
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp, _no_progress_bars():
        folder = Path(tmp) / "llama3-debug"
        _write_folder(folder, shape)
        for name, masking in zip(ROWS[:2], (True, False), strict=True):
            if only not in name:
                continue
            _, hf = _configs(folder, total, threads, masking, shape)
            loop_losses: list[float] = []
            ours, theirs, losses = _trainer_against(hf, _bare_loop(hf, folder, loop_losses), clock)
            diff = max(abs(a - b) for a, b in zip(losses, loop_losses, strict=True))
            rows.append(_row(name, ours, theirs, warmup, diff, hf))
            print(_format(rows[-1], TARGET), flush=True)
        name = ROWS[2]
        if only in name:
            native, hf = _configs(folder, total, threads, True, shape)
            (ours, ours_losses), (theirs, losses) = _alternating([native, hf], total, clock)
            diff = max(abs(a - b) for a, b in zip(ours_losses, losses, strict=True))
            rows.append(_row(name, ours, theirs, warmup, diff, hf))
            print(_format(rows[-1], None), flush=True)
    return rows


def _row(
    name: str, ours: list[float], theirs: list[float], warmup: int, diff: float, cfg: Any
) -> dict[str, Any]:
    tokens = cfg.training.global_batch_size * cfg.training.seq_len
    timed = len(ours) - warmup
    return {
        "name": name,
        "steps": timed,
        "tokens_per_second": tokens * timed / sum(ours[warmup:]),
        "baseline_tokens_per_second": tokens * timed / sum(theirs[warmup:]),
        "ratio": _ratio(ours, theirs, warmup),
        "max_loss_diff": diff,
    }


def _format(row: dict[str, Any], target: float | None) -> str:
    verdict = "" if target is None else f" {'PASS' if row['ratio'] >= target else 'FAIL'} (>= {target})"
    return (
        f"| {row['name']:<48} | {row['tokens_per_second']:>9,.0f} "
        f"| {row['baseline_tokens_per_second']:>9,.0f} | {row['ratio']:>6.3f}x "
        f"| {row['max_loss_diff']:.1e} |{verdict}"
    )


HEADER = (
    "| A / B                                            | A tok/s   | B tok/s   | ratio   | loss diff|\n"
    "|--------------------------------------------------|----------:|----------:|--------:|---------:|"
)
