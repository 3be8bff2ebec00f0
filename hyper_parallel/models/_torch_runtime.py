"""torch helpers shared by the built-in models' runtimes: device meshes and the parallelize pipeline.

``parallelize_model`` applies, in TorchTitan's order, tensor parallelism (the model's own plan, then every
parameter the plan left plain becomes a replicated ``DTensor``), activation checkpointing, ``torch.compile``
per block and FSDP2 data parallelism (FSDP, HSDP or DDP) with mixed precision and CPU offload. Blocks keep
their class and parameter names (checkpointing and compiling replace only the block's ``forward``), so
state-dict keys never change.

Private and torch-importing: only the runtime hooks import this module, from inside their bodies, so
resolving a config never loads torch.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

if TYPE_CHECKING:  # annotations only: models sit below the trainer layer and never import it
    from hyper_parallel.trainer.config import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )


__all__ = [
    "MESH_DIM_NAMES",
    "StateDictAdapter",
    "apply_activation_checkpointing",
    "apply_compile",
    "apply_fsdp",
    "build_device_mesh",
    "load_weights",
    "mesh_degrees",
    "parallelize_model",
    "read_safetensors_folder",
    "replicate_remaining_params",
    "tie_groups",
]

#: Mesh dimension names, outermost first, for the degrees of ``ParallelismConfig``.
MESH_DIM_NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class StateDictAdapter(Protocol):
    """What ``load_weights`` needs from a model's state-dict adapter."""

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]: ...


def read_safetensors_folder(weights_path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in a local folder (sharded or not), on the CPU."""
    from safetensors.torch import load_file

    folder = Path(weights_path)
    if not folder.is_dir():
        raise FileNotFoundError(f"weights_path {str(folder)!r} is not a directory")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: Mapping[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted({folder / name for name in weight_map.values()})
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in weights_path {str(folder)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file), device="cpu"))
    return tensors


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


def build_device_mesh(
    parallelism: ParallelismConfig, world_size: int, device_type: str = "cpu"
) -> DeviceMesh:
    """A device mesh with one named dimension per degree > 1 of ``parallelism`` (``dp_shard`` if none)."""
    degrees = parallelism.resolved_degrees(world_size)
    names = [name for name in MESH_DIM_NAMES if degrees[name] > 1] or ["dp_shard"]
    shape = tuple(degrees[name] for name in names)
    return init_device_mesh(device_type, shape, mesh_dim_names=tuple(names))


def mesh_degrees(parallelism: ParallelismConfig, device_mesh: DeviceMesh | None) -> dict[str, int]:
    """Degrees per mesh dimension name (1 where the mesh lacks it), checked against ``parallelism``."""
    names = tuple(device_mesh.mesh_dim_names or ()) if device_mesh is not None else ()
    unknown = [name for name in names if name not in MESH_DIM_NAMES]
    if unknown:
        raise ValueError(f"device mesh dimension(s) {unknown} are not among {list(MESH_DIM_NAMES)}")
    sizes = {name: device_mesh.size(i) for i, name in enumerate(names)} if device_mesh else {}
    degrees = {name: sizes.get(name, 1) for name in MESH_DIM_NAMES}
    world = math.prod(degrees.values())
    issues = parallelism.world_size_issues(world)
    if issues:
        details = "; ".join(f"parallelism.{path}: {message}" for path, message in issues)
        raise ValueError(f"device mesh {sizes or '(none)'} does not match parallelism: {details}")
    expected = parallelism.resolved_degrees(world)
    wrong = [f"{n}={expected[n]} (mesh: {degrees[n]})" for n in MESH_DIM_NAMES if expected[n] != degrees[n]]
    if wrong:
        raise ValueError("device mesh does not match parallelism degrees: " + ", ".join(wrong))
    if degrees["cp"] > 1:
        raise NotImplementedError("parallelism.cp > 1 is not supported by the built-in models yet")
    return degrees


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


class _ReplicateParallel:
    """Tensor-parallel style for a module the plan does not split: its own parameters become replicated
    ``DTensor``s, plain tensor inputs enter as replicated ``DTensor``s and outputs leave as local tensors.

    Every parameter of a tensor-parallel model is then a ``DTensor`` on the same mesh, which
    ``clip_grad_norm_`` and the foreach/fused optimizers require. The computation is unchanged: every rank
    already computed these modules on the same replicated activations.
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

    unit.forward = run  # type: ignore[method-assign]


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


def _saved_ops() -> frozenset[Any]:
    """Operators whose outputs selective op-level checkpointing keeps: matmuls and attention."""
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_mm",
    )
    ops = {getattr(aten, name) for name in names if hasattr(aten, name)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor)  # recomputing a collective costs communication
    return frozenset(ops)


def _op_policy(saved: frozenset[Any], ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in saved else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward: Callable[..., Any], config: ActivationCheckpointConfig) -> Callable[..., Any]:
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    options: dict[str, Any] = {
        "use_reentrant": False,
        "preserve_rng_state": config.preserve_rng_state,
        "early_stop": config.early_stop,
    }
    if config.mode == "selective" and config.selective_option == "op":
        policy = functools.partial(_op_policy, _saved_ops())
        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, **options, **kwargs)

    return run


