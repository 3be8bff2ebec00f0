"""LoRA's rules across root groups (``trainer.rules`` calls them through the Config).

Torch-free: the resolver runs them. They need the model (its linear layers, its parameter shapes), the
compute dtype and the parallel layout, so they take those root groups (``RunGroups``: a ``TrainerConfig``
is one); each yields ``(root field path, message)``.
"""

import difflib
import importlib.util
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from hyper_parallel.components.peft.storage import (
    NF4_BLOCK,
    NF4_QUANTUM,
    NF4_SCALER_BLOCK,
    TORCHAO_VERSION,
    nf4_fits,
)

if TYPE_CHECKING:
    from hyper_parallel.components.peft import LoRA, RunGroups
    from hyper_parallel.preflight.model import ParamGroup

__all__ = ["layout_issues", "run_issues"]

Issues = Iterator[tuple[str, str]]

#: Parallel degrees QLoRA refuses above 1, each with the reason.
_NF4_REFUSED = {
    "tp": "torchao's NF4 tensor cannot be split by tensor parallelism",
    "pp": "pipeline parallelism is not supported with it yet",
    "ep": "expert parallelism is not supported with it yet (routed experts are never adapted)",
    "dp_replicate": "torch's FSDP2 does not all-gather an NF4 tensor it replicates (DDP), and torchao's "
    "NF4 all-gather has one mesh dimension (not HSDP's two)",
}
#: The degrees QLoRA's layout rule reads: those it refuses, and ``dp_shard``, which splits NF4 weights.
_NF4_DEGREES = (*_NF4_REFUSED, "dp_shard")


def run_issues(peft: "LoRA.Config", cfg: "RunGroups") -> Issues:
    """``targets`` must name linear layers of the model's blocks (the model's arguments list them); the
    base's own rules (a bfloat16 base needs bfloat16 compute); an NF4 base needs torchao, weights NF4
    can hold, and a layout it runs on (the explicit degrees: ``-1`` waits for the world size)."""
    from hyper_parallel.components.peft import ALL_LINEAR

    args = cfg.model.args
    names = args.block_linear_names()
    named = peft.target_layers(args)
    unknown = [target for target, layers in named.items() if names is not None and not layers]
    if unknown:
        hf = sorted(args.hf_linear_names())
        theirs = f", Hugging Face's {', '.join(hf)}" if hf else ""
        spellings = [*(names or ()), *hf, ALL_LINEAR]
        # closer than the resolver's suggestions: the layer names share "_proj", "in_proj_" and "w"
        close = (
            difflib.get_close_matches(unknown[0], spellings, n=1, cutoff=0.75) if len(unknown) == 1 else []
        )
        guess = f"; did you mean {close[0]!r}?" if close else ""
        yield (
            "peft.targets",
            f"{', '.join(repr(t) for t in unknown)} name no linear layer of {cfg.model.name}'s blocks; "
            f"choose among {', '.join(sorted(names or ()))}{theirs}, or {ALL_LINEAR}{guess}",
        )
    yield from peft.base.issues(cfg.training.mixed_precision_param)
    weights = _nf4_weights(peft, cfg) if not unknown else None
    if weights is not None:  # the NF4 weights, listed once for both rules
        yield from _nf4_issues(weights, cfg)
        par = cfg.parallelism
        explicit = {name: getattr(par, name) for name in _NF4_DEGREES}
        yield from _layout_issues(weights, cfg, {k: v for k, v in explicit.items() if v != -1})


def _nf4_weights(peft: "LoRA.Config", cfg: "RunGroups") -> list[tuple[str, tuple[int, ...]]] | None:
    """``(layer name, weight shape)`` of each kind of weight the run stores as NF4 (the adapted layers',
    with ``quantize_embeddings`` the embedding and output matrices); ``None`` when it stores none."""
    if not peft.base.quantized:
        return None
    groups = peft.roles(_parameters(cfg), cfg.model.args, cfg.training.mixed_precision_param).groups
    embeddings = cfg.model.args.embedding_layers()
    found: dict[tuple[str, tuple[int, ...]], None] = {}
    for group, role in groups:
        if role == "nf4":
            name = group.linears[0] if group.linears else embeddings[group.kind].rsplit(".", 1)[-1]
            found[(name, group.shape)] = None
    return list(found)


