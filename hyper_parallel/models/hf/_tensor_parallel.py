"""Tensor parallelism of a transformers model from its own ``base_model_tp_plan`` (Megatron style).

transformers states, per model, how each linear layer of its decoder layers splits (``"colwise"``,
``"rowwise"``, ``"colwise_gather_output"``, ``"rowwise_split_input"``, ``"replicated_with_grad_allreduce"``);
each maps onto one of torch's ``ParallelStyle``s, which the shared pipeline applies on the ``tp`` mesh before
FSDP2. The attention modules reshape with ``-1`` heads, so a rank runs the heads its column slice holds.
``replicated_with_grad_allreduce`` marks the per-head query/key norms (Qwen 3, Gemma 3, ...): their weight
is whole on every rank, but each rank applies it to its own heads only, so its gradient is a partial sum;
the norm takes its input as a ``DTensor`` sharded on the heads (torch's ``SequenceParallel`` over dimension
2, as the native Qwen 3.5 plan does), which makes that gradient ``Partial``, summed over the ranks where the
optimizer and the clipping read it (left replicated like the other norms, each rank would train the norm on
its heads alone and the ranks would drift apart).
Every other parameter (embeddings, norms, the output head) is left whole and replicated by the pipeline.
``plan_issue`` is what ``--dry-run`` refuses (torch-free); ``apply_tp`` runs at launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["SPLIT_DIM", "apply_tp", "plan_issue", "plan_weights"]

#: transformers' style -> the dimension of the weight it splits (None: left whole, replicated).
SPLIT_DIM: Mapping[str, int | None] = {
    "colwise": 0,
    "colwise_gather_output": 0,
    "rowwise": 1,
    "rowwise_split_input": 1,
    "replicated_with_grad_allreduce": None,
}


def plan_weights(plan: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]], base: str) -> dict[str, str]:
    """Our name of every weight the plan names -> its style."""
    found: dict[str, str] = {}
    for name in shapes:
        if not name.startswith(base) or not name.endswith(".weight"):
            continue
        module = name[len(base) : -len(".weight")]
        for pattern, style in plan.items():
            if fnmatchcase(module, pattern):
                found[name] = style
    return found


def plan_issue(
    plan: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    base: str,
    heads: int,
    kv_heads: int,
    tp: int,
) -> str | None:
    """Why the model cannot run under ``tp`` ranks; None when it can."""
    if not plan:
        return "has no base_model_tp_plan in transformers, so tensor parallelism cannot split it"
    unknown = sorted({style for style in plan.values() if style not in SPLIT_DIM})
    if unknown:
        return f"its base_model_tp_plan uses {', '.join(map(repr, unknown))}, which is not supported yet"
    if heads % tp or kv_heads % tp:
        return f"must divide the model's {heads} attention heads and {kv_heads} key/value heads, got {tp}"
    for name, style in plan_weights(plan, shapes, base).items():
        dim = SPLIT_DIM[style]
        if dim is not None and shapes[name][dim] % tp:
            return f"must divide dimension {dim} ({shapes[name][dim]}) of {name}, got {tp}"
    return None


def apply_tp(model: Any, plan: Mapping[str, str], base_name: str, tp_mesh: Any) -> None:
    """Split the linear layers ``plan`` names (module patterns under ``model.get_submodule(base_name)``)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    styles = {
        "colwise": ColwiseParallel(),
        "colwise_gather_output": ColwiseParallel(output_layouts=Replicate()),
        "rowwise": RowwiseParallel(),
        "rowwise_split_input": RowwiseParallel(input_layouts=Replicate()),
        # a per-head norm's input (batch, seq, heads, head size) is sharded on the heads
        "replicated_with_grad_allreduce": SequenceParallel(sequence_dim=2, use_local_output=True),
    }
    base = model.get_submodule(base_name)
    chosen: dict[str, Any] = {}
    for name, _ in base.named_modules():
        for pattern, style in plan.items():
            if style in styles and fnmatchcase(name, pattern):
                chosen[name] = styles[style]
    parallelize_module(base, tp_mesh, chosen)
