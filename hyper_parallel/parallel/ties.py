"""Tied weights (one parameter registered under several names) across the techniques that replace parameters.

Tensor parallelism, ``to_empty`` and weight loading register new parameter objects, which would silently
untie a tied embedding and output projection. Each of them records the tie groups first and registers the
canonical parameter again under every alias afterwards. Plain module bookkeeping: no collective.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

__all__ = ["restore_ties", "tie_groups"]


def tie_groups(model: nn.Module) -> dict[str, str]:
    """Alias name -> first name of every parameter registered under several names (tied weights)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = first.setdefault(id(param), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def restore_ties(model: nn.Module, aliases: Mapping[str, str]) -> None:
    """Register the canonical parameter again under each alias whose object drifted apart."""
    for alias, canonical in aliases.items():
        param = model.get_parameter(canonical)
        owner_name, _, attr = alias.rpartition(".")
        owner = model.get_submodule(owner_name)
        if owner.get_parameter(attr) is not param:
            owner.register_parameter(attr, param)
