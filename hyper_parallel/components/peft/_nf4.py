"""QLoRA's frozen base: the weights of the adapted layers as torchao's NF4 tensors (``base_dtype: nf4``).

``quantize_base`` runs once the model is parallelized, its weights are in place and its adapters drawn:
each adapted ``nn.Linear``'s ``weight`` becomes a frozen ``NF4Tensor`` (torchao 0.18:
``torchao.quantization.quantize_.workflows.nf4.nf4_tensor``) quantized from the whole float32 weight, so
every layout holds the same 4-bit codes and scales. ``F.linear`` on it dequantizes to the input's dtype
(torchao's ``LinearNF4``), so compute stays in the training dtype and the input gradient flows through it;
the weight gets none.

Under FSDP2 a weight is a ``DTensor`` sharded on its rows over ``dp_shard``: it is gathered once, quantized
whole, cut into the same row chunks (``NF4Tensor`` splits its codes and scales with them), and the chunk
becomes the ``DTensor``'s local tensor; the float32 shard's storage is freed. FSDP2 re-reads its
parameters at its lazy initialisation (the first forward) and all-gathers NF4 through the tensor's
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``. Tensor, pipeline, context and expert parallelism,
``dp_replicate`` and CPU offload are refused before anything is built (``trainer.rules``): in torch 2.13
FSDP2 without sharding (``replicate``, or a mesh of one rank) copies only the first of an extension's
all-gather inputs, and torchao's all-gather takes a one-dimensional mesh. The trainer applies no FSDP2
on one process, so QLoRA runs there on plain NF4 parameters.

Nothing of this is saved: a checkpoint of such a run leaves the frozen parameters out (the base is built
again, from ``model.weights_path`` or the seed, and quantized the same way), and the export rebuilds the
base, quantizes and dequantizes the adapted weights as training saw them, then merges the adapters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from hyper_parallel.components.peft import TORCHAO_VERSION

__all__ = ["is_nf4", "nf4_module", "quantize_base", "quantized_weights"]

_NF4_PATH = "torchao.quantization.quantize_.workflows.nf4.nf4_tensor"


def nf4_module() -> ModuleType:
    """torchao's NF4 module, imported without the warnings its optional kernels log on the way.

    ``ImportError`` naming the extra to install when torchao is missing.
    """
    import importlib

    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # "Failed to load _C_mxfp8..." (CUDA kernels), an Enum registration notice
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module(_NF4_PATH)
    except ImportError as exc:
        raise ImportError(
            f"peft.base_dtype 'nf4' needs torchao ({exc}); install it with pip install "
            f"'hyper-parallel[qlora]' (torchao=={TORCHAO_VERSION})"
        ) from None
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def is_nf4(tensor: Any) -> bool:
    """Whether ``tensor`` (or a ``DTensor``'s local tensor) is an NF4 tensor (torchao is not imported)."""
    local = getattr(tensor, "_local_tensor", tensor)
    return type(local).__name__ == "NF4Tensor"


def _adapted_linears(model: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and "lora_A" in module._parameters:
            yield name, module


def quantize_base(model: nn.Module) -> int:
    """Replace the weight of every adapted linear layer of ``model`` by a frozen NF4 tensor; returns how many.

    Call it after the weights are loaded and before the first forward (FSDP2 re-reads its parameters
    then). A weight already NF4 is left as it is.
    """
    from torch.distributed.tensor import DTensor, Shard

    to_nf4 = nf4_module().to_nf4
    count = 0
    for name, layer in _adapted_linears(model):
        weight = layer.weight
        if is_nf4(weight):
            continue
        with torch.no_grad():
            if isinstance(weight, DTensor):
                mesh, placements = weight.device_mesh, weight.placements
                if mesh.ndim != 1 or placements != (Shard(0),):
                    raise ValueError(
                        f"{name}.weight: NF4 needs a weight sharded on its rows over one mesh dimension "
                        f"(FSDP2 over dp_shard), got {placements} on {mesh}"
                    )
                whole = to_nf4(weight.full_tensor().contiguous())
                chunk = torch.chunk(whole, mesh.size(), dim=0)[mesh.get_local_rank()]
                quantized: torch.Tensor = DTensor.from_local(
                    chunk, mesh, placements, run_check=False, shape=weight.shape, stride=weight.stride()
                )
                # The float32 shard's memory goes. FSDP2's re-read of its parameters compares the old
                # shard's storage with the new one's, which an NF4 tensor has none of: an emptied
                # storage (data pointer 0) skips that comparison.
                weight._local_tensor.untyped_storage().resize_(0)
            else:
                quantized = to_nf4(weight.detach().contiguous())
        layer.weight = nn.Parameter(quantized, requires_grad=False)
        count += 1
    return count


def quantized_weights(weights: Mapping[str, torch.Tensor], layers: list[str]) -> dict[str, torch.Tensor]:
    """``weights`` (full float tensors, our names) with each of ``layers``' ``.weight`` replaced by what
    its NF4 quantization gives back (float32): the base a QLoRA run trained against."""
    to_nf4 = nf4_module().to_nf4
    out = dict(weights)
    for layer in layers:
        weight = weights[f"{layer}.weight"]
        out[f"{layer}.weight"] = to_nf4(weight.float().contiguous()).get_original_weight().to(weight.dtype)
    return out
