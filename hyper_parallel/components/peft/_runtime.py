"""Runtime of ``hyper_parallel.components.peft``: adapters added to a model, initialised, merged, exported.

Imported only from the Config's methods; this module imports torch.

An adapter is two parameters of the layer it adapts, ``lora_A`` (``rank x in``) and ``lora_B``
(``out x rank``); the layer becomes a :class:`LoRALinear`, whose forward adds their product (see there
for how). Being the layer's parameters, they belong to its block: FSDP2 shards them with it, tensor
parallelism's plan for the layer distributes them with its weight, activation checkpointing and compile
wrap them with the block. A parameter named ``<layer>.lora_A`` or ``<layer>.lora_B`` is an adapter
everywhere (``hyper_parallel.models.is_adapter``): weight loading and initialisation of the base skip
them, and ``initialize_adapters`` draws them, layout-independently like the base. The export names them
as the ``peft`` library does (``<hf layer>.lora_A.weight``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from hyper_parallel.components.peft._base import held_base, is_nf4
from hyper_parallel.models import LORA_A, LORA_B, is_adapter, parameter_seed
from hyper_parallel.parallel.names import unwrapped_name

if TYPE_CHECKING:
    from hyper_parallel.components.peft import LoRA
    from hyper_parallel.models.spec import ModelArgs

__all__ = [
    "LoRALinear",
    "adapted_layers",
    "apply_lora",
    "initialize_adapters",
    "merge_adapters",
    "merged_weights",
    "peft_adapter",
]


class _MergedLinear(torch.autograd.Function):
    """``x (W + s B A)^T`` for a frozen ``W``: one matrix product forward and one for the input's
    gradient, as the frozen layer alone would take, instead of the adapter's two thin products and a
    full-size addition each way; the adapters' gradients from the thin products ``x A^T`` and ``g B``.
    The merged weight is made again in backward rather than kept. Backward computes in the gradient's
    dtype (the forward's, under autocast) and returns each gradient in its input's dtype.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight, a, b)
        ctx.scale = scale
        return F.linear(x, torch.addmm(weight, b, a, alpha=scale))

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, torch.Tensor, torch.Tensor, None]:
        x, weight, a, b = ctx.saved_tensors
        scale, dtype = ctx.scale, grad.dtype
        w, a_, b_ = (t.to(dtype) for t in (weight, a, b))
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad @ torch.addmm(w, b_, a_, alpha=scale)).to(x.dtype)
        g = grad.reshape(-1, grad.shape[-1])
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        grad_b = (g.t() @ (x2 @ a_.t())).mul_(scale).to(b.dtype)
        grad_a = ((g @ b_).t() @ x2).mul_(scale).to(a.dtype)
        return grad_x, None, grad_a, grad_b, None


class LoRALinear(nn.Linear):
    """A frozen ``nn.Linear`` with an adapter: ``y = W x + scale * B A dropout(x)``.

    ``apply_lora`` turns a targeted layer into one (its class changes; its parameters and their names stay,
    plus ``lora_A`` and ``lora_B``). Training batches take ``_MergedLinear``: on the CPU debug models it
    makes a LoRA step 0.86x / 0.89x a full one (Llama 3 / Qwen 3.5, ``python -m bench lora --steps 8``, two
    runs each) where adding the adapter's output made it 0.91-0.95x on both. The adapter's output is added
    instead where merging cannot serve or costs more: with dropout (it applies to the adapter's input
    alone), an NF4 weight (QLoRA), and ``DTensor`` weights or adapters (tensor parallelism: a column-wise
    plan shards ``A`` and ``B`` on their rows like the weight, ``replicate_remaining_params`` replicates
    those a row-wise plan leaves alone, and ``DTensor`` computes the products); and for batches of fewer
    tokens than ``in * out / (in + out)`` or without gradients (decoding), where making the merged weight
    costs more than the thin products.
    """

    lora_scale: float
    lora_dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, weight = self.get_parameter(LORA_A), self.get_parameter(LORA_B), self.weight
        tokens = x.numel() // self.in_features
        if (
            torch.is_grad_enabled()
            and not self.lora_dropout
            and self.bias is None
            and tokens * (self.in_features + self.out_features) >= self.in_features * self.out_features
            and not any(isinstance(t, DTensor) for t in (weight, a, b, x))
            and not is_nf4(weight)
        ):
            merged: torch.Tensor = _MergedLinear.apply(x, weight, a, b, self.lora_scale)  # type: ignore[no-untyped-call]
            return merged
        adapter_input = F.dropout(x, self.lora_dropout, training=self.training) if self.lora_dropout else x
        # The scale goes onto B (out x rank), not onto the product (tokens x out): one pass less over the
        # layer's output, forward and backward.
        return super().forward(x) + F.linear(F.linear(adapter_input, a), b * self.lora_scale)


