"""``python -m bench train``: the trainer's throughput against a minimal hand-written PyTorch loop.

Both train the same model (the shipped debug config's, same flavor and initial weights), on the same
batches (the config's own data loader), with the same optimizer, schedule, clipping and micro-batching.
The hand-written loop is what a user would write in twenty lines: forward, cross entropy on the shifted
logits, backward, clip, step. The trainer adds everything a run needs around that (mixed-precision
handling, token counting, metrics, signal checks, checkpoint scheduling, profiler and validator hooks):
the ratio of tokens per second is that overhead. Runs alternate (trainer, loop, trainer, ...) so machine
drift hits both alike; each run's first steps are warm-up and not timed. The default clock is the process's
CPU time (``time.process_time``), which other processes on a shared machine disturb far less than wall
time; ``--clock wall`` measures elapsed time instead.

    python -m bench train [--config FILE] [--steps N] [--warmup N] [--rounds N] [--clock cpu|wall]
                          [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hyper_parallel.components.dataloader import LoaderRequest
from hyper_parallel.config import load_config
from hyper_parallel.trainer import LLMTrainer
from hyper_parallel.trainer.config import TrainerConfig

DEFAULT_CONFIG = "configs/llama3_debug.yaml"
#: Quiet, file-free runs: no metrics files, checkpoints, profiling or validation.
_QUIET = {
    "metrics.enable_jsonl": "false",
    "~metrics.jsonl_path": None,  # the config's path: an option of a sink that is off is refused
    "metrics.log_freq": "1000000",
    "checkpoint.enable": "false",
    "profiler.enable": "false",
    "validator.enable": "false",
}


_CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
_clock = _CLOCKS["cpu"]


class _TimedTrainer(LLMTrainer):
    """An ``LLMTrainer`` noting when each step's work (loop bookkeeping included) ended."""

    def __init__(self, config: TrainerConfig) -> None:
        super().__init__(config, stream=io.StringIO())
        self.marks: list[float] = []

    def train_step(self) -> Any:
        self.marks.append(_clock())  # the previous step's bookkeeping is done
        return super().train_step()


def _tokens_per_second(marks: list[float], warmup: int, tokens_per_step: int) -> float:
    timed = marks[warmup:]
    return tokens_per_step * (len(timed) - 1) / (timed[-1] - timed[0])


def run_trainer(cfg: TrainerConfig, warmup: int) -> float:
    """Tokens per second of ``LLMTrainer.train()`` after ``warmup`` steps."""
    trainer = _TimedTrainer(cfg)
    trainer.train()
    trainer.marks.append(_clock())
    trainer.close()
    t = cfg.training
    return _tokens_per_second(trainer.marks, warmup, t.global_batch_size * t.seq_len)


def run_plain_loop(cfg: TrainerConfig, warmup: int) -> float:
    """Tokens per second of a minimal PyTorch loop over the same model, data and optimizer."""
    t = cfg.training
    torch.manual_seed(t.seed)
    model = cfg.model.build_model_fn(cfg.model.args, device="cpu")
    optimizer = cfg.optimizer.build(model)
    scheduler = cfg.lr_scheduler.build(optimizer, t.max_steps)
    tokenizer = cfg.tokenizer.build(None)
    batches = iter(
        cfg.dataloader.build(
            LoaderRequest(
                tokenizer,
                0,
                1,
                seq_len=t.seq_len,
                micro_batch_size=t.micro_batch_size,
                seed=t.seed,
            )
        )
    )
    accumulation = t.global_batch_size // t.micro_batch_size
    marks = []
    for _ in range(t.max_steps):
        marks.append(_clock())
        optimizer.zero_grad(set_to_none=True)
        for _ in range(accumulation):
            batch = next(batches)
            logits = model(batch["input_ids"])
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=-100
            )
            (loss / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm or float("inf"), foreach=True)
        optimizer.step()
        scheduler.step()
    marks.append(_clock())
    return _tokens_per_second(marks, warmup, t.global_batch_size * t.seq_len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps per run (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="trainer/loop pairs, alternating (default 3)")
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="cpu", help="cpu (default) or wall time")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    global _clock
    _clock = _CLOCKS[args.clock]
    cfg = load_config(args.config, {**_QUIET, "training.max_steps": str(args.warmup + args.steps)})
    trainer_tps, loop_tps = [], []
    for _ in range(args.rounds):
        trainer_tps.append(run_trainer(cfg, args.warmup))
        loop_tps.append(run_plain_loop(cfg, args.warmup))
    ratios = [a / b for a, b in zip(trainer_tps, loop_tps, strict=True)]
    results = {
        "config": args.config,
        "trainer_tokens_per_second": statistics.median(trainer_tps),
        "loop_tokens_per_second": statistics.median(loop_tps),
        "trainer/loop": statistics.median(ratios),
        "rounds": ratios,
    }
    overhead = 1.0 - results["trainer/loop"]
    verdict = "PASS" if overhead <= 0.05 else "FAIL"
    print(
        f"{args.config}: {args.steps} timed steps x {args.rounds} rounds, {args.clock} clock, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"  LLMTrainer        {results['trainer_tokens_per_second']:>10,.0f} tokens/s")
    print(f"  hand-written loop {results['loop_tokens_per_second']:>10,.0f} tokens/s")
    print(
        f"  trainer / loop    {results['trainer/loop']:>10.3f}x  "
        f"(per round: {', '.join(f'{r:.3f}' for r in ratios)})"
    )
    print(f"  target: trainer overhead <= 5% ({verdict}, {overhead:+.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0
