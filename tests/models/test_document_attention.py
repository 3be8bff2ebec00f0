"""Packed documents are kept apart without a (seq x seq) mask, and give the dense-masked path's losses.

The reference is the path this release replaced: ``scaled_dot_product_attention`` with a dense
(batch, 1, seq, seq) boolean mask, which a plan keeping the dense mask for every row length runs. The new
path is the variable-length one on the CPU; the CUDA block mask is checked here tile by tile against the
dense mask (FlexAttention itself trains only on CUDA: ``tests/models/test_cuda_paths.py``). Each path is
taken through the :class:`AttentionPlan` a run would build, set on the model.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from hyper_parallel.models import _layers  # noqa: E402
from hyper_parallel.models._layers import AttentionPlan, DocumentSlices, VarlenPlan  # noqa: E402
from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS, _gated_delta  # noqa: E402
from hyper_parallel.models.qwen3_5 import _modules as qwen_modules  # noqa: E402
from tests.support.document_attention import (  # noqa: E402
    CPU,
    DENSE,
    SEQ,
    assert_equals_the_dense_masked_path,
    build,
    document_ids,
    loss_and_grads,
)


def dense_mask(documents: Any) -> Any:
    """The (batch, 1, seq, seq) mask of the replaced path: causal, same document."""
    ids = documents.ids
    return (ids[:, :, None] == ids[:, None, :]).tril()[:, None]


class SquareTensors(TorchDispatchMode):
    """Records every tensor an operator makes whose last two dimensions are both ``seq``."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.seq = seq
        self.found: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.dim() >= 2
                and tensor.shape[-2:] == (self.seq,) * 2
            ):
                self.found.append((str(func), tuple(tensor.shape)))
        return out


class RecordedAttention:
    """Records the query length, mask and causality of every ``scaled_dot_product_attention`` call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, Any, Any]] = []
        sdpa = F.scaled_dot_product_attention

        def recording(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((args[0].shape[-2], kwargs.get("attn_mask"), kwargs.get("is_causal")))
            return sdpa(*args, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", recording)


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_packed_losses_and_gradients_equal_the_dense_masked_path(name: str) -> None:
    assert_equals_the_dense_masked_path(name, *loss_and_grads(build(name)))


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_no_seq_by_seq_tensor_is_made_in_forward_or_backward(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build(name)
    with monkeypatch.context() as patch, SquareTensors(SEQ) as new:
        calls = RecordedAttention(patch).calls
        loss_and_grads(model)
    assert new.found == []
    assert calls
    assert all(mask is None and causal is True for _, mask, causal in calls)
    # Row 0's documents round up to 64, 128 and 256 tokens; row 1 is one 320-token document.
    plan = CPU.documents(document_ids(), (2, SEQ)).layout
    assert isinstance(plan, VarlenPlan)
    assert plan.sizes == ((2, 64), (1, 128), (1, 256), (1, 320))
    # The detector sees the replaced path's mask.
    model.attention_plan = DENSE
    with SquareTensors(SEQ) as old:
        loss_and_grads(model)
    assert ("aten.tril.default", (2, SEQ, SEQ)) in old.found


def test_a_batch_without_boundaries_takes_plain_causal_attention() -> None:
    documents = CPU.documents(torch.zeros(2, 8, dtype=torch.long), (2, 8))
    assert documents.layout is None
    assert not documents.resets.any()


def test_short_cpu_rows_keep_the_dense_mask_the_cpu_kernel_runs_fastest() -> None:
    seq = _layers.DENSE_MASK_MAX_SEQ
    ids = torch.cat((torch.zeros(1, 10, dtype=torch.long), torch.ones(1, seq - 10, dtype=torch.long)), dim=1)
    mask = CPU.documents(ids, (1, seq)).layout
    assert isinstance(mask, torch.Tensor)
    assert mask.shape == (1, 1, seq, seq)
    assert mask[0, 0, 10, 9].item() is False
    assert mask[0, 0, 11, 10].item() is True
    longer = torch.cat((ids, torch.ones(1, 1, dtype=torch.long)), dim=1)
    assert isinstance(CPU.documents(longer, (1, seq + 1)).layout, VarlenPlan)


def test_the_cuda_block_mask_covers_exactly_the_tiles_of_the_dense_mask() -> None:
    block = 16
    ids = CPU.documents(document_ids(), (2, SEQ)).ids
    mask = _layers.document_block_mask(ids, block=block)
    dense = (ids[:, :, None] == ids[:, None, :]).tril()
    tiles = -(-SEQ // block)
    padded = F.pad(dense, (0, tiles * block - SEQ, 0, tiles * block - SEQ))
    grid = padded.view(2, tiles, block, tiles, block)
    touched = grid.any(dim=(2, 4))
    full = grid.all(dim=(2, 4))
    kv_num, kv_index, full_num, full_index = (
        mask.kv_num_blocks,
        mask.kv_indices,
        mask.full_kv_num_blocks,
        mask.full_kv_indices,
    )
    for b in range(2):
        for i in range(tiles):
            partial = set(kv_index[b, 0, i, : kv_num[b, 0, i]].tolist())
            whole = set(full_index[b, 0, i, : full_num[b, 0, i]].tolist())
            assert partial | whole == set(torch.nonzero(touched[b, i]).flatten().tolist()), (b, i)
            assert not partial & whole
            assert whole <= set(torch.nonzero(full[b, i]).flatten().tolist()), (b, i)
    with torch.no_grad():  # the mask function agrees with the dense mask on every pair
        q = torch.arange(SEQ)
        for b in range(2):
            pairs = mask.mask_mod(torch.tensor(b), torch.tensor(0), q[:, None], q[None, :])
            assert torch.equal(pairs, dense[b])


def fake_fla(
    q: Any, k: Any, v: Any, *, g: Any, beta: Any, scale: float, initial_state: Any, **kw: Any
) -> Any:
    """fla's variable-length call, computed by our chunked kernel one document at a time."""
    assert kw["use_qk_l2norm_in_kernel"]
    assert kw["output_final_state"]
    assert scale == q.shape[-1] ** -0.5
    cu = kw["cu_seqlens"].tolist()
    assert q.shape[0] == 1
    outs, states = [], []
    for start, end in itertools.pairwise(cu):
        part = [x[:, start:end] for x in (q, k, v, g, beta)]
        out, state = _gated_delta.chunk_gated_delta_rule(*part, chunk_size=16)
        outs.append(out)
        states.append(state)
    return torch.cat(outs, dim=1), torch.cat(states)


