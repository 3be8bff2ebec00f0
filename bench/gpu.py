"""``python -m bench gpu``: training speed, MFU and memory of our models on one accelerator, in one command.

Meant for the first machine with a GPU (nothing of the runtime had run on one before it): under eight
minutes on one CUDA device it measures, for Llama 3 at about 1B parameters (Llama 3.2 1B's shape) and
Qwen 3.5 0.8B:

- training tokens/s and MFU (the preflight's FLOPs per token, in TorchTitan's convention of
  ``hyper_parallel.preflight.flops``, against the device's dense bf16 peak from
  ``hyper_parallel.preflight.devices``; beside it the causal MFU, attention term halved) of a plain
  training step (forward, cross entropy, backward, AdamW)
  with the model under FSDP2 on a one-device mesh, bf16 parameters and fp32 gradient reduction, as the
  trainer runs it; with ``torch.compile`` of each block off and on, and with SDPA limited to the flash or
  the memory-efficient kernel; for Qwen 3.5 with flash-linear-attention's Gated DeltaNet kernels when
  ``fla`` is installed and with our chunked PyTorch kernel;
- the same step for transformers' implementation of the same architecture, with the same weights (copied
  through the state-dict adapter);
- the gated delta rule alone at the 0.8B shape: our chunked kernel against fla's (forward + backward);
- peak allocated memory of each step against the preflight's per-rank estimate for the same layout.

It prints one table and writes JSON (``--json``, default ``bench-gpu.json``). Without a CUDA device it
prints one line saying so and exits 0. ``--tiny`` runs the same code on tiny models on the CPU in a few
seconds (the test suite runs it, so the benchmark cannot rot); compile rows are skipped there (compiling
takes longer than the whole tiny run) and SDPA's kernel choice does not apply. Nothing is downloaded.

    python -m bench gpu [--tiny] [--steps N] [--warmup N] [--seq N] [--batch N] [--only TEXT] [--json PATH]
    python -m bench gpu --check [--tiny] [--out DIR]     # every device check in one call (bench/gpu_check.py)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["main", "one_rank_group", "step_seconds"]

ROOT = Path(__file__).resolve().parents[1]


class Variant(NamedTuple):
    """One timed configuration of a model's training step."""

    implementation: str  # "ours" or "transformers"
    compiled: bool
    sdpa: str  # "flash", "efficient" or "default"
    gdn: str  # "fla", "chunked" or "-" (no Gated DeltaNet)
    #: "whole": the logits then the cross entropy; "fused": the fused, chunked loss (``loss.chunk_tokens``)
    loss: str = "whole"


def _fla_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("fla") is not None


def variants(family: str, *, cuda: bool, fla: bool, quick: bool = False) -> list[Variant]:
    """What is timed for ``family``: ours in each setting, then transformers' model (eager).

    ``quick`` (the device check's comparison, where the trainer's own runs measure compile): ours eager
    with the default kernels beside transformers'. Otherwise ours also with the fused, chunked loss (eager,
    and compiled blocks on CUDA): its peak memory and tokens/s against the whole logits'.
    """
    gdn = ["fla", "chunked"] if family == "qwen3_5" and fla else ["chunked" if family == "qwen3_5" else "-"]
    if not cuda:
        return [
            Variant("ours", False, "default", gdn[-1]),
            Variant("ours", False, "default", gdn[-1], "fused"),
            Variant("transformers", False, "default", gdn[0]),
        ]
    if quick:
        return [Variant("ours", False, "default", gdn[0]), Variant("transformers", False, "default", gdn[0])]
    found = [Variant("ours", False, "flash", gdn[0]), Variant("ours", False, "efficient", gdn[0])]
    found += [Variant("ours", False, "flash", g) for g in gdn[1:]]
    found.append(Variant("ours", False, "flash", gdn[0], "fused"))
    found.append(Variant("ours", True, "flash", gdn[0]))
    found.append(Variant("ours", True, "flash", gdn[0], "fused"))
    found.append(Variant("transformers", False, "flash", gdn[0]))
    return found


@contextlib.contextmanager
def _sdpa(kind: str) -> Iterator[None]:
    if kind == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[kind]
    with sdpa_kernel(backend):
        yield


def _use_gdn_kernel(model: Any, kind: str) -> None:
    """Our Gated DeltaNet layers of ``model`` on fla's kernels (as built, when installed) or on our chunked
    PyTorch kernel (``kind`` "chunked")."""
    from hyper_parallel.models.qwen3_5._modules import GatedDeltaNet

    if kind == "chunked":
        for module in model.modules():
            if isinstance(module, GatedDeltaNet):
                module.fla = None


