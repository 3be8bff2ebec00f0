"""``parallelize`` on CPU with two gloo processes: sharded loss and gradients match the unsharded model."""

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

import attrs  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hyper_parallel.trainer.config import (  # noqa: E402
    ActivationCheckpointConfig,
    CompileConfig,
    ParallelismConfig,
    TrainingConfig,
)
from tests.support.parallel_models import IMAGE_TOKEN, LAYOUTS, SPECS, WORLD  # noqa: E402
from tests.support.parallel_models import full as _full  # noqa: E402
from tests.support.parallel_models import image_batch as _image_batch  # noqa: E402
from tests.support.processes import Case, SpawnedCases, spawn_each  # noqa: E402

#: Layouts run with activation checkpointing and compile on top (Llama 3 and Qwen 3.5 text only).
_SELECTIVE = ActivationCheckpointConfig(mode="selective", selective_option="op")
WITH_HOOKS = {
    "dp_shard2_ac": (
        LAYOUTS["dp_shard2"],
        {"activation_checkpoint": ActivationCheckpointConfig(mode="full")},
    ),
    "tp2_ac": (LAYOUTS["tp2"], {"activation_checkpoint": _SELECTIVE}),
    "tp2_ac_compile": (
        LAYOUTS["tp2"],
        {"activation_checkpoint": _SELECTIVE, "compile": CompileConfig(enable=True, backend="eager")},
    ),
}


def _loss(model: Any, ids: Any, images: tuple[Any, Any] | None = None) -> Any:
    logits = model(ids) if images is None else model(ids, *images, image_token_id=IMAGE_TOKEN)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


#: Gated DeltaNet parameters tensor parallelism splits by heads, and the dimension they are split along.
DELTANET_SHARDED = {
    "in_proj_q.weight": 0,
    "in_proj_k.weight": 0,
    "in_proj_v.weight": 0,
    "in_proj_z.weight": 0,
    "in_proj_b.weight": 0,
    "in_proj_a.weight": 0,
    "conv_q": 0,
    "conv_k": 0,
    "conv_v": 0,
    "dt_bias": 0,
    "A_log": 0,
    "out_proj.weight": 1,
}


