"""One timing harness for our trainer and each peer on the Llama 3.2-1B shape: the same loop for all.

Every row is one training step of one implementation (:mod:`bench.peers.llama_peers` builds it) timed by
:func:`time_steps`: ``warmup`` untimed steps, then ``steps`` (at least 10) timed ones, each ended by a device
synchronisation; the row reports the median and the spread (minimum, maximum, interquartile range) of the
timed steps, tokens/s from the median, and MFU from the preflight's FLOPs per token of the same shape
(:mod:`hyper_parallel.preflight.flops`: one convention, one count for every row, since the shape is the
same). Each row runs in a fresh process (``python -m bench.peers.harness PEER``), so no implementation's
global settings (TorchTitan turns off autograd's threads and Python's garbage collector; Liger patches
transformers' classes) reach another's.

What every row shares: the shape (tied embeddings), batch and sequence length, random token ids, bf16
compute with fp32 master weights (float32 on the CPU), AdamW (lr 3e-4, weight decay 0.1), gradient
clipping at 1.0, no activation checkpointing, and ``torch.compile`` of each transformer block off or on
(``--compile``). The peers' rows run under FSDP2 on a one-device mesh (bf16 parameters, fp32 reduction);
our trainer shards across ranks only, so on one device ``ours`` and ``ours_hf`` compute under autocast
over float32 parameters, and so does ``hf_loop``, the bare loop they are held to (issue 45 item 7).

    python -m bench.peers.harness PEER [--tiny] [--compile] [--steps N] [--warmup N] [--seq N] [--batch N]
                                  [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench.gpu import step_seconds

__all__ = ["MIN_STEPS", "PEERS", "Setting", "Timing", "main", "measure", "plan", "time_steps"]

#: Fewest timed steps a row may report (a median and a spread need that many).
MIN_STEPS = 10
#: The implementations a row can time, in the order the check runs them.
PEERS = ("ours", "ours_hf", "hf_loop", "transformers", "liger", "torchtitan")


class Timing(NamedTuple):
    """Seconds of each timed step (warm-up excluded) and what a row reports of them."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def minimum(self) -> float:
        return min(self.samples)

    @property
    def maximum(self) -> float:
        return max(self.samples)

    @property
    def iqr(self) -> float:
        """Interquartile range (the spread of the middle half; ``statistics.quantiles``' exclusive method)."""
        first, _, third = statistics.quantiles(self.samples, n=4)
        return third - first