def apply_lora(cfg: LoRA.Config, model: nn.Module, args: ModelArgs) -> nn.Module:
    """Freeze every parameter of ``model`` (built from ``args``), then add an adapter to each targeted
    linear layer of its blocks (``ModelArgs.block_prefix``).

    Call it before the model is parallelized. The adapters are created on the device of the layer's
    weight (``meta`` when the model is); ``initialize_adapters`` gives them their values.
    """
    for param in model.parameters():
        param.requires_grad_(False)
    targets = cfg.layer_names(args)
    in_block = re.compile(rf"^{re.escape(args.block_prefix())}\d+\.")
    found: set[str] = set()
    for name, module in list(model.named_modules()):
        last = name.rsplit(".", 1)[-1]
        if last not in targets or not isinstance(module, nn.Linear) or not in_block.match(name):
            continue
        found.add(last)
        weight = module.weight
        for part, shape in (
            (LORA_A, (cfg.rank, module.in_features)),
            (LORA_B, (module.out_features, cfg.rank)),
        ):
            matrix = torch.empty(shape, device=weight.device, dtype=weight.dtype)
            module.register_parameter(part, nn.Parameter(matrix))
        module.__class__ = LoRALinear
        adapted = cast(LoRALinear, module)
        adapted.lora_scale, adapted.lora_dropout = cfg.scale, cfg.dropout
    missing = [t for t, layers in cfg.target_layers(args).items() if not layers & found]
    if missing or not found:
        raise ValueError(
            f"peft.targets: {', '.join(repr(t) for t in missing or sorted(targets))} name no linear layer "
            "of the model's blocks"
        )
    return model


def adapted_layers(names: Iterable[str]) -> list[str]:
    """The layers (our names, without ``.weight``) that ``names`` hold adapters of, in order."""
    layers: dict[str, None] = {}
    for name in names:
        clean = unwrapped_name(name)
        if is_adapter(clean):
            layers[clean.rsplit(".", 1)[0]] = None
    return list(layers)


def initialize_adapters(model: nn.Module, *, seed: int) -> None:
    """Draw every adapter: ``A`` uniform in ``+-1/sqrt(in)`` (``nn.Linear``'s default), ``B`` zero.

    Called once the model is parallelized and its base weights are in place; it also freezes the base
    once more (see the loop). A model without adapters is left as it is.

    Each full ``A`` comes from a generator seeded with ``parameter_seed(seed, name)`` and a rank keeps
    its shard, so every layout starts from the same adapters (see ``models.initialize``).
    """
    from torch.distributed.tensor import distribute_tensor

    names = [name for name, _ in model.named_parameters()]
    if not any(is_adapter(name) for name in names):
        return
    generator = torch.Generator()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not is_adapter(name):
                # Frozen again: a parallel plan may have re-registered it as a new, trainable
                # parameter (``SequenceParallel`` does), and the optimizer is built after this.
                param.requires_grad_(False)
                continue
            clean = unwrapped_name(name)
            full = torch.zeros(param.shape, dtype=torch.float32)
            if clean.endswith(LORA_A):
                bound = 1.0 / float(param.shape[1]) ** 0.5
                generator.manual_seed(parameter_seed(seed, clean))
                full.uniform_(-bound, bound, generator=generator)
            full = full.to(param.dtype)
            if isinstance(param, DTensor):
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
            else:
                param.copy_(full.to(param.device))


