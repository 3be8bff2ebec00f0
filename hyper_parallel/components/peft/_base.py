"""How a LoRA run stores its frozen base (``peft.base_dtype``): as built (float32), in bfloat16, or NF4.

What each frozen tensor becomes is not decided here: ``LoRA.Config.storage`` says it for each part
(``storage.Part``), and :func:`store_base` (the run) and :func:`held_base` (the export's rebuilt base) do
what it says. ``store_base`` runs once the model is parallelized, its weights are in place and its adapters
drawn (``LoRA.Config.after_load``).

``bfloat16`` casts every frozen parameter (a ``DTensor`` its local shard, whatever the layout): the run
computes in bfloat16, so FSDP2 would all-gather that cast and autocast make it at each use; it is half of
float32's bytes. ``nf4`` (QLoRA) makes each adapted ``nn.Linear``'s ``weight`` a frozen ``NF4Tensor``
(torchao 0.18's ``torchao.quantization.NF4Tensor``) quantized from the whole float32 weight, so every
layout holds the same 4-bit codes and scales. ``F.linear`` on it dequantizes to the input's dtype
(torchao's ``LinearNF4``), so compute stays in the training dtype and the input gradient flows through it;
the weight gets none. ``quantize_embeddings`` adds the token embedding and the output projection
(:class:`NF4Embedding` looks rows up in the dequantized table; a subclass of ``nn.Embedding`` keeps its own
forward around that lookup, as Gemma's scaled embeddings do). The rest of the frozen base (norms, the
embeddings otherwise, Gated DeltaNet's small tensors) is stored in the compute dtype,
``training.mixed_precision_param``: it is what every layout computes with, and half of float32's bytes.

Under FSDP2 a weight is a ``DTensor`` sharded on its rows over ``dp_shard``: it is gathered once, quantized
whole, cut into the same row chunks (``NF4Tensor`` splits its codes and scales with them), and the chunk
becomes the ``DTensor``'s local tensor; the float32 shard's storage is freed. FSDP2 re-reads its
parameters at its lazy initialisation (the first forward) and all-gathers NF4 through the tensor's
``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``. Tensor, pipeline, context and expert parallelism,
``dp_replicate`` and CPU offload are refused before anything is built (``LoRA.Config.layout_issues``,
which ``trainer.rules`` runs): in torch 2.13
FSDP2 without sharding (``replicate``, or a mesh of one rank) copies only the first of an extension's
all-gather inputs, and torchao's all-gather takes a one-dimensional mesh. The trainer applies no FSDP2
on one process, so QLoRA runs there on plain NF4 parameters.

Nothing of an NF4 base is saved: a checkpoint of such a run leaves the frozen parameters out (the base is
built again, from ``model.weights_path`` or the seed, and quantized the same way), and the export rebuilds
the base, quantizes and dequantizes the NF4 weights as training saw them, then merges the adapters. A
bfloat16 base is saved as it is held when the run cannot build it again (no ``model.weights_path``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from hyper_parallel._dtypes import torch_dtype
from hyper_parallel.components.peft.storage import TORCHAO_VERSION, part_of
from hyper_parallel.models import LORA_A

if TYPE_CHECKING:
    from hyper_parallel.components.peft import LoRA
    from hyper_parallel.models.spec import ModelArgs

__all__ = ["NF4Embedding", "held_base", "is_nf4", "nf4_module", "store_base"]

#: torchao's public quantization module: it exports ``NF4Tensor`` and ``to_nf4``.
_TORCHAO = "torchao.quantization"


def nf4_module() -> ModuleType:
    """``torchao.quantization`` (``to_nf4``, ``NF4Tensor``), imported without the warnings its optional
    kernels log on the way.

    ``ImportError`` naming the extra to install when torchao is missing.
    """
    import importlib

    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # "Failed to load _C_mxfp8..." (CUDA kernels), an Enum registration notice
        logger.setLevel(logging.ERROR)
    try:
        return importlib.import_module(_TORCHAO)
    except ImportError as exc:
        raise ImportError(
            f"peft.base_dtype 'nf4' needs torchao ({exc}); install it with pip install "
            f"'hyper-parallel[qlora]' (torchao=={TORCHAO_VERSION})"
        ) from None
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def is_nf4(tensor: Any) -> bool:
    """Whether ``tensor`` (or a ``DTensor``'s local tensor) is torchao's ``NF4Tensor``.

    Never imports torchao: until its NF4 module is loaded no such tensor exists, so a run without QLoRA
    (or without torchao installed) answers False without it.
    """
    nf4_tensor = getattr(sys.modules.get(_TORCHAO), "NF4Tensor", None)
    if nf4_tensor is None:
        return False
    if isinstance(tensor, DTensor):
        with torch.no_grad():  # the local tensor itself, no autograd view
            tensor = tensor.to_local()
    return isinstance(tensor, nf4_tensor)


class NF4Embedding(nn.Embedding):
    """An ``nn.Embedding`` whose frozen table is an NF4 tensor (``quantize_embeddings``).

    torchao's tensor has no row lookup, so each batch looks its rows up in the table dequantized to
    ``compute_dtype``, as a linear layer's NF4 weight is dequantized for each product; the whole table
    exists in that dtype only for the call.
    """

    compute_dtype: torch.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weight.get_original_weight().to(self.compute_dtype)  # type: ignore[attr-defined]
        return F.embedding(ids, table, self.padding_idx, self.max_norm, self.norm_type)


#: A subclass of ``nn.Embedding`` -> the class whose lookup is :class:`NF4Embedding`'s (made once each).
_NF4_CLASSES: dict[type[nn.Embedding], type[NF4Embedding]] = {nn.Embedding: NF4Embedding}


def _nf4_class(cls: type[nn.Embedding]) -> type[NF4Embedding]:
    """``cls`` looking its rows up in the dequantized table: ``NF4Embedding`` for ``nn.Embedding``, else
    ``cls`` over ``NF4Embedding``, so that what a subclass adds around ``nn.Embedding``'s lookup (Gemma's
    ``* embed_scale``, which its ``forward`` applies to ``super().forward``) stays in its forward."""
    if cls not in _NF4_CLASSES:
        _NF4_CLASSES[cls] = type(f"NF4{cls.__name__}", (cls, NF4Embedding), {})
    return _NF4_CLASSES[cls]


def store_base(model: nn.Module, cfg: LoRA.Config, args: ModelArgs, compute_dtype: str) -> None:
    """Store ``model``'s frozen base as ``cfg.storage`` says of each part (``compute_dtype``: the run's).

    A frozen floating parameter held in a dtype is cast to it: it never trains, so a float32 copy would
    only be cast at each use (FSDP2 all-gathers it so, autocast casts it so). One held as ``'nf4'``
    (QLoRA's adapted weights, with ``quantize_embeddings`` the embeddings) becomes a frozen NF4 tensor, and
    an ``nn.Embedding`` holding one an :class:`NF4Embedding` (a subclass: that class over it). A tied
    tensor is replaced once and stays tied. Call it after the weights are loaded and before the first
    forward (FSDP2 re-reads its parameters then). A weight already NF4 is left as it is.
    """
    embeddings = args.embedding_layers()
    held: dict[int, nn.Parameter] = {}  # id of a frozen parameter -> what the model holds instead
    for name, module in list(model.named_modules()):
        own = dict(module.named_parameters(recurse=False, remove_duplicate=False))
        for key, param in own.items():
            if param.requires_grad:
                continue
            if id(param) not in held:
                part = part_of(name, key, LORA_A in own, embeddings)
                held[id(param)] = _held(f"{name}.{key}", param, cfg.storage(part, compute_dtype))
            if held[id(param)] is not param:
                module.register_parameter(key, held[id(param)])
        if isinstance(module, nn.Embedding) and is_nf4(module.weight):
            module.__class__ = _nf4_class(type(module))
            cast(NF4Embedding, module).compute_dtype = torch_dtype(compute_dtype)


def _held(name: str, param: nn.Parameter, storage: str) -> nn.Parameter:
    """What the model holds for frozen ``param`` stored as ``storage``: its NF4 tensor, or ``param`` in
    that dtype; ``param`` itself when it is NF4 already, not floating, or in that dtype."""
    if is_nf4(param) or not param.is_floating_point():
        return param
    if storage == "nf4":
        return nn.Parameter(_nf4(name, param, nf4_module().to_nf4), requires_grad=False)
    dtype = torch_dtype(storage)
    return param if param.dtype == dtype else nn.Parameter(_cast(param, dtype), requires_grad=False)


def _nf4(name: str, weight: torch.Tensor, to_nf4: Any) -> torch.Tensor:
    """``weight`` as NF4, quantized whole: a ``DTensor`` sharded on its rows (FSDP2) is gathered, quantized
    and cut into the same row chunks (``NF4Tensor`` splits its codes and scales with them)."""
    from torch.distributed.tensor import DTensor, Shard

    with torch.no_grad():
        if not isinstance(weight, DTensor):
            return cast(torch.Tensor, to_nf4(weight.detach().contiguous()))
        mesh, placements = weight.device_mesh, weight.placements
        if mesh.ndim != 1 or placements != (Shard(0),):
            raise ValueError(
                f"{name}: NF4 needs a weight sharded on its rows over one mesh dimension "
                f"(FSDP2 over dp_shard), got {placements} on {mesh}"
            )
        whole = to_nf4(weight.full_tensor().contiguous())
        return _with_local(weight, torch.chunk(whole, mesh.size(), dim=0)[mesh.get_local_rank()])


def _cast(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``param`` in ``dtype``; a ``DTensor`` casts its local shard."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        if isinstance(param, DTensor):
            return _with_local(param, param.to_local().to(dtype))
        return param.detach().to(dtype)


def _with_local(weight: Any, local: torch.Tensor) -> torch.Tensor:
    """A ``DTensor`` like ``weight`` whose local tensor is ``local``; ``weight``'s local memory goes."""
    from torch.distributed.tensor import DTensor

    mesh, placements = weight.device_mesh, weight.placements
    new: torch.Tensor = DTensor.from_local(
        local, mesh, placements, run_check=False, shape=weight.shape, stride=weight.stride()
    )
    # Freed now, not when FSDP2 re-reads its parameters (at the first forward). That re-read compares the
    # old shard's storage with the new one's, which an NF4 tensor has none of: an emptied storage (data
    # pointer 0) skips the comparison.
    weight.to_local().untyped_storage().resize_(0)
    return new


def held_base(
    cfg: LoRA.Config,
    base: Mapping[str, torch.Tensor],
    adapted: Callable[[str], bool],
    args: ModelArgs,
    compute_dtype: str,
) -> dict[str, torch.Tensor]:
    """``base`` (full float tensors, our names) as a run of ``cfg`` held it (``adapted``: whether a layer
    has adapters): each tensor ``cfg.storage`` holds as ``'nf4'`` replaced by what its NF4 quantization
    gives back, in the compute dtype the run dequantized it to; every other one in its dtype."""
    embeddings = args.embedding_layers()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.items():
        module, _, key = name.rpartition(".")
        storage = cfg.storage(part_of(module, key, adapted(module), embeddings), compute_dtype)
        if not tensor.is_floating_point():
            out[name] = tensor
        elif storage == "nf4":
            quantized = nf4_module().to_nf4(tensor.float().contiguous())
            out[name] = quantized.get_original_weight().to(torch_dtype(compute_dtype))
        else:
            out[name] = tensor.to(torch_dtype(storage))
    return out