def time_steps(
    step: Callable[[], object],
    *,
    warmup: int,
    steps: int,
    sync: Callable[[], None],
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """``warmup`` calls of ``step``, then ``steps`` timed ones, each timed to the end of ``sync``
    (:func:`bench.gpu.step_seconds`), at least :data:`MIN_STEPS` of them."""
    if steps < MIN_STEPS:
        raise ValueError(f"steps: {steps} timed steps; a median and spread need at least {MIN_STEPS}")
    return Timing(step_seconds(step, warmup=warmup, steps=steps, sync=sync, clock=clock))


class Setting(NamedTuple):
    """What every row of one comparison shares."""

    tiny: bool
    compiled: bool
    seq: int
    batch: int
    warmup: int
    steps: int


class Built(NamedTuple):
    """A peer's training step, ready to time."""

    step: Callable[[], object]
    #: Tokens one step trains on (``batch x seq``; the check asserts every peer's is the same).
    tokens_per_step: int
    parameters: int
    notes: list[str]
    close: Callable[[], None] = lambda: None


def plan(tiny: bool, cuda: bool) -> list[tuple[str, bool]]:
    """``(peer, compiled)`` of every row: each peer eager, then compiled (compiling is CUDA's only)."""
    return [
        (peer, compiled) for compiled in ((False, True) if cuda and not tiny else (False,)) for peer in PEERS
    ]


def _flops_per_token(setting: Setting) -> tuple[float | None, float | None]:
    """The preflight's FLOPs per token (and the causal count) of our GPU config at this shape."""
    from bench.peers.llama_peers import our_config
    from hyper_parallel.preflight import estimate

    est = estimate(our_config(setting), 1)
    return (None, None) if est is None else (est.flops_per_token, est.causal_flops_per_token)


def measure(peer: str, setting: Setting) -> dict[str, Any]:
    """One row: ``peer``'s step timed by :func:`time_steps`, or the reason it was skipped."""
    import torch

    from bench.peers import llama_peers
    from hyper_parallel.preflight.devices import peak_flops
    from hyper_parallel.preflight.flops import mfu

    cuda = torch.cuda.is_available() and not setting.tiny
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    row: dict[str, Any] = {"peer": peer, "compiled": setting.compiled, "seq": setting.seq,
                           "batch": setting.batch, "warmup": setting.warmup, "steps": setting.steps,
                           "device": torch.cuda.get_device_name(device) if cuda else "cpu"}  # fmt: skip
    skipped = llama_peers.unavailable(peer, setting, cuda)
    if skipped:
        return {**row, "skipped": skipped}
    if cuda:
        torch.cuda.set_device(device)
    threads = torch.get_num_threads()
    if setting.tiny:  # tiny tensors: more threads only wait for each other
        torch.set_num_threads(1)
    built = llama_peers.build(peer, setting, device)
    try:

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)

        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        timing = time_steps(built.step, warmup=setting.warmup, steps=setting.steps, sync=sync)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    finally:
        built.close()
        torch.set_num_threads(threads)
    per_token, causal = _flops_per_token(setting)
    tokens_per_second = built.tokens_per_step / timing.median
    peak_device = peak_flops(row["device"], "bfloat16") if cuda else None
    return {
        **row,
        "tokens_per_step": built.tokens_per_step,
        "parameters": built.parameters,
        "seconds": list(timing.samples),
        "median_s": timing.median,
        "min_s": timing.minimum,
        "max_s": timing.maximum,
        "iqr_s": timing.iqr,
        "tokens_per_second": tokens_per_second,
        "mfu": mfu(None if per_token is None else per_token * tokens_per_second, peak_device),
        "mfu_causal": mfu(None if causal is None else causal * tokens_per_second, peak_device),
        "peak_memory_gib": peak,
        "notes": built.notes,
    }


def format_row(row: dict[str, Any]) -> str:
    """One line of the table the check prints."""
    setting = "compiled" if row["compiled"] else "eager"
    if "skipped" in row:
        return f"| {row['peer']:<12} | {setting:<8} | skipped: {row['skipped']}"
    mfu = "-" if row["mfu"] is None else f"{row['mfu']:.1f}"
    return (
        f"| {row['peer']:<12} | {setting:<8} | {row['tokens_per_second']:>10,.0f} tokens/s | MFU {mfu:>5} "
        f"| median {row['median_s'] * 1e3:.2f} ms (min {row['min_s'] * 1e3:.2f}, max "
        f"{row['max_s'] * 1e3:.2f}, IQR {row['iqr_s'] * 1e3:.2f}) of {row['steps']} | "
        f"{row['parameters']:,} parameters | {'; '.join(row['notes'])}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.harness", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("peer", choices=PEERS, help="which implementation's step")
    parser.add_argument("--tiny", action="store_true", help="the tiny Llama on the CPU (the suite's row)")
    parser.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    parser.add_argument("--steps", type=int, default=MIN_STEPS, help=f"timed steps (default {MIN_STEPS})")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; tiny 1)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 4096; tiny 64)")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write the row as JSON to PATH")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    setting = Setting(
        tiny=args.tiny,
        compiled=args.compile,
        seq=args.seq or (64 if args.tiny else 4096),
        batch=args.batch,
        warmup=args.warmup if args.warmup is not None else (1 if args.tiny else 3),
        steps=args.steps,
    )
    row = measure(args.peer, setting)
    print(format_row(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