def apply_activation_checkpointing(blocks: Sequence[nn.Module], config: ActivationCheckpointConfig) -> None:
    """Recompute block activations in backward as ``config`` says (mode none/full/selective).

    ``full`` checkpoints every block; ``selective`` with ``"op"`` checkpoints every block but keeps the
    outputs of matmuls and attention (recomputing the cheap element-wise ops); ``selective`` with an
    integer ``n`` checkpoints every n-th block (the n-th, 2n-th ...). The block's ``forward`` is replaced
    in place, so its class and parameter names are unchanged.
    """
    if config.mode == "none":
        return
    every = config.selective_option if config.mode == "selective" else "op"
    for index, block in enumerate(blocks):
        if isinstance(every, int) and (index + 1) % every:
            continue
        block.forward = _checkpointed(block.forward, config)  # type: ignore[method-assign]


def apply_compile(blocks: Sequence[nn.Module], config: CompileConfig) -> None:
    """``torch.compile`` each block's ``forward`` (after checkpointing, before FSDP, as in TorchTitan).

    Only ``forward`` is compiled, not the module call, so the FSDP2 hooks added later run eagerly around
    it; parameter names are unchanged.
    """
    for block in blocks:
        block.forward = torch.compile(  # type: ignore[method-assign]
            block.forward, backend=config.backend, mode=config.mode, fullgraph=config.fullgraph
        )


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def apply_fsdp(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh,
    degrees: Mapping[str, int],
    training: TrainingConfig | None = None,
) -> None:
    """Data parallelism with FSDP2, each block then the root, over the data-parallel mesh dimensions.

    ``dp_shard`` alone is FSDP (``fully_shard`` on the 1-D ``dp_shard`` mesh, placements ``(Shard(0),)``);
    ``dp_replicate`` x ``dp_shard`` is HSDP (``fully_shard`` on the 2-D mesh, which FSDP2 reads as
    replicate x shard: ``(Replicate(), Shard(0))``); ``dp_replicate`` alone is DDP through FSDP2's
    ``replicate`` (parameters ``(Replicate(),)``, gradients all-reduced), so every data-parallel layout
    shares one module type, one gradient-sync switch and DTensor parameters. ``training`` sets the
    ``MixedPrecisionPolicy`` (``mixed_precision_param``/``_reduce``) and CPU offload
    (``enable_cpu_offload``); ``None`` keeps full precision on the device.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    replicas, shards = degrees["dp_replicate"], degrees["dp_shard"]
    if replicas == 1 and shards == 1:
        return
    mp_policy = MixedPrecisionPolicy()
    offload: OffloadPolicy = OffloadPolicy()
    if training is not None:
        mp_policy = MixedPrecisionPolicy(
            param_dtype=_dtype(training.mixed_precision_param),
            reduce_dtype=_dtype(training.mixed_precision_reduce),
        )
        if training.enable_cpu_offload:
            # Pinned host memory needs an accelerator; on a CPU-only machine offloading is a no-op anyway.
            offload = CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
    if shards == 1:  # DDP: replicate every block, then the root (gradients all-reduced per block)
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for block in blocks:
            replicate(block, mesh=device_mesh["dp_replicate"], mp_policy=mp_policy, offload_policy=offload)
        replicate(model, mesh=device_mesh["dp_replicate"], mp_policy=mp_policy, offload_policy=offload)
        return
    dp_mesh = device_mesh["dp_replicate", "dp_shard"] if replicas > 1 else device_mesh["dp_shard"]
    options: dict[str, Any] = {
        "mesh": dp_mesh,
        "reshard_after_forward": parallelism.fsdp_reshard_after_forward != "never",
        "mp_policy": mp_policy,
        "offload_policy": offload,
    }
    for block in blocks:
        fully_shard(block, **options)
    fully_shard(model, **options)


def parallelize_model(
    model: nn.Module,
    parallelism: ParallelismConfig,
    device_mesh: DeviceMesh | None,
    *,
    blocks: Sequence[nn.Module],
    apply_tp: Callable[[DeviceMesh], None],
    replicated_units: Sequence[nn.Module] = (),
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> nn.Module:
    """TP (``apply_tp`` on the ``tp`` mesh, then the rest replicated) -> AC -> compile -> FSDP2, in place.

    The order is TorchTitan's: tensor parallelism (every parameter then is a ``DTensor``, replicated where
    not split) -> activation checkpointing per block (``activation_checkpoint``) -> ``torch.compile`` per
    block (``compile``, when enabled with ``"model"`` among its components) -> FSDP2 data parallelism (FSDP
    over ``dp_shard``, HSDP over ``dp_replicate`` x ``dp_shard``, DDP over ``dp_replicate``) with the
    ``MixedPrecisionPolicy`` and CPU offload of ``training``. ``None`` for a section means its defaults-off
    behaviour (full precision, no checkpointing, no compile). ``device_mesh`` names its dimensions after
    the degrees of ``parallelism`` above 1 (see ``hyper_parallel.models.loading.build_device_mesh``);
    ``None`` means one process. Parameter names (state-dict keys) are never changed.

    ``blocks`` are the units checkpointed, compiled and sharded one by one; ``replicated_units`` are
    submodules tensor parallelism leaves whole (see ``replicate_remaining_params``).
    """
    degrees = mesh_degrees(parallelism, device_mesh)
    aliases = tie_groups(model)
    if degrees["tp"] > 1:
        assert device_mesh is not None
        apply_tp(device_mesh["tp"])
        replicate_remaining_params(model, device_mesh["tp"], replicated_units)
    if activation_checkpoint is not None:
        apply_activation_checkpointing(blocks, activation_checkpoint)
    if compile is not None and compile.enable and "model" in compile.components:
        apply_compile(blocks, compile)
    if device_mesh is not None:
        apply_fsdp(model, blocks, parallelism, device_mesh, degrees, training)
    restore_ties(model, aliases)
    return model
