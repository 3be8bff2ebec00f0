"""Tensor parallelism of a transformers model from its own ``base_model_tp_plan`` (Megatron style).

transformers states, per model, how each linear layer of its decoder layers splits (``"colwise"``,
``"rowwise"``, ``"colwise_gather_output"``, ``"rowwise_split_input"``, ``"replicated_with_grad_allreduce"``);
each maps onto one of torch's ``ParallelStyle``s, which the shared pipeline applies on the ``tp`` mesh before
FSDP2. The attention modules reshape with ``-1`` heads, so a rank runs the heads its column slice holds.
``replicated_with_grad_allreduce`` marks the per-head query/key norms (Qwen 3, Gemma 3, ...): their weight
is whole on every rank, but each rank applies it to its own heads only, so its gradient is a partial sum;
the norm takes its input as a ``DTensor`` sharded on the heads (:func:`_per_head_norm`), which makes
that gradient ``Partial`` and reduced over the ranks as the optimizer reads it (left replicated like the
other norms, each rank would train the norm on its heads alone and the ranks would drift apart).
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
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {
        "colwise": ColwiseParallel(),
        "colwise_gather_output": ColwiseParallel(output_layouts=Replicate()),
        "rowwise": RowwiseParallel(),
        "rowwise_split_input": RowwiseParallel(input_layouts=Replicate()),
    }
    base = model.get_submodule(base_name)
    chosen: dict[str, Any] = {}
    for name, module in base.named_modules():
        for pattern, style in plan.items():
            if not fnmatchcase(name, pattern):
                continue
            if style in styles:
                chosen[name] = styles[style]
            elif style == "replicated_with_grad_allreduce":
                _per_head_norm(module, tp_mesh)
    parallelize_module(base, tp_mesh, chosen)


def _per_head_norm(module: Any, tp_mesh: Any) -> None:
    """A norm applied to each rank's own heads: its parameters replicated ``DTensor``s, its input (batch,
    seq, heads, head size) a ``DTensor`` sharded on the heads, its output the local tensor again.

    The weight's gradient then comes out ``Partial`` (each rank's heads' share), and is summed over the
    ranks where the optimizer and the gradient clipping read it, as for a norm under sequence parallelism.
    """
    from torch import nn
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module

    def partition(_: str, owner: Any, mesh: Any) -> None:
        for param_name, param in list(owner.named_parameters(recurse=False)):
            replicated = DTensor.from_local(param.data, mesh, [Replicate()], run_check=False)
            owner.register_parameter(param_name, nn.Parameter(replicated, param.requires_grad))

    def heads(_: Any, inputs: tuple[Any, ...], mesh: Any) -> tuple[Any, ...]:
        return tuple(
            DTensor.from_local(x, mesh, [Shard(x.ndim - 2)], run_check=False) if x.ndim >= 2 else x
            for x in inputs
        )

    def local(_: Any, outputs: Any, mesh: Any) -> Any:
        return outputs.to_local() if isinstance(outputs, DTensor) else outputs

    distribute_module(module, tp_mesh, partition, heads, local)  # type: ignore[arg-type]  # torch types input_fn as returning None
