"""The CUDA paths: bf16 training step, FlexAttention document masking, no host sync in an unlogged step.

Every test is marked ``cuda`` and skips without a CUDA device (``tests/conftest.py``); ``python -m bench
gpu --check`` runs them on a GPU.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from hyper_parallel.models import _layers  # noqa: E402
from hyper_parallel.models._layers import (  # noqa: E402
    AttentionPlan,
    DocumentOffsets,
    DocumentSlices,
    FlexBlockMask,
)
from hyper_parallel.models.llama3 import LLAMA3_FLAVORS  # noqa: E402
from hyper_parallel.models.llama3 import _modules as llama_modules  # noqa: E402
from hyper_parallel.models.qwen3_5 import QWEN3_5_FLAVORS  # noqa: E402
from hyper_parallel.models.qwen3_5 import _modules as qwen_modules  # noqa: E402

pytestmark = pytest.mark.cuda

SEQ = 512
LENGTHS = ((5, 200, 1, 306), (SEQ,))


def document_ids(device: str) -> Any:
    rows = [torch.cat([torch.full((n,), i % 2) for i, n in enumerate(row)]) for row in LENGTHS]
    return torch.stack(rows).to(device)


def build(name: str, dtype: Any = torch.float32) -> Any:
    torch.manual_seed(0)
    if name == "llama3":
        model = llama_modules.build_llama3(attrs.evolve(LLAMA3_FLAVORS["debugmodel"], vocab_size=512), "cuda")
    else:
        model = qwen_modules.build_qwen3_5(
            attrs.evolve(QWEN3_5_FLAVORS["debugmodel"], vocab_size=512), "cuda"
        )
    return model.to(dtype)


def loss_of(model: Any, ids: Any, tokens: Any = None) -> Any:
    if tokens is None:
        tokens = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(1)).cuda()
    logits = model(tokens[:, :-1], document_ids=ids)
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_flex_attention_document_masking_equals_the_variable_length_path(name: str) -> None:
    model = build(name)
    ids = document_ids("cuda")
    assert isinstance(AttentionPlan.for_device("cuda").documents(ids, ids.shape).layout, FlexBlockMask)
    flex = loss_of(model, ids)
    flex.backward()
    flex_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.attention_plan = AttentionPlan()  # no FlexAttention: the variable-length path on CUDA
    varlen = loss_of(model, ids)
    varlen.backward()
    assert abs(flex.item() - varlen.item()) < 1e-4
    for key, grad in flex_grads.items():
        other = dict(model.named_parameters())[key].grad
        assert (grad - other).abs().max().item() <= 1e-3 * max(1.0, other.abs().max().item()), key


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_a_bf16_training_step_stays_near_fp32(name: str) -> None:
    ids = document_ids("cuda")
    losses = []
    for dtype in (torch.float32, torch.bfloat16):
        model = build(name, dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            loss = loss_of(model, ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    assert abs(losses[1] - losses[0]) <= 0.03 * losses[0]


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_an_unlogged_step_never_syncs_the_host(name: str) -> None:
    model = build(name, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True, capturable=True)
    ids = document_ids("cuda")
    loss_of(model, ids).backward()  # warm-up: compile FlexAttention, allocate the optimizer state
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    if name == "qwen3_5" and _layers_fla_installed():
        pytest.skip("fla's variable-length kernels read cu_seqlens on the host (their API)")
    tokens = torch.randint(0, 512, (2, SEQ + 1), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss_of(model, ids, tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _layers_fla_installed() -> bool:
    from hyper_parallel.models.qwen3_5 import _gated_delta

    return _gated_delta.fla_kernel(QWEN3_5_FLAVORS["debugmodel"].linear_key_head_dim) is not None


@pytest.mark.parametrize("name", ["llama3", "qwen3_5"])
def test_document_ids_on_the_host_take_one_causal_call_per_document_and_equal_flex_attention(
    name: str,
) -> None:
    """The trainer's path on CUDA: ids in host memory; the variable-length kernel's offsets where torch has
    it (in float32 one causal call per document), else rows of at most SLICE_MAX_DOCUMENTS documents one
    cuDNN causal call each; the same loss and gradients as FlexAttention's block mask, no host sync."""
    model = build(name)
    ids = document_ids("cpu")
    plan = AttentionPlan.for_device("cuda")
    layout = plan.documents(ids, ids.shape, torch.device("cuda")).layout
    assert isinstance(layout, DocumentOffsets if plan.varlen is not None else DocumentSlices)
    tokens = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(1)).cuda()
    flex = loss_of(model, ids.cuda(), tokens)
    flex.backward()
    flex_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch.cuda.synchronize()
    if name == "qwen3_5" and _layers_fla_installed():
        pytest.skip("fla's variable-length kernels read cu_seqlens on the host (their API)")
    torch.cuda.set_sync_debug_mode("error")
    try:
        sliced = loss_of(model, ids, tokens)
        sliced.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert abs(flex.item() - sliced.item()) < 1e-4
    for key, grad in flex_grads.items():
        other = dict(model.named_parameters())[key].grad
        assert (grad - other).abs().max().item() <= 1e-3 * max(1.0, other.abs().max().item()), key