def _blocks(model: Any) -> list[Any]:
    layers = model.layers if hasattr(model, "layers") else model.model.layers
    return list(layers.values() if hasattr(layers, "values") else layers)


def _prepare(model: Any, device: Any, mesh: Any, compiled: bool) -> Any:
    """``model`` on ``device`` under FSDP2 (one-device mesh, bf16 parameters, fp32 reduction).

    On the CPU (the tiny mode) parameters stay float32: CPU bf16 matmuls are slow and prove nothing here.
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = model.to(device).train()
    param_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in _blocks(model):
        if compiled:
            block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _train_step(model: Any, optimizer: Any, tokens: Any, fused: bool = False) -> None:
    import torch.nn.functional as F

    if fused:  # the trainer's fused loss: the model hands its hidden states and output weight to it
        from hyper_parallel.components.loss._chunked import ChunkedLinearCrossEntropy
        from hyper_parallel.components.loss._runtime import CausalLMLossFn
        from hyper_parallel.components.loss.chunking import DEFAULT_CHUNK_TOKENS

        head = ChunkedLinearCrossEntropy(CausalLMLossFn(), tokens, DEFAULT_CHUNK_TOKENS)
        loss = model(tokens, head=head) / (tokens.numel() - tokens.shape[0])
    else:
        out = model(tokens)
        logits = out.logits if hasattr(out, "logits") else out
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _estimate(family: str, overrides: dict[str, Any], seq: int, batch: int, fused: bool = False) -> Any:
    """The preflight's estimate of this step (one rank, bf16, no activation checkpointing; the whole logits
    or the fused loss)."""
    from hyper_parallel.config import load_config
    from hyper_parallel.preflight import estimate

    cfg = load_config(
        ROOT / "configs" / f"{family}_debug.yaml",
        {
            **{f"model.overrides.{key}": value for key, value in overrides.items()},
            "training.seq_len": seq,
            "training.micro_batch_size": batch,
            "training.global_batch_size": batch,
            "training.mixed_precision_param": "bfloat16",
            "activation_checkpoint.mode": "none",
            "loss.chunk_tokens": None if fused else 0,
        },
    )
    return estimate(cfg, 1)


def step_seconds(
    step: Callable[[], object],
    *,
    warmup: int,
    steps: int,
    sync: Callable[[], None],
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, ...]:
    """``warmup`` calls of ``step``, then the seconds of ``steps`` more, each timed to the end of ``sync``
    (which waits for the device's queued work): every timed loop of the benchmarks."""
    for _ in range(warmup):
        step()
    sync()
    samples = []
    for _ in range(steps):
        start = clock()
        step()
        sync()
        samples.append(clock() - start)
    return tuple(samples)


def _measure(
    variant: Variant, base: Any, tokens: Any, device: Any, mesh: Any, warmup: int, steps: int
) -> dict[str, Any]:
    """Seconds per step and peak memory of ``variant`` (a fresh copy of ``base``)."""
    import torch

    model = copy.deepcopy(base)
    _use_gdn_kernel(model, variant.gdn)
    model = _prepare(model, device, mesh, variant.compiled)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with _sdpa(variant.sdpa):
        times = step_seconds(
            functools.partial(_train_step, model, optimizer, tokens, variant.loss == "fused"),
            warmup=warmup,
            steps=steps,
            sync=lambda: _sync(device),
        )
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    del model, optimizer
    return {"seconds_per_step": statistics.median(times), "peak_memory_bytes": peak}


def _kernel_row(overrides: dict[str, Any], seq: int, device: Any, steps: int) -> dict[str, Any]:
    """Forward + backward of the gated delta rule at the model's shape: our chunked kernel, then fla's."""
    import attrs
    import torch

    from hyper_parallel.models.qwen3_5 import _gated_delta
    from hyper_parallel.models.qwen3_5.args import QWEN3_5_FLAVORS

    args = attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], **overrides)
    h, d_k, d_v = args.linear_num_value_heads, args.linear_key_head_dim, args.linear_value_head_dim
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)

    def tensor(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=generator, device=device) * scale).to(dtype).requires_grad_()

    inputs = [
        tensor(1, seq, h, d_k),
        tensor(1, seq, h, d_k),
        tensor(1, seq, h, d_v),
        (-torch.rand(1, seq, h, generator=generator, device=device)).requires_grad_(),
        torch.rand(1, seq, h, generator=generator, device=device).to(dtype).requires_grad_(),
    ]
    kernels: dict[str, Callable[[], Any] | None] = {
        "chunked": lambda: _gated_delta.chunk_gated_delta_rule(*inputs)[0]
    }
    fla = _gated_delta.fla_kernel(d_k) if device.type == "cuda" else None
    kernels["fla"] = None if fla is None else (lambda: _gated_delta.gated_delta_rule(*inputs, fla=fla)[0])
    row: dict[str, Any] = {"name": f"gated delta rule {h}x{d_k}", "seq": seq}
    for name, kernel in kernels.items():
        if kernel is None:
            row[f"{name}_ms"] = None
            continue
        samples = []
        for index in range(steps + 1):
            start = time.perf_counter()
            kernel().float().sum().backward()
            _sync(device)
            if index:  # the first is warm-up
                samples.append(time.perf_counter() - start)
            for t in inputs:
                t.grad = None
        row[f"{name}_ms"] = statistics.median(samples) * 1e3
    return row


