"""Tensor parallelism beyond a model's own plan: every parameter the plan leaves plain becomes replicated.

A model's plan (``models/<name>/_parallel.py``) splits what it can with ``torch.distributed.tensor.parallel``
styles; ``replicate_remaining_params`` then makes every other parameter a replicated ``DTensor`` on the same
``tp`` mesh, which ``clip_grad_norm_`` and the foreach/fused optimizers require (they refuse a mix of plain
tensors and ``DTensor``s). The computation is unchanged: every rank already computed these modules on the
same replicated activations.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from hyper_parallel.parallel.ties import restore_ties, tie_groups

__all__ = ["replicate_remaining_params"]


class _ReplicateParallel:
    """Tensor-parallel style for a module the plan does not split: its own parameters become replicated
    ``DTensor``s, plain tensor inputs enter as replicated ``DTensor``s and outputs leave as local tensors.
    """

    @staticmethod
    def _partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor import DTensor, Replicate

        for param_name, param in list(module.named_parameters(recurse=False)):
            if not isinstance(param, DTensor):
                replicated = DTensor.from_local(param.data, mesh, [Replicate()], run_check=False)
                module.register_parameter(param_name, nn.Parameter(replicated, param.requires_grad))

    @staticmethod
    def _inputs(module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        from torch.distributed.tensor import DTensor, Replicate

        return tuple(
            DTensor.from_local(x, mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    @staticmethod
    def _outputs(module: nn.Module, outputs: Any, mesh: DeviceMesh) -> Any:
        from torch.distributed.tensor import DTensor

        return outputs.to_local() if isinstance(outputs, DTensor) else outputs

    def apply(self, module: nn.Module, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor import distribute_module

        distribute_module(module, mesh, self._partition, self._inputs, self._outputs)  # type: ignore[arg-type]


def _replicate_unit(unit: nn.Module, mesh: DeviceMesh) -> None:
    """Make every parameter of ``unit`` a replicated ``DTensor`` while its forward computes locally.

    The forward runs on the local views of the parameters (``torch.func.functional_call``), so code that
    mixes parameters with tensors it creates itself (positions, masks ...) needs no change; gradients
    flow back to the replicated parameters.
    """
    from torch.distributed.tensor import distribute_module

    distribute_module(unit, mesh, _ReplicateParallel._partition)
    forward = unit.forward
    active = False

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal active
        if active:  # functional_call calls the module again: now run the real forward
            return forward(*args, **kwargs)
        local = {name: param.to_local() for name, param in unit.named_parameters()}  # type: ignore[attr-defined]
        active = True
        try:
            return torch.func.functional_call(unit, local, args, kwargs)
        finally:
            active = False

    unit.forward = run


def replicate_remaining_params(
    model: nn.Module, tp_mesh: DeviceMesh, units: Sequence[nn.Module] = ()
) -> None:
    """Turn every parameter the tensor-parallel plan left as a plain tensor into a replicated ``DTensor``.

    Each module of ``units`` (e.g. a vision tower tensor parallelism does not split) is replicated as a
    whole; every other module owning plain parameters gets replicated inputs and local outputs. Tied
    weights stay one parameter.
    """
    from torch.distributed.tensor import DTensor

    aliases = tie_groups(model)
    for unit in units:
        _replicate_unit(unit, tp_mesh)
    owners = [
        module
        for module in model.modules()
        if any(not isinstance(p, DTensor) for p in module.parameters(recurse=False))
    ]
    style = _ReplicateParallel()
    for module in owners:
        style.apply(module, tp_mesh)
    restore_ties(model, aliases)
