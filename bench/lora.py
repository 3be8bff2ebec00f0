"""``python -m bench lora``: a LoRA and a QLoRA step against a full fine-tuning step, and their memory.

All train the shipped debug model (same config, same initial weights, same batches); the LoRA run adds
``peft: LoRA.Config`` (default targets, ``--rank``), the QLoRA runs also ``base_dtype: nf4`` (when torchao
is installed), ``qlora_embeddings`` with ``quantize_embeddings``; with ``--dtype bfloat16`` also
``lora_bf16`` (``base_dtype: bfloat16``). Steps alternate between the trainers
(full, LoRA, QLoRA, ..., full, ...) so machine drift hits all alike; the first ``--warmup`` steps of each are
not timed. The clock is the process's CPU time (``time.process_time``), which other processes on a shared
machine disturb less than wall time. ``--dtype`` sets ``training.mixed_precision_param`` (the debug
configs compute in float32, QLoRA's frozen rest is stored in it). Optimizer memory is the bytes of the
optimizer's state tensors after the steps; ``base_bytes`` the bytes the frozen parameters hold (an NF4
weight: its codes, scales and code book), ``base_ratio`` those over the same base in bfloat16, and
``nf4_ratio`` the NF4 weights' bytes alone over the same weights in bfloat16.

    python -m bench lora [--config FILE] [--steps N] [--warmup N] [--rank R] [--dtype D] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
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


def _bytes(tensor: Any) -> int:
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:  # an NF4 tensor
        return sum(int(getattr(tensor, name).nbytes) for name in flatten()[0])
    return int(tensor.numel() * tensor.element_size())


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print (and optionally write) the figures; returns 0."""
    parser = argparse.ArgumentParser(prog="python -m bench lora", description=__doc__)
    parser.add_argument("--config", default="configs/qwen3_5_debug.yaml")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="training.mixed_precision_param")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    total = args.steps + args.warmup
    common: dict[str, str | None] = {
        "training.max_steps": str(total),
        "metrics.enable_jsonl": "false",
        "~metrics.jsonl_path": None,  # the sink off, without its path (an option of a sink off is refused)
        "metrics.log_freq": "1000",
    }
    if args.dtype is not None:
        common["training.mixed_precision_param"] = args.dtype
    lora = {"peft._target_": "hyper_parallel.components.peft.LoRA.Config", "peft.rank": str(args.rank)}
    runs = {"full": common, "lora": {**common, **lora}}
    if args.dtype == "bfloat16":  # a bf16 base needs bf16 compute
        runs["lora_bf16"] = {**runs["lora"], "peft.base_dtype": "bfloat16"}
    if importlib.util.find_spec("torchao") is not None:
        runs["qlora"] = {**common, **lora, "peft.base_dtype": "nf4"}
        runs["qlora_embeddings"] = {**runs["qlora"], "peft.quantize_embeddings": "true"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        trainers = {name: LLMTrainer(load_config(args.config, overrides)) for name, overrides in runs.items()}
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
                "base_bytes": sum(_bytes(p) for p in params if not p.requires_grad),
            }
            if figures[name]["frozen"]:
                figures[name]["base_ratio"] = figures[name]["base_bytes"] / (2 * figures[name]["frozen"])
            nf4 = [p for p in params if hasattr(p, "__tensor_flatten__")]
            if nf4:
                figures[name]["nf4_ratio"] = sum(_bytes(p) for p in nf4) / sum(2 * p.numel() for p in nf4)
    finally:
        for trainer in trainers.values():
            trainer.close()
    full, adapted = figures["full"], figures["lora"]
    figures["step_ratio"] = adapted["step_cpu_s"] / full["step_cpu_s"]
    figures["optimizer_ratio"] = adapted["optimizer_bytes"] / full["optimizer_bytes"]
    figures["optimizer_bytes_per_trainable"] = adapted["optimizer_bytes"] / adapted["trainable"]
    for name in ("lora_bf16", "qlora", "qlora_embeddings"):
        if name in figures:
            figures[f"{name}_step_ratio"] = figures[name]["step_cpu_s"] / full["step_cpu_s"]
    print(json.dumps(figures, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0
