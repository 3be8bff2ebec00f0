"""Runtime of ``hyper_parallel.components.optimizer``: parameter groups and torch optimizers.

Imported only from ``Optimizer.Config.build``; this module imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hyper_parallel.components.optimizer import SGD, AdamW, Optimizer

__all__ = ["build_adamw", "build_sgd", "is_no_decay", "param_groups"]

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def _is_norm(module: nn.Module) -> bool:
    # Custom norms (for example a model's own RMSNorm class) are recognised by their class name.
    return isinstance(module, _NORM_TYPES) or "norm" in type(module).__name__.lower()


def _is_embedding(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding | nn.EmbeddingBag) or "embedding" in type(module).__name__.lower()


def is_no_decay(cfg: Optimizer.Config, module: nn.Module, local_name: str, full_name: str) -> bool:
    """Whether parameter ``full_name`` (``local_name`` inside ``module``) is exempt from weight decay."""
    if cfg.no_decay_bias and (local_name == "bias" or local_name.endswith("_bias")):
        return True
    if cfg.no_decay_norm and _is_norm(module):
        return True
    if cfg.no_decay_embedding and _is_embedding(module):
        return True
    return any(part in full_name for part in cfg.no_decay_names)


def param_groups(cfg: Optimizer.Config, model: nn.Module) -> list[dict[str, Any]]:
    """Two parameter groups, ``decay`` (``cfg.weight_decay``) and ``no_decay`` (0), empty ones omitted.

    Each trainable parameter appears once, under the first module that owns it (tied weights count
    once); frozen parameters (``requires_grad=False``) are left out.
    """
    seen: set[int] = set()
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    decay_names: list[str] = []
    no_decay_names: list[str] = []
    for module_name, module in model.named_modules():
        for local_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            full_name = f"{module_name}.{local_name}" if module_name else local_name
            if is_no_decay(cfg, module, local_name, full_name):
                no_decay.append(param)
                no_decay_names.append(full_name)
            else:
                decay.append(param)
                decay_names.append(full_name)
    if not seen:
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")
    groups = []
    if decay:
        groups.append(
            {"params": decay, "weight_decay": cfg.weight_decay, "name": "decay", "param_names": decay_names}
        )
    if no_decay:
        groups.append(
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay", "param_names": no_decay_names}
        )
    return groups


def _kernel_options(implementation: str) -> dict[str, Any]:
    if implementation == "fused":
        return {"fused": True}
    if implementation == "foreach":
        return {"foreach": True}
    if implementation == "for_loop":
        return {"foreach": False}
    return {}


def build_adamw(cfg: AdamW.Config, model: nn.Module) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over ``param_groups(cfg, model)`` honouring every field of ``cfg``."""
    return torch.optim.AdamW(
        param_groups(cfg, model),
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        amsgrad=cfg.amsgrad,
        **_kernel_options(cfg.implementation),
    )


def build_sgd(cfg: SGD.Config, model: nn.Module) -> torch.optim.SGD:
    """``torch.optim.SGD`` over ``param_groups(cfg, model)`` (weight decay here is an L2 term)."""
    return torch.optim.SGD(
        param_groups(cfg, model),
        lr=cfg.lr,
        momentum=cfg.momentum,
        dampening=cfg.dampening,
        weight_decay=cfg.weight_decay,
        nesterov=cfg.nesterov,
    )