def test_fla_gets_packed_documents_as_cu_seqlens() -> None:
    generator = torch.Generator().manual_seed(0)
    batch, seq, heads, d = 2, SEQ, 4, 8

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator)

    inputs = (rand(batch, seq, 2, d), rand(batch, seq, 2, d), rand(batch, seq, heads, d))
    decay, beta = (
        -torch.rand(batch, seq, heads, generator=generator),
        torch.rand(batch, seq, heads, generator=generator),
    )
    resets = CPU.documents(document_ids(), (batch, seq)).resets
    assert _gated_delta.cu_seqlens_from_resets(resets).tolist() == [0, 5, 75, 76, 320, 640]
    expected, expected_state = _gated_delta.chunk_gated_delta_rule(*inputs, decay, beta, resets=resets)
    out, state = _gated_delta.gated_delta_rule(*inputs, decay, beta, resets=resets, fla=fake_fla)
    assert out.shape == expected.shape
    assert (out - expected).abs().max().item() < 1e-5
    assert (state - expected_state).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fla_is_used_only_in_16_bits_on_an_accelerator(dtype: str) -> None:
    query = torch.zeros(1, 2, 1, 4, dtype=getattr(torch, dtype), device="meta")
    assert _gated_delta.fla_serves(query) is (dtype == "bfloat16")
    assert _gated_delta.fla_serves(torch.zeros(1, 2, 1, 4, dtype=torch.bfloat16)) is False


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_the_block_mask_equals_the_dense_mask_forward() -> None:
    """FlexAttention's forward runs on the CPU (unfused; its backward is CUDA-only): full tiles skip the
    mask function, so this checks the tile classes against the kernel, not only against each other."""
    from torch.nn.attention.flex_attention import flex_attention

    documents = CPU.documents(document_ids(), (2, SEQ))
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, SEQ, 32, generator=generator)
    k, v = (torch.randn(2, 4, SEQ, 32, generator=generator) for _ in range(2))
    with torch.no_grad():
        out = flex_attention(q, k, v, block_mask=_layers.document_block_mask(documents.ids), enable_gqa=True)
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(documents), enable_gqa=True)
    assert (out - reference).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("capability", "triton_version", "tilelang", "refused"),
    [
        ((9, 0), "3.6.0", False, True),  # the lent H200's image: fla refuses its backward there
        ((9, 0), "3.4.0", False, True),
        ((9, 0), "3.7.1", False, False),
        ((9, 0), "3.3.1", False, False),
        ((9, 0), "3.6.0", True, False),  # tilelang serves the gated backward
        ((8, 0), "3.6.0", False, False),  # an A100 is not affected
        ((10, 0), "3.6.0", False, False),
    ],
)
def test_fla_is_refused_where_its_gated_backward_is_wrong(
    capability: tuple[int, int], triton_version: str, tilelang: bool, refused: bool
) -> None:
    reason = _gated_delta.fla_refusal(capability, triton_version, tilelang)
    assert (reason is not None) is refused
    if refused:
        assert reason == (
            f"flash-linear-attention's gated backward is wrong on Hopper GPUs with Triton {triton_version} "
            "(fla issue #640; Triton >= 3.7.1 or tilelang fixes it)"
        )


