"""Pipeline stages of a decoder: which blocks each stage owns, and each stage's pruned copy of the model.

TorchTitan's way of splitting: every stage is a deep copy of the whole (usually meta) model from which the
blocks, embeddings, final norm and output projection the stage does not own are removed. The model keeps
its blocks in an ``nn.ModuleDict`` keyed by index and tolerates ``None`` for the removed top-level modules,
so a stage's parameter names (``layers.3.attention.wq.weight``) are those of the whole model: weight
initialisation from ``(seed, name)``, Hugging Face loading and DCP checkpoints work unchanged.

Private and torch-importing; the trainer imports it only when ``parallelism.pp`` > 1.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import nn

__all__ = ["merge_stages", "split_stage", "stage_indices", "stage_layers"]


def stage_layers(n_layers: int, num_stages: int) -> list[range]:
    """The block indices of each of ``num_stages`` stages: contiguous, as even as possible, none empty.

    When the blocks do not divide evenly, stages 1, 2 ... get one extra block each: the first stage, which
    also embeds the tokens, and the last, which also projects to the vocabulary, get one last.
    """
    if not 1 <= num_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} blocks into {num_stages} non-empty pipeline stages")
    base, extra = divmod(n_layers, num_stages)
    sizes = [base + (1 if 1 <= stage <= extra else 0) for stage in range(num_stages)]
    starts = [sum(sizes[:stage]) for stage in range(num_stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def stage_indices(pp_rank: int, pp: int, stages_per_rank: int, *, v_shape: bool = False) -> list[int]:
    """The stages pipeline rank ``pp_rank`` of ``pp`` holds, in order.

    Looped placement (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble): rank ``r`` holds ``r``,
    ``r + pp``, ``r + 2 pp`` ... V placement (ZBVZeroBubble, two stages per rank): rank ``r`` holds ``r`` and
    ``2 pp - 1 - r``, so the first and last stages share rank 0.
    """
    if v_shape:
        if stages_per_rank != 2:
            raise ValueError(f"a V-shaped schedule holds 2 stages per rank, got {stages_per_rank}")
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + round_ * pp for round_ in range(stages_per_rank)]


def split_stage(
    model: nn.Module,
    layers: range,
    *,
    first: bool,
    last: bool,
    first_modules: Sequence[str] = ("tok_embeddings",),
    last_modules: Sequence[str] = ("norm", "output"),
    blocks: str = "layers",
) -> nn.Module:
    """A deep copy of ``model`` keeping only blocks ``layers`` (of the ``ModuleDict`` ``blocks``), the
    ``first_modules`` when ``first`` and the ``last_modules`` when ``last``; the others become ``None``.

    ``model`` itself is untouched. Parameter names of what is kept are unchanged.
    """
    stage = copy.deepcopy(model)
    held = getattr(stage, blocks)
    if not isinstance(held, nn.ModuleDict):
        raise TypeError(f"{type(model).__name__}.{blocks} must be an nn.ModuleDict keyed by block index")
    keep = {str(index) for index in layers}
    unknown = keep - set(held.keys())
    if unknown:
        raise KeyError(f"{type(model).__name__}.{blocks} has no block(s) {sorted(unknown, key=int)}")
    for key in [key for key in held if key not in keep]:
        del held[key]
    for names, kept in ((first_modules, first), (last_modules, last)):
        if not kept:
            for name in names:
                setattr(stage, name, None)
    return stage


def merge_stages(stages: Sequence[nn.Module], blocks: str = "layers") -> nn.Module:
    """One module holding (not copying) every submodule of ``stages``: this rank's share of the model.

    Its parameter names are those of the whole model (blocks of every stage under one ``ModuleDict``
    ``blocks``), so the optimizer, gradient clipping and DCP checkpoints see one model per rank.
    It has no ``forward``: the pipeline schedule runs the stages.
    """
    children: dict[str, nn.Module] = {}  # in the order the stages name them: the whole model's order
    held: dict[str, nn.Module] = {}
    for stage in stages:
        for name, child in stage.named_children():
            if name == blocks:
                assert isinstance(child, nn.ModuleDict)
                held.update(child.items())
                children.setdefault(name, child)
            elif child is not None:
                children[name] = child
    merged = nn.Module()
    for name, child in children.items():
        if name == blocks:
            child = nn.ModuleDict(dict(sorted(held.items(), key=lambda item: int(item[0]))))
        merged.add_module(name, child)
    return merged