def _parameters(cfg: "RunGroups") -> list["ParamGroup"]:
    """The model's parameter groups (its torch-free cost model's); none when its arguments offer none."""
    method = getattr(cfg.model.args, "preflight", None)
    return list(method().parameters()) if callable(method) else []


def _nf4_issues(weights: list[tuple[str, tuple[int, ...]]], cfg: "RunGroups") -> Issues:
    """An NF4 base needs torchao installed and every NF4 weight (``weights``) a whole number of NF4
    blocks."""
    if importlib.util.find_spec("torchao") is None:
        yield (
            "peft.base_dtype",
            "'nf4' needs torchao, which is not installed: pip install 'hyper-parallel[qlora]' "
            f"(torchao=={TORCHAO_VERSION}), or use 'float32'",
        )
    bad = [(name, shape) for name, shape in weights if not nf4_fits(shape)]
    if bad:
        listed = ", ".join(f"{name} ({' x '.join(map(str, s))} = {math.prod(s):,})" for name, s in bad)
        outside = {name.rsplit(".", 1)[-1] for name in cfg.model.args.embedding_layers().values()}
        embeddings = sum(name in outside for name, _ in bad)
        if not embeddings:
            fix = f"leave {'it' if len(bad) == 1 else 'them'} out of peft.targets"
        elif embeddings == len(bad):
            fix = "set peft.quantize_embeddings to false"
        else:
            fix = "leave the layers out of peft.targets, set peft.quantize_embeddings to false"
        yield (
            "peft.base_dtype",
            f"'nf4' stores a weight in blocks of {NF4_BLOCK} values with one scale per {NF4_SCALER_BLOCK} "
            f"blocks, so its size must be a multiple of {NF4_QUANTUM:,}; not so for {listed}: {fix}, "
            "or use 'float32'",
        )


def layout_issues(peft: "LoRA.Config", cfg: "RunGroups", degrees: Mapping[str, int]) -> Issues:
    """An NF4 base runs on one process or with FSDP2 over ``dp_shard`` alone, each rank holding whole NF4
    blocks of every NF4 weight (``degrees``: those known; others are left out)."""
    weights = _nf4_weights(peft, cfg)
    if weights is not None:
        yield from _layout_issues(weights, cfg, degrees)


def _layout_issues(
    weights: list[tuple[str, tuple[int, ...]]], cfg: "RunGroups", degrees: Mapping[str, int]
) -> Issues:
    """:func:`layout_issues` for the NF4 ``weights``."""
    for name, reason in _NF4_REFUSED.items():
        if degrees.get(name, 1) > 1:
            yield (
                f"parallelism.{name}",
                f"peft.base_dtype 'nf4' runs on one process or with FSDP2 over dp_shard alone: {reason}; "
                f"set parallelism.{name} to 1 or peft.base_dtype to 'float32', got {degrees[name]}",
            )
    shards = degrees.get("dp_shard", 1)
    if shards <= 1:
        return
    if cfg.training.enable_cpu_offload:
        yield (
            "training.enable_cpu_offload",
            "peft.base_dtype 'nf4' does not offload its NF4 weights to the host yet; set it to false",
        )
    bad = [
        f"{name} ({' x '.join(map(str, shape))})" for name, shape in weights if not nf4_fits(shape, shards)
    ]
    if bad:
        yield (
            "parallelism.dp_shard",
            f"with peft.base_dtype 'nf4' each of the {shards} ranks holds whole rows and whole scale blocks "
            f"({NF4_QUANTUM:,} values) of every NF4 weight; not so for {', '.join(bad)}; use a "
            f"dp_shard that divides them, got {shards}",
        )
