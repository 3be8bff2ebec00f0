"""Point 3 of the preflight: activation bytes within 10% of what autograd keeps for backward.

The debug models run forward and the loss on the CPU at seq 512 and 2048 under each activation-checkpoint
mode; Llama 3 in bfloat16 (the default compute dtype), Qwen 3.5 in float32 (its full-attention blocks do
not run in bfloat16 yet: the fp32 RoPE promotes queries and keys but not values).

The trainer's activation-checkpoint runtime is not in this branch, so the test wraps the blocks itself as
``activation_checkpoint`` describes them: ``full`` checkpoints every block, ``selective`` ``op`` saves the
outputs of matmuls and attention and recomputes the rest, ``selective`` ``n`` checkpoints every n-th block
(counting from 1), all with non-reentrant ``torch.utils.checkpoint``.

What is kept is measured with ``saved_tensors_hooks``: every distinct storage autograd saves (parameters
excluded). Inside a checkpointed region checkpoint installs its own hooks and keeps instead the region's
inputs and, for selective checkpointing, the cached op outputs; the test adds those, read from the
checkpoint calls and the selective-checkpoint caches. That this accounts for everything is checked on
both models against a second measure: every storage any op made during the forward that is still alive
after it (weak references), which needs no knowledge of checkpoint.
"""

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from torch.utils.checkpoint import (  # noqa: E402
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from hyper_parallel.components.loss._runtime import CausalLMLossFn  # noqa: E402
from hyper_parallel.models.llama3 import LLAMA3_FLAVORS  # noqa: E402
from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS  # noqa: E402
from hyper_parallel.preflight.estimate import _activation_bytes  # noqa: E402
from hyper_parallel.preflight.model import Workload  # noqa: E402

aten = torch.ops.aten
#: What selective "op" checkpointing saves: matmul and attention outputs (every SDPA backend's op).
SAVED_OPS = {
    aten.mm.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
MODELS = {
    "llama3": (LLAMA3_FLAVORS["debugmodel"], torch.bfloat16),
    "qwen3_5": (QWEN3_5_FLAVORS["debugmodel"], torch.float32),
}


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class _Kept:
    """What checkpointed regions keep: their inputs and the selective-checkpoint caches."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.caches: list[Any] = []

    def selective_contexts(self) -> tuple[Any, Any]:
        forward, recompute = create_selective_checkpoint_contexts(_policy)
        self.caches.append(forward.storage)
        return forward, recompute

    def tensors(self) -> Iterator[Any]:
        yield from (t for t in self.inputs if isinstance(t, torch.Tensor))
        for cache in self.caches:
            for outputs in cache.values():
                for leaf in tree_leaves(outputs, is_leaf=lambda x: hasattr(x, "val")):
                    if isinstance(getattr(leaf, "val", None), torch.Tensor):
                        yield leaf.val


def _checkpoint_blocks(model: Any, ac: str | int) -> _Kept:
    """Wrap the blocks of ``model`` as ``activation_checkpoint`` mode ``ac`` would."""
    kept = _Kept()
    for i, block in enumerate(model.layers.children()):
        if ac == "none" or (isinstance(ac, int) and (i + 1) % ac):
            continue
        kwargs = {"context_fn": kept.selective_contexts} if ac == "op" else {}

        def forward(
            *args: Any, _inner: Callable[..., Any] = block.forward, _kw: Any = kwargs, **call_kwargs: Any
        ) -> Any:
            kept.inputs.extend(tree_leaves((args, call_kwargs)))
            return checkpoint(_inner, *args, use_reentrant=False, **_kw, **call_kwargs)

        block.forward = forward
    return kept


def _build(name: str) -> tuple[Any, Any, torch.dtype]:
    args, dtype = MODELS[name]
    torch.manual_seed(0)
    if name == "llama3":
        from hyper_parallel.models.llama3._modules import build_llama3

        model = build_llama3(args, "cpu")
    else:
        from hyper_parallel.models.qwen3_5._modules import build_qwen3_5

        model = build_qwen3_5(args, "cpu")
    return model.to(dtype), args, dtype


def _forward(model: Any, seq: int, vocab: int) -> Any:
    tokens = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(1))
    return CausalLMLossFn()(model(tokens), tokens)


def _param_storages(model: Any) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def saved_bytes(model: Any, seq: int, vocab: int, kept: _Kept | None = None) -> int:
    """Bytes of the distinct storages kept for backward by autograd or by checkpoint (no parameters)."""
    params, seen = _param_storages(model), {}

    def remember(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(remember, lambda tensor: tensor):
        loss = _forward(model, seq, vocab)
    for tensor in kept.tensors() if kept else ():
        remember(tensor)
    del loss
    return sum(seen.values())


class _Storages(TorchDispatchMode):
    """Remembers a weak reference to the storage of every tensor any op returns (but parameters' views)."""

    def __init__(self, params: set[int]) -> None:
        super().__init__()
        self.params = params
        self.made: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in _tensors(out):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in self.params:
                ref = StorageWeakRef(storage)
                self.made[ref.cdata] = (ref, storage.nbytes())
        return out


def _tensors(out: Any) -> Iterator[Any]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _tensors(item)


def retained_after_forward(model: Any, seq: int, vocab: int) -> int:
    """Bytes of the storages made during forward and the loss that are still alive afterwards."""
    mode = _Storages(_param_storages(model))
    with mode:
        loss = _forward(model, seq, vocab)
    gc.collect()
    alive = sum(size for ref, size in mode.made.values() if not ref.expired())
    del loss
    return alive - 4  # the scalar loss itself


def _estimate(name: str, seq: int, dtype: torch.dtype, ac: str | int) -> int:
    args, _ = MODELS[name]
    acts = args.preflight().activations(Workload(batch=1, seq=seq, param_bytes=dtype.itemsize))
    return _activation_bytes(acts, ac, len(acts.blocks), 1)


@pytest.fixture(scope="module")
def unchecked() -> dict[tuple[str, int], int]:
    """Bytes kept without checkpointing, per (model, seq), measured once."""
    return {}


def _unchecked(cache: dict[tuple[str, int], int], name: str, seq: int) -> int:
    if (name, seq) not in cache:
        model, args, _ = _build(name)
        cache[name, seq] = saved_bytes(model, seq, args.vocab_size)
    return cache[name, seq]


@pytest.mark.parametrize("ac", ["none", "full", "op", 2])
@pytest.mark.parametrize("seq", [512, 2048])
@pytest.mark.parametrize("name", list(MODELS))
def test_activation_bytes_match_what_is_kept_for_backward(
    unchecked: dict[tuple[str, int], int], name: str, seq: int, ac: str | int
) -> None:
    if ac == "none":
        measured = _unchecked(unchecked, name, seq)
    else:
        model, args, _ = _build(name)
        kept = _checkpoint_blocks(model, ac)
        measured = saved_bytes(model, seq, args.vocab_size, kept)
        assert measured < _unchecked(unchecked, name, seq)  # checkpointing keeps less
    assert _estimate(name, seq, MODELS[name][1], ac) == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("ac", ["none", "full", "op", 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_accounting_sees_everything_that_stays_alive(name: str, ac: str | int) -> None:
    model, args, _ = _build(name)
    kept = _checkpoint_blocks(model, ac)
    accounted = saved_bytes(model, 512, args.vocab_size, kept)
    model, args, _ = _build(name)
    _checkpoint_blocks(model, ac)
    assert retained_after_forward(model, 512, args.vocab_size) == pytest.approx(accounted, rel=0.001)