@contextlib.contextmanager
def one_rank_group(device: Any) -> Iterator[None]:
    """A one-rank process group for ``device`` (as a launcher starts one rank) unless one exists, destroyed
    after when it was started here."""
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        if started:
            dist.destroy_process_group()


@contextlib.contextmanager
def _one_rank(device: Any, tiny: bool) -> Iterator[Any]:
    """A one-rank process group and its mesh (FSDP2 runs as in the trainer); everything undone after."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    threads = torch.get_num_threads()
    if tiny:  # tiny tensors: more threads only wait for each other (and for the machine's other work)
        torch.set_num_threads(1)
    try:
        with one_rank_group(device):
            yield init_device_mesh(device.type, (1,))
    finally:
        torch.set_num_threads(threads)


def run(
    tiny: bool, steps: int, warmup: int, seq: int, batch: int, only: str, quick: bool = False
) -> dict[str, Any]:
    """Every measurement, as the JSON document ``main`` writes."""
    import torch

    cuda = torch.cuda.is_available() and not tiny
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    with _one_rank(device, tiny) as mesh:
        return _run(device, mesh, tiny, steps, warmup, seq, batch, only, quick)


def _run(
    device: Any, mesh: Any, tiny: bool, steps: int, warmup: int, seq: int, batch: int, only: str, quick: bool
) -> dict[str, Any]:
    import torch

    from bench.model_shapes import FULL_MODELS, TINY_MODELS, qwen3_5_0_8b_overrides
    from bench.models import _pair
    from hyper_parallel.preflight.devices import peak_flops
    from hyper_parallel.preflight.flops import CONVENTION, mfu

    cuda = device.type == "cuda"
    device_name = torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu"
    peak = peak_flops(device_name, "bfloat16") if cuda else None
    fla = _fla_installed() and cuda
    table = TINY_MODELS if tiny else FULL_MODELS
    rows: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    for family, (name, overrides) in table.items():
        if only not in name:
            continue
        if family == "qwen3_5" and not tiny:
            overrides = qwen3_5_0_8b_overrides()
        ours, theirs, args = _pair(family, overrides)
        estimates = {fused: _estimate(family, overrides, seq, batch, fused) for fused in (False, True)}
        est = estimates[False]
        flops_per_token = est.flops_per_token if est is not None else None
        causal_per_token = est.causal_flops_per_token if est is not None else None
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, args.vocab_size, (batch, seq), generator=generator).to(device)
        for variant in variants(family, cuda=cuda, fla=fla, quick=quick):
            base = ours if variant.implementation == "ours" else theirs
            measured = _measure(variant, base, tokens, device, mesh, warmup, steps)
            tokens_per_second = batch * seq / measured["seconds_per_step"]
            tflops = None if flops_per_token is None else flops_per_token * tokens_per_second / 1e12
            rows.append(
                {
                    "model": name,
                    **variant._asdict(),
                    "seq": seq,
                    "batch": batch,
                    "tokens_per_second": tokens_per_second,
                    "tflops": tflops,
                    "mfu": mfu(None if tflops is None else tflops * 1e12, peak),
                    "mfu_causal": mfu(
                        None if causal_per_token is None else causal_per_token * tokens_per_second, peak
                    ),
                    "peak_memory_gib": None
                    if measured["peak_memory_bytes"] is None
                    else measured["peak_memory_bytes"] / 2**30,
                    "preflight_memory_gib": None
                    if estimates[variant.loss == "fused"] is None
                    else estimates[variant.loss == "fused"].device_total / 2**30,
                }
            )
            print(_format_row(rows[-1]), flush=True)
        if family == "qwen3_5":
            kernels.append(_kernel_row(overrides, seq, device, steps))
        del ours, theirs
    return {
        "device": device_name,
        "peak_tflops_bf16": None if peak is None else peak / 1e12,
        "flops_convention": CONVENTION,
        "torch": torch.__version__,
        "fla_installed": _fla_installed(),
        "tiny": tiny,
        "steps": steps,
        "warmup": warmup,
        "rows": rows,
        "kernels": kernels,
    }


def _shown(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _format_row(row: dict[str, Any]) -> str:
    setting = f"{'compiled' if row['compiled'] else 'eager'}, sdpa {row['sdpa']}, gdn {row['gdn']}"
    setting += ", fused loss" if row["loss"] == "fused" else ""
    return (
        f"| {row['model']:<13} | {row['implementation']:<12} | {setting:<48} "
        f"| {row['tokens_per_second']:>10,.0f} "
        f"| {_shown(row['tflops'], '.3g'):>7} | {_shown(row['mfu'], '.1f'):>5} "
        f"| {_shown(row['mfu_causal'], '.1f'):>6} | {_shown(row['peak_memory_gib'], '.3g'):>8} "
        f"| {_shown(row['preflight_memory_gib'], '.3g'):>9} |"
    )


_HEADER = (
    "| model         | impl         | setting                                          |   tokens/s "
    "|  TFLOPs |  MFU% "
    "| causal | peak GiB | preflight |\n"
    "|---------------|--------------|--------------------------------------------------|-----------:"
    "|--------:|------:"
    "|-------:|---------:|----------:|"
)


def _format_kernel(row: dict[str, Any]) -> str:
    return (
        f"{row['name']}, seq {row['seq']}, forward + backward: chunked "
        f"{_shown(row['chunked_ms'], '.2f')} ms, fla {_shown(row['fla_ms'], '.2f')} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny models on the CPU (the CI smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per row (default 10; tiny 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per row (default 3; tiny 0)")
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default 4096; tiny 32)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    parser.add_argument("--only", default="", help="only the models whose row name contains this text")
    parser.add_argument("--json", metavar="PATH", default="bench-gpu.json", help="results file")
    parser.add_argument(
        "--quick", action="store_true", help="ours eager with default kernels beside transformers' only"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="every device check in one call (bench/gpu_check.py); exit 1 on a failure",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="--check: results folder (default $OUT or bench-gpu-check)"
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="--check: seconds the whole check may take (default 450)"
    )
    parser.add_argument(
        "--parts", default="", help="--check: comma-separated steps (default all; see bench/gpu_check.py)"
    )
    args = parser.parse_args(argv)
    if args.check:
        from bench.gpu_check import DEFAULT_BUDGET, PARTS
        from bench.gpu_check import main as check_main

        parts = tuple(args.parts.split(",")) if args.parts else PARTS
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            parser.error(f"--parts: unknown {', '.join(unknown)} (choose from {', '.join(PARTS)})")
        return check_main(args.tiny, args.out, args.budget or DEFAULT_BUDGET, parts)
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("bench gpu: skipped, no CUDA device here (python -m bench gpu --tiny runs the CPU smoke mode)")
        return 0
    steps = args.steps or (1 if args.tiny else 10)
    warmup = args.warmup if args.warmup is not None else (0 if args.tiny else 3)
    seq = args.seq or (32 if args.tiny else 4096)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.perf_counter()
    print(_HEADER, flush=True)
    results = run(args.tiny, steps, warmup, seq, args.batch, args.only, args.quick)
    results["seconds"] = time.perf_counter() - started
    for row in results["kernels"]:
        print(_format_kernel(row))
    peak = results["peak_tflops_bf16"]
    print(
        f"TFLOPs and MFU: {results['flops_convention']}; 'causal': MFU of the causal count (attention "
        "term halved, as Megatron counts it)"
    )
    print(
        f"device {results['device']} (bf16 peak {_shown(peak, '.1f')} TFLOP/s), torch {results['torch']}, "
        f"fla {'installed' if results['fla_installed'] else 'not installed'}; {results['seconds']:.0f} s"
    )
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")
    return 0
