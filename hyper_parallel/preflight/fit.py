"""``--device-memory``: refuse a layout whose estimate exceeds the device, and say which changes fit."""

from typing import TYPE_CHECKING

from hyper_parallel.preflight.devices import Device
from hyper_parallel.preflight.estimate import Estimate, Layout, evaluate, layout_of, model_costs
from hyper_parallel.preflight.report import human_bytes

if TYPE_CHECKING:
    from hyper_parallel.preflight.inputs import RunConfig

__all__ = ["memory_issues"]

#: The config field to change for each term, named in the error.
_TERM_FIELD = {
    "parameters": "parallelism.dp_shard",
    "gradients": "parallelism.dp_shard",
    "optimizer": "parallelism.dp_shard",
    "activations": "activation_checkpoint.mode",
    "fsdp buffers": "parallelism.tp",
    "logits": "training.micro_batch_size",
}
_MAX_DP_GROWTH = 64


def _device(device: Device) -> str:
    size = human_bytes(device.memory)
    return f"the {size} of {device.name}" if device.name else f"the device memory ({size})"


def _describe(term: str, est: Estimate) -> str:
    if term == "activations":
        ac = est.layout.ac
        mode = f"selective {ac}" if ac == "op" or isinstance(ac, int) else ac
        return f"micro batch {est.layout.micro_batch} x {est.seq} tokens, activation checkpointing {mode}"
    if term in ("parameters", "gradients", "optimizer"):
        return (
            f"float32, sharded over dp_shard {est.layout.degrees['dp_shard']} x tp {est.layout.degrees['tp']}"
        )
    if term == "logits":
        return f"micro batch {est.layout.micro_batch} x {est.seq} tokens"
    return f"tp {est.layout.degrees['tp']}"


def _candidates(cfg: "RunConfig", layout: Layout, tp_ok: list[int]) -> list[tuple[str, Layout]]:
    """Single changes, each the smallest of its kind, in the order a user would try them."""
    deg, out = layout.degrees, []
    batch_ranks = cfg.training.global_batch_size // cfg.training.micro_batch_size
    for factor in (2, 4, 8, 16, 32, _MAX_DP_GROWTH):
        shard = deg["dp_shard"] * factor
        if batch_ranks % (shard * deg["dp_replicate"]) == 0:
            world = layout.world_size * factor
            out.append(
                (
                    f"parallelism.dp_shard={shard} (world size {world})",
                    layout._replace(degrees={**deg, "dp_shard": shard}),
                )
            )
    others = layout.world_size // (deg["tp"] * deg["dp_shard"])
    for tp in tp_ok:
        if tp > deg["tp"] and (deg["tp"] * deg["dp_shard"]) % tp == 0:
            shard = deg["tp"] * deg["dp_shard"] // tp
            if others and batch_ranks % (shard * deg["dp_replicate"]) == 0:
                out.append(
                    (
                        f"parallelism.tp={tp} (dp_shard {shard})",
                        layout._replace(degrees={**deg, "tp": tp, "dp_shard": shard}),
                    )
                )
    if layout.ac != "full":
        out.append(("activation_checkpoint.mode=full", layout._replace(ac="full")))
    mbs = layout.micro_batch
    while mbs > 1:
        mbs //= 2
        out.append((f"training.micro_batch_size={mbs}", layout._replace(micro_batch=mbs)))
    return out


def memory_issues(cfg: "RunConfig", world_size: int | None, device: Device) -> list[tuple[str, str]]:
    """``(field path, message)`` when the estimate of ``cfg`` exceeds ``device``'s memory, else nothing."""
    costs = model_costs(cfg)
    if costs is None:
        return [
            ("model", f"{cfg.model.name} offers no preflight estimate, so --device-memory cannot check it")
        ]
    known = world_size is not None
    own = evaluate(cfg, costs, layout_of(cfg, world_size), known)
    if own.device_total <= device.memory:
        return []
    term, size = max(own.terms.items(), key=lambda kv: kv[1])
    fits: list[str] = []
    seen: set[str] = set()
    for label, layout in _candidates(cfg, own.layout, list(costs.tp_degrees())):
        kind = label.split("=")[0]
        if kind in seen:
            continue
        total = evaluate(cfg, costs, layout, known).device_total
        if total <= device.memory:
            seen.add(kind)
            fits.append(f"{label}: {human_bytes(total)}")
    if not fits:
        best = own.layout._replace(ac="full", micro_batch=1)
        total = evaluate(cfg, costs, best, known).device_total
        fits.append(
            f"none alone; activation_checkpoint.mode=full with training.micro_batch_size=1 gives "
            f"{human_bytes(total)}, add dp_shard or tp from there"
        )
    message = (
        f"estimated {human_bytes(own.device_total)} per rank exceeds {_device(device)}; "
        f"biggest term: {term} {human_bytes(size)} ({_describe(term, own)}). "
        f"Changes that fit: " + "; ".join(fits)
    )
    return [(_TERM_FIELD[term], message)]
