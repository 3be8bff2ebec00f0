"""Putting weights into a built (and usually parallelized) model: initialisation and loading.

The trainer's order is ``spec.build_model_fn(args, device="meta")`` -> ``spec.parallelize_fn(...)`` ->
``materialize(model, spec, device=..., seed=...)`` (random weights) or ``load_pretrained(model, spec)``
(a Hugging Face safetensors folder). Both work on plain, meta, FSDP2 and tensor-parallel models and keep
tied weights tied. ``load_weights`` is the one-process loader behind the models' ``load_weights`` hooks.

Private and torch-importing: reached through the lazy names of ``hyper_parallel.models`` and the models'
hooks, so resolving a config never loads torch. The device mesh comes from
``hyper_parallel.parallel.parallel_dims.ParallelDims.build_mesh``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from hyper_parallel.models._names import is_adapter, parameter_seed
from hyper_parallel.parallel.ties import restore_ties, tie_groups

if TYPE_CHECKING:
    from hyper_parallel.models.spec import ModelSpec

__all__ = [
    "StateDictAdapter",
    "initialize",
    "load_pretrained",
    "load_weights",
    "materialize",
    "read_safetensors_folder",
]


class StateDictAdapter(Protocol):
    """What ``load_weights`` needs from a model's state-dict adapter."""

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...


def read_safetensors_folder(weights_path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in a local folder (sharded or not), on the CPU.

    Each file's header is checked before its tensors are read (``_weights_check.read_header``: bounded,
    offsets inside the file), so a hostile file is refused before anything is allocated for it.
    """
    from safetensors.torch import load_file

    from hyper_parallel.models._weights_check import read_header, weight_files

    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(Path(weights_path)):
        read_header(file)
        loaded = load_file(str(file), device="cpu")
        _refuse_non_finite(file, loaded)
        tensors.update(loaded)
    return tensors


def _refuse_non_finite(file: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """An ``InputFileError`` (``FILE: tensor NAME holds nan``, exit status 2) naming the first tensor of
    ``file`` holding NaN or infinite values; training from it could only produce NaN."""
    from hyper_parallel.errors import InputFileError

    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
            continue
        kinds = [
            kind for kind, found in (("nan", tensor.isnan()), ("inf", tensor.isinf())) if bool(found.any())
        ]
        message = f"tensor {name!r} holds {' and '.join(kinds)}; these weights cannot be trained from"
        raise InputFileError.at(file, message)


def _has_dtensor(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def load_weights(model: nn.Module, weights_path: str | Path, adapter: StateDictAdapter) -> nn.Module:
    """Load a Hugging Face safetensors checkpoint from ``weights_path`` into ``model`` via ``adapter``.

    Works on a plain module (CPU, or meta: parameters are then assigned) and on a parallelized one
    (DTensor parameters receive their shard of the full tensors). Missing or unexpected names raise.
    """
    state_dict = adapter.from_hf(read_safetensors_folder(weights_path))
    if _has_dtensor(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=True))
        return model
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta:
        dtypes = {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
        state_dict = {k: v.to(dtypes[k]) if k in dtypes else v for k, v in state_dict.items()}
    model.load_state_dict(state_dict, strict=True, assign=on_meta)
    if on_meta:
        tie = getattr(model, "tie_weights", None)
        if callable(tie):
            tie()
    return model


def _to_empty(model: nn.Module, device: str | torch.device) -> None:
    """``model.to_empty(device=...)`` that keeps tied parameters tied (plain ``to_empty`` unties them)."""
    aliases = tie_groups(model)
    model.to_empty(device=device)
    restore_ties(model, aliases)


def initialize(model: nn.Module, spec: ModelSpec, *, seed: int) -> nn.Module:
    """Fill every parameter of ``model`` in place with the same values whatever its layout.

    Each parameter's full tensor is generated on the CPU by ``spec.init_fn`` from a generator seeded with
    ``parameter_seed(seed, name)``; a rank keeps its shard of it (``DTensor``: the slice its placements
    select, no communication). A model on one process, under FSDP2 or under tensor parallelism thus holds
    the same weights for the same seed. Specs without ``init_fn`` fall back to ``model.init_weights()``
    after ``torch.manual_seed(seed)`` (correct on one process, not layout-independent).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    if spec.init_fn is None:
        torch.manual_seed(seed)
        init_weights = getattr(model, "init_weights", None)
        if not callable(init_weights):
            raise TypeError(f"{type(model).__name__} has no init_weights() and the spec no init_fn")
        init_weights()
        return model
    generator = torch.Generator()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter(name):  # drawn by ``peft``'s runtime, not the model's init_fn
                continue
            full = torch.empty(param.shape, dtype=torch.float32)
            spec.init_fn(spec.args, name, full, generator.manual_seed(parameter_seed(seed, name)))
            full = full.to(param.dtype)
            if isinstance(param, DTensor):
                param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
            else:
                param.copy_(full)
    return model