def test_fla_is_looked_up_once_when_a_gated_deltanet_layer_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup imports fla, which dynamo cannot trace: it happens when the first layer is built (once
    per process), never inside a (compiled) forward; every layer keeps what it found."""
    import importlib

    import attrs

    found: list[str] = []
    import_module = importlib.import_module

    def recording(name: str, *args: Any) -> Any:
        found.append(name)
        return import_module(name, *args)

    monkeypatch.setattr(importlib, "import_module", recording)
    _gated_delta.fla_kernel.cache_clear()
    try:
        model = qwen_modules.build_qwen3_5(attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], vocab_size=64), "cpu")
        fla = [name for name in found if name.startswith("fla")]
        assert fla == ["fla.ops.gated_delta_rule"]
        layers = [m for m in model.modules() if isinstance(m, qwen_modules.GatedDeltaNet)]
        assert layers
        assert all(layer.fla is _gated_delta.fla_kernel(layer.head_k_dim) for layer in layers)
        model(torch.randint(0, 64, (1, 16)), document_ids=torch.zeros(1, 16, dtype=torch.long))
        assert [name for name in found if name.startswith("fla")] == fla
    finally:
        _gated_delta.fla_kernel.cache_clear()


def test_qwen3_5_runs_in_bfloat16_without_fsdp_casting_its_rope() -> None:
    """RoPE angles are computed in fp32 and applied in the activations' dtype (a bf16 model called
    directly, as generate and the CUDA tests do, once mixed q/k float32 with v bf16)."""
    import attrs

    torch.manual_seed(0)
    args = attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], vocab_size=64)
    model = qwen_modules.build_qwen3_5(args, "cpu").to(torch.bfloat16)
    ids = torch.tensor([[0] * 10 + [1] * 22])
    logits = model(torch.randint(0, 64, (1, 32)), document_ids=ids)
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_rows_of_a_few_documents_take_one_causal_call_each_and_equal_the_dense_masked_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA's choice for ids read on the host, taken on the CPU (whose ids are always there)."""
    sliced = AttentionPlan(slice_max_documents=_layers.SLICE_MAX_DOCUMENTS)
    assert sliced.documents(document_ids(), (2, SEQ)).layout == DocumentSlices((5, 70, 1, 244, SEQ))
    model = build(name, sliced)
    with monkeypatch.context() as patch:
        calls = RecordedAttention(patch).calls
        new_loss, new_grads = loss_and_grads(model)
    lengths = [length for length, _, _ in calls]
    assert lengths
    assert lengths == [5, 70, 1, 244, SEQ] * (len(lengths) // 5)
    assert all(mask is None and causal is True for _, mask, causal in calls)
    assert_equals_the_dense_masked_path(name, new_loss, new_grads)


def test_ids_read_on_the_host_choose_the_layout_there_and_move_the_rest() -> None:
    """Document ids in host memory for a model elsewhere: CUDA's plan picks the layout from them without a
    device read (one causal call per document up to SLICE_MAX_DOCUMENTS a row, else the block mask; the
    variable-length plan where FlexAttention does not run), and the per-token tensors are moved."""
    meta = torch.device("meta")
    cuda = AttentionPlan.for_device("cuda")
    ids = document_ids()
    documents = cuda.documents(ids, ids.shape, meta)
    assert documents.layout == DocumentSlices((5, 70, 1, 244, SEQ))
    assert {t.device for t in documents[:3]} == {meta}
    five = torch.cat([torch.full((n,), i) for i, n in enumerate((64, 64, 64, 64, 64))])[None]
    layout = cuda.documents(five, five.shape, meta).layout
    assert isinstance(layout, _layers.FlexBlockMask)
    assert layout.kernel is cuda.flex
    assert layout.mask.kv_num_blocks.device == meta
    one = torch.zeros(2, SEQ, dtype=torch.long)
    assert cuda.documents(one, one.shape, meta).layout is None
    plan = attrs.evolve(cuda, flex=None, slice_max_documents=0).documents(ids, ids.shape, meta).layout
    assert isinstance(plan, VarlenPlan)
    assert plan.gather.device == meta


def test_a_run_builds_one_plan_per_device_and_flex_attention_only_for_cuda() -> None:
    assert AttentionPlan.for_device("cuda") is AttentionPlan.for_device(torch.device("cuda", 0))
    assert AttentionPlan.for_device("cuda").flex is not None
    assert AttentionPlan(dense_mask_max_seq=_layers.DENSE_MASK_MAX_SEQ) == CPU
    assert AttentionPlan.for_device("meta") == AttentionPlan()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_block_compiled_whole_takes_the_flex_attention_layout_and_equals_the_dense_path() -> None:
    """The plan's FlexAttention kernel travels with its block mask into each block: dynamo traces a block
    in one graph (``fullgraph``, nothing to look up), and the logits equal the dense-masked path's
    (FlexAttention's forward runs on the CPU, uncompiled here)."""
    from torch.nn.attention.flex_attention import flex_attention

    tokens = torch.randint(0, 512, (2, SEQ), generator=torch.Generator().manual_seed(1))
    model = build("llama3", AttentionPlan(flex=flex_attention))
    for block in model.layers.values():
        block.forward = torch.compile(block.forward, backend="eager", fullgraph=True)
    with torch.no_grad():
        logits = model(tokens, document_ids=document_ids())
        reference = build("llama3", DENSE)(tokens, document_ids=document_ids())
    assert (logits - reference).abs().max().item() < 1e-5