def _assert_deltanet_sharded(reference: Any, sharded: Any) -> None:
    """Every Gated DeltaNet projection, convolution and per-head parameter holds half the heads."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    ref_params = dict(reference.named_parameters())
    checked = 0
    for name, param in sharded.named_parameters():
        if ".linear_attn." not in name:
            continue
        assert isinstance(param, DTensor), name
        suffix = name.split(".linear_attn.", 1)[1]
        full_shape = tuple(ref_params[name].shape)
        assert tuple(param.shape) == full_shape, name
        if suffix == "norm.weight":  # the gated RMSNorm over head_dim stays replicated
            assert param.placements == (Replicate(),), name
            continue
        dim = DELTANET_SHARDED[suffix]
        assert param.placements == (Shard(dim),), name
        expected = tuple(size // WORLD if i == dim else size for i, size in enumerate(full_shape))
        assert tuple(param.to_local().shape) == expected, name
        checked += 1
    assert checked == len(DELTANET_SHARDED) * sum(layer.linear_attn is not None for layer in sharded.layers)
    assert checked > 0


def _tp_placement(model_name: str, name: str) -> tuple[str, int | None]:
    """("shard", dim) or ("replicate", None): how tensor parallelism must place parameter ``name``."""
    leaf = name.removeprefix("language_model.")
    if leaf.startswith("visual.") or leaf.endswith("norm.weight"):
        return "replicate", None
    if leaf in ("tok_embeddings.weight", "output.weight"):  # Llama splits the vocabulary, Qwen 3.5 not
        return ("shard", 0) if model_name == "llama3" else ("replicate", None)
    if ".linear_attn." in leaf:
        return "shard", DELTANET_SHARDED[leaf.split(".linear_attn.", 1)[1]]
    if leaf.endswith((".wo.weight", ".w2.weight")):
        return "shard", 1
    return "shard", 0


def _assert_sharded(model_name: str, parallelism: ParallelismConfig, reference: Any, sharded: Any) -> None:
    """Every parameter is a DTensor on the expected mesh dimension, placed and shaped as the layout says."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    dim_name = "tp" if parallelism.tp > 1 else "dp_shard"
    full_shapes = {name: tuple(p.shape) for name, p in reference.named_parameters()}
    sharded_count = 0
    for name, param in sharded.named_parameters():
        assert isinstance(param, DTensor), name
        assert param.device_mesh.mesh_dim_names == (dim_name,), name
        full = full_shapes[name]
        assert tuple(param.shape) == full, name
        kind, dim = ("shard", 0) if dim_name == "dp_shard" else _tp_placement(model_name, name)
        if kind == "replicate":
            assert param.placements == (Replicate(),), name
            assert tuple(param.to_local().shape) == full, name
            continue
        assert dim is not None
        assert param.placements == (Shard(dim),), name
        local = list(full)
        local[dim] = -(-full[dim] // WORLD) if dist.get_rank() == 0 else full[dim] - -(-full[dim] // WORLD)
        assert list(param.to_local().shape) == local, name
        sharded_count += 1
    assert sharded_count > 0


def _watch_residual_norm(model: Any) -> list[Any]:
    """Every output of the first block's ``ffn_norm`` (the residual stream, normed), as it leaves the norm."""
    outputs: list[Any] = []
    _blocks(model)[0].ffn_norm.register_forward_hook(lambda module, args, out: outputs.append(out.detach()))
    return outputs


def _assert_residual_layout(parallelism: ParallelismConfig, outputs: list[Any], seq: int) -> None:
    """Under sequence parallelism each rank holds its slice of the sequence; otherwise the whole of it."""
    from torch.distributed.tensor import DTensor, Shard

    assert outputs
    for out in outputs:
        if parallelism.tp > 1 and parallelism.sequence_parallel:
            assert isinstance(out, DTensor)
            assert out.placements == (Shard(1),)
            assert (out.shape[1], out.to_local().shape[1]) == (seq, seq // WORLD)
        else:
            assert not isinstance(out, DTensor)
            assert out.shape[1] == seq


def _check_layout(rank: int, model_name: str, layout: str) -> None:
    from hyper_parallel.parallel.parallel_dims import ParallelDims

    torch.manual_seed(0)
    spec = SPECS[model_name]()
    parallelism, hooks = WITH_HOOKS[layout] if layout in WITH_HOOKS else (LAYOUTS[layout], {})
    reference = spec.build_model_fn(spec.args, device="cpu")
    sharded = copy.deepcopy(reference)
    if model_name.startswith("qwen3_5"):
        sharded.tie_weights()
    mesh = ParallelDims.from_config(parallelism, WORLD).build_mesh("cpu")
    spec.parallelize_fn(sharded, parallelism, mesh, **hooks)
    _assert_sharded(model_name, parallelism, reference, sharded)
    if model_name == "qwen3_5" and parallelism.tp > 1:
        _assert_deltanet_sharded(reference, sharded)

    images = None
    if model_name == "qwen3_5_vl":
        vision = spec.args.vision
        patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        ids, pixels, grid = _image_batch(spec.args.text.vocab_size, patch)
        images = (pixels, grid)
        local = ids  # every rank sees the whole batch: FSDP's averaged gradient is then the same
    else:
        ids = torch.randint(0, spec.args.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1))
        # Data parallel: each rank takes its half of the batch; tensor parallel: all of it.
        local = ids.chunk(WORLD)[rank] if parallelism.dp_shard > 1 else ids
    residual = _watch_residual_norm(sharded)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    opt = torch.optim.SGD(sharded.parameters(), lr=0.5)
    for step in range(2):
        ref_loss = _loss(reference, ids, images)
        loss = _loss(sharded, local, images)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        global_loss /= WORLD
        torch.testing.assert_close(global_loss, ref_loss.detach(), rtol=1e-5, atol=1e-5)
        ref_loss.backward()
        loss.backward()
        ref_grads = dict(reference.named_parameters())
        for name, param in sharded.named_parameters():
            assert param.grad is not None, name
            torch.testing.assert_close(
                _full(param.grad), ref_grads[name].grad, rtol=1e-4, atol=1e-5, msg=f"step {step} {name}"
            )
        ref_opt.step()
        opt.step()
        ref_opt.zero_grad()
        opt.zero_grad()
    _assert_residual_layout(parallelism, residual, local.shape[1])


# Qwen 3.5 under TP is not compiled here: dynamo does not see through the `to_local` lookup of the
# Gated DeltaNet's sharded parameters in _modules.py (conv1d then gets a DTensor).
CHECKPOINTED = [
    ("llama3", "dp_shard2_ac"),
    ("qwen3_5", "dp_shard2_ac"),
    ("qwen3_5", "tp2_ac"),
    ("llama3", "tp2_ac_compile"),
]
FSDP_POLICY_MODELS = ["llama3", "qwen3_5"]


@pytest.fixture(scope="module")
def spawned() -> SpawnedCases:
    """Every multi-process case of this module, one after the other in one spawned group (start-up once);
    the compiled one last, so no case runs after torch.compile has run."""
    cases: dict[str, Case] = {
        f"{model_name}-{layout}": (_check_layout, (model_name, layout))
        for model_name in SPECS
        for layout in LAYOUTS
    }
    cases.update({f"fsdp-policies-{m}": (_check_fsdp_policies, (m,)) for m in FSDP_POLICY_MODELS})
    cases.update({f"{m}-{layout}": (_check_layout, (m, layout)) for m, layout in CHECKPOINTED})
    return spawn_each(cases, nprocs=WORLD)


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("model_name", list(SPECS))
def test_parallelize_matches_unsharded(model_name: str, layout: str, spawned: SpawnedCases) -> None:
    spawned.check(f"{model_name}-{layout}")


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("model_name", "layout"), CHECKPOINTED)
def test_checkpointed_and_compiled_parallel_model_matches_unsharded(
    model_name: str, layout: str, spawned: SpawnedCases
) -> None:
    spawned.check(f"{model_name}-{layout}")