@pytest.mark.parametrize("gqa", [True, False])
def test_torch_varlen_attention_equals_flex_attention_in_bf16(gqa: bool) -> None:
    """torch's ``varlen_attn`` through the documents' offsets (one long and a few short documents a row):
    output and every input gradient within bf16 rounding of FlexAttention's block mask, eager and compiled
    with ``fullgraph=True`` (no graph break)."""
    plan = AttentionPlan.for_device("cuda")
    if plan.varlen is None:
        pytest.skip("this torch has no torch.nn.attention.varlen.varlen_attn (or no flash attention)")
    lengths = ((3584, 256, 160, 96), (4000, 96))
    ids = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in lengths])
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads = (8, 2) if gqa else (4, 4)

    def tensor(h: int) -> Any:
        return torch.randn(2, 4096, h, 64, generator=generator).cuda().bfloat16().requires_grad_()

    q, k, v = tensor(heads), tensor(kv_heads), tensor(kv_heads)
    grad = torch.randn(2, 4096, heads, 64, generator=generator).cuda().bfloat16()
    varlen = plan.documents(ids, ids.shape, torch.device("cuda"))
    assert isinstance(varlen.layout, DocumentOffsets)
    flex = plan.documents(ids.cuda(), ids.shape)
    assert isinstance(flex.layout, FlexBlockMask)
    compiled = torch.compile(_layers.attention, fullgraph=True)
    results = []
    for run, documents in ((_layers.attention, flex), (_layers.attention, varlen), (compiled, varlen)):
        out = run(q, k, v, documents)
        results.append([out, *torch.autograd.grad(out, (q, k, v), grad)])
    for other in results[1:]:
        for name, want, got in zip(("out", "dq", "dk", "dv"), results[0], other, strict=True):
            error = ((got.float() - want.float()).norm() / want.float().norm()).item()
            assert error <= 2e-2, (name, error)  # bf16: 2^-8 relative per rounding, fp32 accumulation


def test_compiled_llama_blocks_attend_through_varlen_without_a_graph_break() -> None:
    """The compiled run's path: ids on the host, the compiled blocks' plan (torch's varlen_attn over the
    documents' offsets), each block compiled as the trainer compiles it: no graph break in any block, the
    loss within bf16 rounding of FlexAttention's block mask, and once a second batch's document count and
    longest document have made them dynamic, no recompilation for further batches."""
    from torch._dynamo.utils import counters

    plan = AttentionPlan.for_device("cuda", compiled=True)
    if plan.varlen is None:
        pytest.skip("this torch has no torch.nn.attention.varlen.varlen_attn (or no flash attention)")
    model = build("llama3", torch.bfloat16)
    tokens = torch.randint(0, 512, (2, SEQ + 1), generator=torch.Generator().manual_seed(1)).cuda()
    flex = loss_of(model, document_ids("cuda"), tokens).item()
    torch._dynamo.reset()
    counters.clear()
    for layer in model.layers.values():
        layer.forward = torch.compile(layer.forward)
    model.attention_plan = plan

    def ids_of(*rows: tuple[int, ...]) -> Any:
        return torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in rows])

    varlen = loss_of(model, document_ids("cpu"), tokens)
    varlen.backward()
    assert abs(varlen.item() - flex) <= 0.01 * abs(flex)
    loss_of(model, ids_of((9, SEQ - 9), (SEQ // 2, SEQ // 2)), tokens).backward()
    graphs = counters["stats"]["unique_graphs"]
    for rows in (((100, SEQ - 100), (3, 4, 5, SEQ - 12)), ((SEQ - 1, 1), (7, SEQ - 7))):
        loss_of(model, ids_of(*rows), tokens).backward()
    assert counters["stats"]["unique_graphs"] == graphs
    assert dict(counters["graph_break"]) == {}
