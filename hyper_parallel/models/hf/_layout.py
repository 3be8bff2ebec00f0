"""The model transformers builds from a ``config.json``, built on ``meta``, and what it says about itself.

One place builds the module (``build_causal_lm``: ``AutoModelForCausalLM.from_config`` under
``torch.device("meta")``, float32, never remote code) and finds its decoder layers generically (the
model's ``_no_split_modules`` classes, else the longest ``ModuleList``); ``layout_of`` caches what the
arguments answer from it (parameter names and shapes, where the layers are, their linear layers, the
embeddings), so ``--dry-run``, LoRA and the preflight read the very model the trainer trains.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, NamedTuple

import torch
from torch import nn

from hyper_parallel.models.hf._runtime import PREFIX

__all__ = ["Layout", "build_causal_lm", "decoder_layers", "hf_config", "layout_of"]


class Layout(NamedTuple):
    """What the built model says about itself (our names: ``PREFIX`` + transformers')."""

    shapes: dict[str, tuple[int, ...]]
    block_prefix: str
    block_linears: frozenset[str]
    embedding: str
    output: str
    tied: bool
    #: The value each vector parameter (norm weights) is built with, when it is not 1 (ours names).
    vector_defaults: dict[str, float]
    #: The model's ``base_model_tp_plan``: module name pattern (from ``base_prefix``) -> transformers' style.
    tp_plan: dict[str, str]
    #: Where the base model (whose names the plan uses) is: ``causal_lm.model.`` for most models.
    base_prefix: str


def hf_config(config_json: str, attn_implementation: str) -> Any:
    """transformers' config object of ``config_json`` (its class from ``model_type``)."""
    from transformers import AutoConfig

    fields = json.loads(config_json)
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = attn_implementation
    return config


def build_causal_lm(config_json: str, attn_implementation: str, device: str | torch.device) -> nn.Module:
    """``AutoModelForCausalLM.from_config`` of ``config_json`` on ``device`` in float32 (``meta``: nothing
    allocated; elsewhere transformers initialises the weights)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(config_json, attn_implementation)
    with torch.device(device):
        model: nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32, attn_implementation=attn_implementation
        )
    return model


def decoder_layers(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """The name of the module list holding the decoder layers, and the layers.

    The list whose members are of the model's ``_no_split_modules`` classes (what transformers itself
    never splits across devices), else the longest ``nn.ModuleList`` of the model.
    """
    classes = set(getattr(model, "_no_split_modules", None) or ())
    lists = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.ModuleList)]
    marked = [(n, m) for n, m in lists if len(m) and all(type(layer).__name__ in classes for layer in m)]
    found = marked or [max(lists, key=lambda item: len(item[1]))] if lists else []
    if not found:
        raise ValueError(f"{type(model).__name__} has no list of decoder layers")
    name, layers = found[0]
    return name, list(layers)


def _built_value(owner: nn.Module, last: str, size: int) -> float:
    """The value ``owner``'s class builds its vector ``last`` of ``size`` with (a norm's weight: ones,
    or zeros for the ``1 + weight`` norms of Gemma); 1.0 when the class cannot be built from a size."""
    try:
        with torch.device("cpu"), torch.no_grad():
            built = getattr(type(owner)(size), last).detach()
    except Exception:  # a module built from more than a size: transformers' default, ones
        return 1.0
    if not isinstance(built, torch.Tensor) or built.numel() != size or built.is_meta:
        return 1.0
    first = float(built.reshape(-1)[0])
    return first if bool((built == first).all()) else 1.0


def _name_of(model: nn.Module, module: nn.Module | None) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return f"{PREFIX}{name}"
    return ""


@lru_cache(maxsize=8)
def layout_of(config_json: str, attn_implementation: str) -> Layout:
    """The layout of the model ``config_json`` builds (cached: built once on ``meta`` per config)."""
    model = build_causal_lm(config_json, attn_implementation, "meta")
    name, layers = decoder_layers(model)
    linears = {
        sub.rsplit(".", 1)[-1]
        for layer in layers
        for sub, module in layer.named_modules()
        if isinstance(module, nn.Linear)
    }
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    embedding = get_input() if callable(get_input) else None
    output = get_output() if callable(get_output) else None
    tied = (
        embedding is not None
        and output is not None
        and getattr(embedding, "weight", None) is getattr(output, "weight", None)
    )
    defaults: dict[str, float] = {}
    built: dict[tuple[type, str, int], float] = {}
    for module_name, module in model.named_modules():
        for last, param in module.named_parameters(recurse=False):
            if param.dim() != 1 or last.endswith("bias"):
                continue
            key = (type(module), last, param.shape[0])
            if key not in built:
                built[key] = _built_value(module, last, param.shape[0])
            if built[key] != 1.0:
                defaults[f"{PREFIX}{module_name}.{last}"] = built[key]
    base = getattr(model, "base_model", model)
    plan = getattr(model.config, "base_model_tp_plan", None) or {}  # type: ignore[union-attr]
    return Layout(
        vector_defaults=defaults,
        tp_plan={str(k): str(v) for k, v in plan.items()},
        base_prefix=_name_of(model, base) + "." if base is not model else PREFIX,
        shapes={PREFIX + n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)},
        block_prefix=f"{PREFIX}{name}.",
        block_linears=frozenset(linears),
        embedding=_name_of(model, embedding),
        output=_name_of(model, output),
        tied=bool(tied),
    )