def _blocks(model: Any) -> list[Any]:
    return list((model.language_model if hasattr(model, "language_model") else model).layers.children())


def _fsdp_run(model_name: str, parallelism: ParallelismConfig, training: TrainingConfig | None) -> Any:
    """One forward/backward of an FSDP2 model; returns what block 0 showed (dtypes, states)."""
    from torch.distributed.tensor import DTensor

    from hyper_parallel.parallel.parallel_dims import ParallelDims

    spec = SPECS[model_name]()
    model = spec.build_model_fn(spec.args, device="cpu")
    mesh = ParallelDims.from_config(parallelism, WORLD).build_mesh("cpu")
    spec.parallelize_fn(model, parallelism, mesh, training=training)
    block = _blocks(model)[0]
    seen: list[tuple[Any, Any]] = []
    block.feed_forward.w1.register_forward_pre_hook(
        lambda m, args: seen.append((m.weight.dtype, args[0].dtype))
    )
    ids = torch.randint(0, spec.args.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    loss = model(ids).float().square().mean()
    resharded = isinstance(block.feed_forward.w1.weight, DTensor)
    loss.backward()
    group = block._get_fsdp_state()._fsdp_param_group
    grad = block.feed_forward.w1.weight.grad
    return (
        seen,
        resharded,
        group.offload_policy,
        (grad.dtype, grad.placements, block.feed_forward.w1.weight.device),
    )


def _check_fsdp_policies(rank: int, model_name: str) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import Shard

    mixed = TrainingConfig(
        mixed_precision_param="bfloat16", mixed_precision_reduce="float32", enable_cpu_offload=True
    )
    seen, resharded, offload, (grad_dtype, placements, device) = _fsdp_run(
        model_name, ParallelismConfig(dp_shard=2, fsdp_reshard_after_forward="never"), mixed
    )
    assert seen == [(torch.bfloat16, torch.bfloat16)]  # parameters and inputs cast for the forward
    assert not resharded  # 'never': the gathered parameters stay after forward
    assert isinstance(offload, CPUOffloadPolicy)
    assert device.type == "cpu"
    assert (grad_dtype, placements) == (torch.float32, (Shard(0),))  # reduced and kept in float32

    seen, resharded, offload, (grad_dtype, placements, _) = _fsdp_run(
        model_name, ParallelismConfig(dp_shard=2), None
    )
    assert seen == [(torch.float32, torch.float32)]
    assert resharded
    assert not isinstance(offload, CPUOffloadPolicy)
    assert (grad_dtype, placements) == (torch.float32, (Shard(0),))


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_name", FSDP_POLICY_MODELS)
def test_fsdp_applies_mixed_precision_offload_and_reshard(model_name: str, spawned: SpawnedCases) -> None:
    spawned.check(f"fsdp-policies-{model_name}")


def test_mesh_must_match_parallelism() -> None:
    from hyper_parallel.parallel.parallel_dims import mesh_degrees

    with pytest.raises(ValueError, match="does not match"):
        mesh_degrees(ParallelismConfig(dp_shard=1, tp=2), None)
    assert mesh_degrees(attrs.evolve(ParallelismConfig(), dp_shard=1), None)["tp"] == 1