def materialize(model: nn.Module, spec: ModelSpec, *, device: str | torch.device, seed: int) -> nn.Module:
    """Allocate a (meta) model's parameters on ``device`` and initialise them layout-independently.

    Call it after ``spec.parallelize_fn`` so each rank allocates only its shards. Tied weights stay tied.
    See ``initialize`` for the values. Returns ``model``.
    """
    _to_empty(model, device)
    return initialize(model, spec, seed=seed)


def _process_group_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def load_pretrained(
    model: nn.Module,
    spec: ModelSpec,
    *,
    device: str | torch.device | None = None,
    expected: Mapping[str, torch.dtype] | None = None,
) -> nn.Module:
    """Load the Hugging Face safetensors folder ``spec.weights_path`` into ``model`` via the adapter.

    ``model`` may be plain, on meta (allocated first on ``device``, default CPU), or parallelized (FSDP2
    and/or tensor parallel ``DTensor`` parameters, possibly on meta). With an initialised process group of
    more than one rank, only rank 0 reads the files; the others receive their shards by broadcast. The
    files' headers are checked against the model first (``check_tensors``: an ``InputFileError`` for a
    tensor the model lacks or of another shape, before any tensor is read), and names the adapter produces
    must match the model's exactly (``KeyError`` otherwise); tied weights stay tied.

    ``expected`` (name -> dtype of every parameter of the whole model) makes ``model`` one pipeline stage:
    the files are checked against the whole model, rank 0 sends every tensor, and each stage keeps those
    it holds.
    """
    from torch.distributed.tensor import DTensor

    from hyper_parallel.models._weights_check import check_tensors

    if spec.weights_path is None:
        raise ValueError(f"model.weights_path is not set for {spec.name} {spec.flavor}: nothing to load")
    if any(p.is_meta for p in model.parameters()):
        _to_empty(model, device if device is not None else "cpu")
    aliases = tie_groups(model)
    distributed = _process_group_size() > 1
    import torch.distributed as dist

    state_dict: dict[str, Any] = {}
    problem: Exception | None = None
    if not distributed or dist.get_rank() == 0:
        dtypes = (
            dict(expected)
            if expected is not None
            else {name: p.dtype for name, p in model.named_parameters(remove_duplicate=False)}
        )
        dtypes = {name: dtype for name, dtype in dtypes.items() if not is_adapter(name)}
        try:
            check_tensors(spec)  # headers against the model before any tensor is read: extras refused
            adapter = spec.state_dict_adapter(spec.args, spec.weights_path)
            loaded = adapter.from_hf(read_safetensors_folder(spec.weights_path))
            _check_names(loaded, dtypes)
            _check_kinds(loaded, dtypes)
        except Exception as exc:
            if not distributed:
                raise
            problem = exc
        else:
            state_dict = {k: v.to(dtypes[k]) for k, v in loaded.items()}
    if distributed:  # the other ranks would wait for the broadcast of weights rank 0 refused
        shared: list[Exception | None] = [problem]
        dist.broadcast_object_list(shared, src=0)
        if shared[0] is not None:
            raise shared[0]
    has_dtensor = any(isinstance(p, DTensor) for p in model.parameters())
    # A model with adapters (``peft``) loads its base: the adapters are drawn afterwards.
    adapted = any(is_adapter(name) for name, _ in model.named_parameters())
    if distributed or has_dtensor:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # A stage holds a subset of the names checked above: rank 0's dict has the other stages' too.
        options = StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=distributed, strict=expected is None and not adapted
        )
        set_model_state_dict(model, state_dict, options=options)
    else:
        with torch.no_grad():
            missing, unexpected = model.load_state_dict(state_dict, strict=False)
            wrong = [name for name in missing if not is_adapter(name)] + list(unexpected)
            if wrong:
                raise KeyError(f"checkpoint does not match the model: {wrong[:5]}")
    restore_ties(model, aliases)
    return model


def _check_names(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing or unexpected:
        raise KeyError(
            f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def _check_kinds(loaded: Mapping[str, torch.Tensor], expected: Mapping[str, torch.dtype]) -> None:
    """Refuse an integer (or boolean) tensor for a floating-point parameter: it is never cast silently."""
    for name, tensor in loaded.items():
        if expected[name].is_floating_point and not tensor.is_floating_point():
            raise TypeError(f"tensor {name!r} holds {tensor.dtype} values: weights must be floating point")
