"""``python -m bench lora``: a LoRA step against a full fine-tuning step, and their optimizer memory.

Both train the shipped debug model (same config, same initial weights, same batches); the LoRA run adds
``peft: LoRA.Config`` (default targets, ``--rank``). Steps alternate between the two trainers (full, LoRA,
full, ...) so machine drift hits both alike; the first ``--warmup`` steps of each are not timed. The clock is
the process's CPU time (``time.process_time``), which other processes on a shared machine disturb less
than wall time. Optimizer memory is the bytes of the optimizer's state tensors after the steps.

    python -m bench lora [--config FILE] [--steps N] [--warmup N] [--rank R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from hyper_parallel.config import ConfigWarning, load_config
from hyper_parallel.trainer import LLMTrainer

__all__ = ["main"]


def _optimizer_bytes(trainer: LLMTrainer) -> int:
    return sum(
        value.numel() * value.element_size()
        for state in trainer.optimizer.state.values()
        for value in state.values()
        if hasattr(value, "numel") and value.dim() > 0
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print (and optionally write) the figures; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench lora", description=__doc__)
    parser.add_argument("--config", default="configs/qwen3_5_debug.yaml")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    total = args.steps + args.warmup
    common = {"training.max_steps": str(total), "metrics.enable_jsonl": "false", "metrics.log_freq": "1000"}
    lora = {"peft._target_": "hyper_parallel.components.peft.LoRA.Config", "peft.rank": str(args.rank)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        trainers = {
            "full": LLMTrainer(load_config(args.config, common)),
            "lora": LLMTrainer(load_config(args.config, {**common, **lora})),
        }
    times: dict[str, list[float]] = {name: [] for name in trainers}
    try:
        for step in range(total):
            for name, trainer in trainers.items():
                start = time.process_time()
                trainer.train_step()
                if step >= args.warmup:
                    times[name].append(time.process_time() - start)
        figures: dict[str, Any] = {"config": args.config, "steps": args.steps, "rank": args.rank}
        for name, trainer in trainers.items():
            params = list(trainer.model.parameters())
            figures[name] = {
                "step_cpu_s": statistics.median(times[name]),
                "optimizer_bytes": _optimizer_bytes(trainer),
                "trainable": sum(p.numel() for p in params if p.requires_grad),
                "frozen": sum(p.numel() for p in params if not p.requires_grad),
            }
    finally:
        for trainer in trainers.values():
            trainer.close()
    full, adapted = figures["full"], figures["lora"]
    figures["step_ratio"] = adapted["step_cpu_s"] / full["step_cpu_s"]
    figures["optimizer_ratio"] = adapted["optimizer_bytes"] / full["optimizer_bytes"]
    figures["optimizer_bytes_per_trainable"] = adapted["optimizer_bytes"] / adapted["trainable"]
    print(json.dumps(figures, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0
