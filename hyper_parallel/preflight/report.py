"""The preflight report a person reads at ``--dry-run``: compact, aligned, human units."""

from hyper_parallel.preflight.devices import Device
from hyper_parallel.preflight.estimate import Estimate
from hyper_parallel.preflight.flops import CAUSAL_CONVENTION, CONVENTION

__all__ = ["exact_count", "format_report", "human_bytes", "human_count", "human_flops"]

_KIND_ORDER = ("embedding", "attention", "gated_deltanet", "mlp", "moe", "norm", "output", "vision")


def _scaled(value: float, step: float, units: tuple[str, ...]) -> tuple[float, str]:
    i = 0
    while abs(value) >= step * 0.9995 and i < len(units) - 1:
        value /= step
        i += 1
    return value, units[i]


def human_bytes(n: float) -> str:
    """``1.5 GiB``-style binary units."""
    value, unit = _scaled(n, 1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def human_count(n: float) -> str:
    """``8.03 B``-style decimal counts (K, M, B, T)."""
    value, unit = _scaled(n, 1000, ("", "K", "M", "B", "T"))
    return f"{value:.0f}" if not unit else f"{value:.2f} {unit}"


def exact_count(n: int) -> str:
    """``8.03 B (8,030,261,248)``: the rounded count and, where rounding hides digits, the exact one."""
    return human_count(n) if n < 1000 else f"{human_count(n)} ({n:,})"


def human_flops(n: float) -> str:
    """``48.6 GFLOP``-style decimal FLOPs."""
    value, unit = _scaled(n, 1000, ("", "K", "M", "G", "T", "P", "E", "Z"))
    return f"{value:.1f} {unit}FLOP"


def _ac(ac: str | int) -> str:
    if ac == "op":
        return "selective op"
    if isinstance(ac, int):
        return f"selective every {ac}"
    return ac


def format_report(est: Estimate, device: Device | None = None) -> str:
    """The report lines for ``est``; with ``device``, how much of its memory the total takes."""
    deg = est.layout.degrees
    shown = [f"{k} {deg[k]}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp") if deg[k] > 1]
    if deg.get("ep", 1) > 1:
        shown.append(f"ep {deg['ep']} (of dp_shard)")
    ranks = f"{est.layout.world_size} rank{'s' if est.layout.world_size != 1 else ''}"
    if not est.world_size_known:
        ranks += " (world size not given: each auto degree (-1) counted as 1" + (
            ", dp_shard as ep)" if deg.get("ep", 1) > 1 else ")"
        )
    layout = " x ".join(shown) if shown else "no parallelism"
    lines = [
        f"preflight: {est.model}, {ranks}, {layout}, {est.compute_dtype} compute, {est.optimizer}",
        f"  parameters  {exact_count(est.params_total)}"
        + (
            f", {exact_count(est.params_active)} active per token"
            if est.params_active != est.params_total
            else ""
        )
        + ": "
        + ", ".join(
            f"{kind.replace('_', ' ')} {exact_count(est.params_by_kind[kind])}"
            for kind in _KIND_ORDER
            if kind in est.params_by_kind
        ),
    ]
    if est.peft:
        lines.append(
            f"  trainable   {exact_count(est.trainable)}: {est.peft} adapters on {est.adapted_layers} linear "
            f"layers; frozen {exact_count(est.frozen)}: the base model, "
            + (
                f"{exact_count(est.quantized)} of it in NF4 (the adapted layers' weights"
                + (" and the embeddings)" if est.nf4_embeddings else ")")
                if est.quantized
                else est.frozen_dtype
            )
        )
    lines.append("  memory per rank (rank 0)")
    states = (
        f"{est.optimizer}: {est.optimizer_states} float32 state{'s' if est.optimizer_states != 1 else ''}"
    )
    offload = ", in host memory" if est.cpu_offload else ""
    only = ", adapters only" if est.peft else ""
    held = "float32 master"
    if est.peft:
        base = f"NF4 + {est.frozen_dtype}" if est.quantized else est.frozen_dtype
        held = (
            f"float32 adapters {human_bytes(est.terms['parameters'] - est.frozen_bytes)}, "
            f"frozen {base} base {human_bytes(est.frozen_bytes)}"
        )
    notes = {
        "parameters": f"{held}, shard of dp_shard {deg['dp_shard']} x tp {deg['tp']}{offload}"
        + (
            f" (experts: ep {deg['ep']} x dp_shard/ep {deg['dp_shard'] // deg['ep']})"
            if deg.get("ep", 1) > 1
            else ""
        ),
        "gradients": f"float32{only}{offload}"
        + ("" if est.gradients_at_peak else "; after the peak (one micro batch)"),
        "optimizer": states + only + offload,
        "activations": f"micro batch {est.layout.micro_batch} x {est.seq} tokens, "
        f"checkpointing {_ac(est.layout.ac)}"
        + (", compiled blocks" if "model" in est.compiled else "")
        + (f"; {est.note}" if est.note else ""),
        "fsdp buffers": f"gathered {est.compute_dtype} weights (root + 2 blocks), 1 block of gradients",
        "logits": f"fused loss: {est.loss_chunk_tokens}-token chunks of float32 logits, the output "
        "weight's float32 gradient, the hidden states' gradient"
        if est.loss_chunk_tokens
        else f"{est.compute_dtype} logits"
        + (
            " and their gradient (compiled loss: no float32 copy)"
            if "loss" in est.compiled
            else ", the loss's float32 log-probabilities and their gradient"
        ),
    }
    for term, size in est.terms.items():
        lines.append(f"    {term:<13} {human_bytes(size):>10}   {notes[term]}")
    total = f"    {'total':<13} {human_bytes(est.device_total):>10}"
    if est.cpu_offload:
        total += "   on the device (sharded states offloaded)"
    if device is not None:
        share = est.device_total / device.memory
        verdict = "fits" if share <= 1 else "DOES NOT FIT"
        where = f"{device.name} ({human_bytes(device.memory)})" if device.name else human_bytes(device.memory)
        total += f"   {verdict} {where}: {share:.0%}"
    lines.append(total)
    per_rank = est.flops_per_step / est.layout.world_size
    compute = (
        f"  compute     {human_flops(est.flops_per_token)}/token, {human_flops(est.flops_per_step)}/step, "
        f"{human_flops(per_rank)}/rank/step"
    )
    if device is not None and device.peak_flops:
        compute += f" = {per_rank / device.peak_flops:.3g} s at {human_flops(device.peak_flops)}/s peak"
    lines.append(compute)
    lines.append(
        f"              {CONVENTION}; {CAUSAL_CONVENTION} {human_flops(est.causal_flops_per_token)}/token"
    )
    if est.all_to_all_bytes:
        lines.append(
            f"  all-to-all  {human_bytes(est.all_to_all_bytes)}/rank/step sent by the experts' dispatch and "
            "combine (forward and backward, uniform routing)"
        )
    return "\n".join(lines) + "\n"
