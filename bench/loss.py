"""``python -m bench loss``: the fused, chunked cross entropy against the whole-logits loss, memory and time.

One forward and backward of the output projection plus the loss (``hidden @ weight.T`` then
``CausalLMLossFn``; or ``components/loss/_chunked.py``) at one shape, each path in a fresh child process so
that its peak is its own: on CUDA the allocator's peak above the inputs, on the CPU the child's peak
resident set (``ru_maxrss``) above its resident set once the inputs exist. Time: the median of ``--steps``
forward + backward after one warm-up. Label smoothing and z-loss on, a few ignored labels, as a run has.

    python -m bench loss [--tokens 2048] [--vocab 128256] [--dim 256] [--chunk 1024] [--dtype float32]
                         [--steps 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any


def _rss_bytes() -> int:
    """The process's resident set now (Linux ``/proc/self/statm``)."""
    import os

    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _one(path: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hyper_parallel.components.loss._chunked import linear_cross_entropy_sum
    from hyper_parallel.components.loss._runtime import CausalLMLossFn

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    hidden = (torch.randn(1, args.tokens, args.dim, generator=generator) * 0.5).to(device, dtype)
    weight = (torch.randn(args.vocab, args.dim, generator=generator) * 0.02).to(device, dtype)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    labels = torch.randint(0, args.vocab, (1, args.tokens), generator=generator).to(device)
    labels[0, : args.tokens // 16] = -100
    loss = CausalLMLossFn(label_smoothing=0.1, z_loss_weight=1e-4)

    def step() -> float:
        started = time.perf_counter()
        if path == "chunked":
            total = linear_cross_entropy_sum(
                hidden, weight, labels, chunk_tokens=args.chunk, label_smoothing=0.1, z_loss_weight=1e-4
            )
        else:
            total, _ = loss.sum_and_count(hidden @ weight.t(), labels)
        total.backward()  # type: ignore[no-untyped-call]
        hidden.grad = None
        weight.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    if device.type == "cuda":
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_bytes()
    step()  # warm-up; its peak is the peak of every step
    peak = (torch.cuda.max_memory_allocated() if device.type == "cuda" else _peak_rss_bytes()) - base
    times = [step() for _ in range(args.steps)]
    return {"path": path, "peak_bytes": peak, "seconds": statistics.median(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench loss", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one", choices=("whole", "chunked"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args)))
        return 0
    passed = [a for a in (argv if argv is not None else sys.argv[2:])]
    rows = []
    for path in ("whole", "chunked"):
        child = subprocess.run(
            [sys.executable, "-m", "bench", "loss", *passed, "--one", path],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    whole, chunked = rows
    print(
        f"{args.tokens} tokens x vocab {args.vocab}, dim {args.dim}, {args.dtype} on {args.device}, "
        f"chunks of {args.chunk} tokens (forward + backward of the projection and the loss):"
    )
    for row in rows:
        peak, ms = row["peak_bytes"] / 2**20, row["seconds"] * 1e3
        print(f"  {row['path']:<8} peak {peak:8.1f} MiB   {ms:8.1f} ms")
    print(
        f"  chunked / whole: memory {chunked['peak_bytes'] / max(whole['peak_bytes'], 1):.2f}x, "
        f"time {chunked['seconds'] / whole['seconds']:.2f}x"
    )
    return 0