def merge_adapters(weights: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """``weights`` (full tensors, our names) with each adapted ``W`` replaced by ``W + scale B A``.

    The adapters themselves are left out: what remains is the base model's state dict. Computed in
    float32 and cast back to ``W``'s dtype.
    """
    merged = {name: tensor for name, tensor in weights.items() if not is_adapter(name)}
    for layer in adapted_layers(weights):
        weight = merged[f"{layer}.weight"]
        a = weights[f"{layer}.{LORA_A}"].float()
        b = weights[f"{layer}.{LORA_B}"].float()
        merged[f"{layer}.weight"] = (weight.float() + scale * (b @ a)).to(weight.dtype)
    return merged


def merged_weights(
    cfg: LoRA.Config,
    weights: Mapping[str, torch.Tensor],
    args: ModelArgs,
    compute_dtype: str,
    rebuild_base: Callable[[], Mapping[str, torch.Tensor]] | None,
) -> dict[str, torch.Tensor]:
    """``weights`` merged (``merge_adapters``), after the base ``rebuild_base`` gives (when the checkpoint
    left it out) is held as the run held it (``_base.held_base``); all in the adapters' dtype."""
    if not any(is_adapter(name) for name in weights):
        return dict(weights)
    if rebuild_base is not None:
        layers = set(adapted_layers(weights))
        base = held_base(cfg, rebuild_base(), layers.__contains__, args, compute_dtype)
        weights = {**base, **weights}
    dtype = next(t.dtype for name, t in weights.items() if is_adapter(name))  # a bf16 base: in float32
    cast_ = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    return merge_adapters(cast_, cfg.scale)


def peft_adapter(
    weights: Mapping[str, torch.Tensor], cfg: LoRA.Config, to_hf: Any
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The adapters of ``weights`` in the ``peft`` library's layout: tensors and ``adapter_config.json``.

    ``to_hf`` is the model's state-dict adapter's, which renames our weights and reorders or concatenates
    their rows (never their columns). ``B`` goes through it as its layer's weight would; ``A`` is
    shared by the rows. A Hugging Face layer fused from several of ours (Qwen 3.5's ``in_proj_qkv``)
    gets one adapter of rank ``n * rank``: the ``A``s stacked, the ``B``s block-diagonal, with ``alpha``
    scaled alike so ``alpha / rank`` is unchanged (``rank_pattern`` / ``alpha_pattern``).
    Keys are ``base_model.model.<hf layer>.lora_A.weight`` / ``.lora_B.weight``.
    """
    layers = adapted_layers(weights)
    by_block: dict[str, list[str]] = {}
    for layer in layers:
        block = re.search(r"(^|\.)layers\.(\d+)\.", layer)
        by_block.setdefault(block.group(2) if block else layer, []).append(layer)
    tensors: dict[str, torch.Tensor] = {}
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    modules: list[str] = []
    r = cfg.rank
    for block_layers in by_block.values():
        count = len(block_layers)
        padded: dict[str, torch.Tensor] = {}
        marks: dict[str, torch.Tensor] = {}
        for index, layer in enumerate(block_layers):
            b = weights[f"{layer}.{LORA_B}"]
            wide = torch.zeros(b.shape[0], r * count, dtype=b.dtype)
            wide[:, index * r : (index + 1) * r] = b
            mark = torch.zeros(b.shape[0], count, dtype=torch.float32)
            mark[:, index] = 1.0
            padded[f"{layer}.weight"] = wide
            marks[f"{layer}.weight"] = mark
        hf_b = to_hf(padded)
        hf_marks = to_hf(marks)
        for hf_name, wide in hf_b.items():
            module = hf_name.removesuffix(".weight")
            used = [i for i in range(count) if bool(hf_marks[hf_name][:, i].any())]
            columns = [c for i in used for c in range(i * r, (i + 1) * r)]
            key = f"base_model.model.{module}"
            tensors[f"{key}.{LORA_B}.weight"] = wide[:, columns].contiguous()
            tensors[f"{key}.{LORA_A}.weight"] = torch.cat(
                [weights[f"{block_layers[i]}.{LORA_A}"] for i in used], dim=0
            ).contiguous()
            modules.append(module)
            if len(used) > 1:
                rank_pattern[module] = r * len(used)
                alpha_pattern[module] = cfg.alpha * len(used)
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(modules),
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": None,
    }
    return tensors, config
