"""Document masking through a variable-length kernel: every document of the flattened rows is one
sequence given by its offsets (``cu_seqlens``), the layout a CUDA run takes for ids read on the host.

torch's ``varlen_attn`` runs on CUDA only; here the offsets are computed and checked exactly, the plumbing
runs with the CPU reference behind the same interface (one causal SDPA call per document) against the
dense-masked path, the adapter's call of ``varlen_attn`` is checked with a recording stand-in for both
signatures torch has shipped, and dynamo is shown to trace the real custom op into one graph
(``tests/models/test_cuda_paths.py`` compares it with FlexAttention on a GPU).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.attention.varlen as torch_varlen  # noqa: E402
from torch import Tensor  # noqa: E402
from torch.library import custom_op  # noqa: E402

from hyper_parallel.models import _layers  # noqa: E402
from hyper_parallel.models._layers import AttentionPlan, DocumentOffsets  # noqa: E402
from tests.support.document_attention import (  # noqa: E402
    assert_equals_the_dense_masked_path,
    build,
    loss_and_grads,
)

REFERENCE = AttentionPlan(varlen=_layers.per_document_attention)


def ids_of(*rows: tuple[int, ...]) -> Any:
    """Document ids (batch, seq) of rows given as document lengths (ids alternate, as packing reuses them)."""
    return torch.stack([torch.cat([torch.full((n,), i % 2) for i, n in enumerate(row)]) for row in rows])


@pytest.mark.parametrize(
    ("rows", "offsets", "max_len"),
    [
        (((3, 1, 4), (8,)), [0, 3, 4, 8, 16], 8),
        (((1, 7), (6, 2)), [0, 1, 8, 14, 16], 7),
        (((5, 3), (2, 2, 2, 2), (1, 1, 6)), [0, 5, 8, 10, 12, 14, 16, 17, 18, 24], 6),
    ],
)
def test_offsets_are_every_row_start_and_document_start_of_the_flattened_rows(
    rows: tuple[tuple[int, ...], ...], offsets: list[int], max_len: int
) -> None:
    ids = ids_of(*rows)
    layout = REFERENCE.documents(ids, ids.shape).layout
    assert isinstance(layout, DocumentOffsets)
    assert layout.cu_seqlens.dtype == torch.int32
    assert layout.cu_seqlens.tolist() == offsets
    assert layout.host_offsets.tolist() == offsets
    assert layout.max_len == max_len
    assert layout.kernel is _layers.per_document_attention


def test_ids_on_the_host_keep_the_offsets_there_and_move_a_copy_to_the_model() -> None:
    meta = torch.device("meta")
    ids = ids_of((3, 5), (8,))
    layout = REFERENCE.documents(ids, ids.shape, meta).layout
    assert layout.cu_seqlens.device == meta
    assert layout.host_offsets.device.type == "cpu"
    one = torch.zeros(2, 8, dtype=torch.long)
    assert REFERENCE.documents(one, one.shape).layout is None  # no boundary: plain causal attention


def test_the_reference_behind_the_offsets_equals_the_dense_mask_with_grouped_query_heads() -> None:
    ids = ids_of((5, 1, 10), (16,))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, h, 8, generator=generator, requires_grad=True) for h in (4, 2, 2))
    grad = torch.randn(2, 16, 4, 8, generator=generator)
    results = []
    for plan in (REFERENCE, AttentionPlan(dense_mask_max_seq=16)):
        out = _layers.attention(q, k, v, plan.documents(ids, ids.shape))
        results.append((out, *torch.autograd.grad(out, (q, k, v), grad)))
    for new, old in zip(*results, strict=True):
        assert (new - old).abs().max().item() <= 1e-5


def test_a_model_through_the_offsets_equals_the_dense_masked_path() -> None:
    assert_equals_the_dense_masked_path("llama3", *loss_and_grads(build("llama3", REFERENCE)))


def varlen_stand_in(calls: list[dict[str, Any]], signature_of: Any) -> Any:
    """A recording ``varlen_attn`` with ``signature_of``'s signature, answering with the reference."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(signature_of).bind(*args, **kwargs)
        calls.append(dict(bound.arguments))
        q, k, v, cu_seqlens = args[:4]
        host = cu_seqlens.to("cpu")
        offsets = DocumentOffsets(cu_seqlens, host, args[5], _layers.per_document_attention)
        return _layers.per_document_attention(q, k, v, offsets)

    stand_in.__signature__ = inspect.signature(signature_of)  # type: ignore[attr-defined]
    return stand_in


def is_causal_era(query: Any, key: Any, value: Any, cu_seq_q: Any, cu_seq_k: Any, max_q: int, max_k: int,
                  *, return_aux: Any = None, is_causal: bool = False) -> Any:  # fmt: skip
    """torch 2.10's signature: causality as a flag, no grouped-query switch."""


@pytest.mark.parametrize("era", ["window_size", "is_causal"])
def test_the_cuda_adapter_calls_varlen_attn_causally_with_the_offsets_and_grouped_heads(
    era: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    signature_of = torch_varlen.varlen_attn if era == "window_size" else is_causal_era
    monkeypatch.setattr(torch_varlen, "varlen_attn", varlen_stand_in(calls, signature_of))
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    kernel = _layers.torch_varlen_kernel()
    assert kernel is not None
    ids = ids_of((5, 11), (16,))
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, h, 8, generator=generator).bfloat16() for h in (4, 2, 2))
    plan = AttentionPlan(varlen=kernel)
    out = _layers.attention(q, k, v, plan.documents(ids, ids.shape))
    expected = _layers.attention(q, k, v, REFERENCE.documents(ids, ids.shape))
    assert torch.equal(out, expected)
    (call,) = calls
    assert call["cu_seq_q"].tolist() == call["cu_seq_k"].tolist() == [0, 5, 16, 32]
    assert (call["max_q"], call["max_k"]) == (16, 16)
    native = "enable_gqa" in inspect.signature(signature_of).parameters
    if era == "window_size":
        assert call["window_size"] == (-1, 0)
    else:
        assert call["is_causal"] is True
    assert call.get("enable_gqa", False) is native
    assert call["key"].shape[1] == (2 if native else 4)  # repeated key heads where there is no switch
    calls.clear()
    _layers.attention(q.float(), k.float(), v.float(), plan.documents(ids, ids.shape))
    assert calls == []  # float32: flash attention refuses it, the per-document reference serves


def test_dynamo_traces_torch_varlen_attn_into_the_compiled_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real custom op (its fake implementation; the CUDA kernel never runs here) compiles into one
    graph with ``fullgraph=True``: a compiled block keeps it inside, with no graph break."""
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    kernel = _layers.torch_varlen_kernel()
    ids = ids_of((5, 11), (16,))
    documents = AttentionPlan(varlen=kernel).documents(ids, ids.shape)
    q, k = (torch.randn(2, 16, h, 8).bfloat16() for h in (4, 2))
    graphs: list[Any] = []

    def capture(graph: Any, inputs: Any) -> Any:
        graphs.append(graph)
        return lambda *args: (torch.zeros_like(q),)

    compiled = torch.compile(_layers.attention, backend=capture, fullgraph=True)
    compiled(q, k, k, documents)
    (graph,) = graphs
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert "torch_attn._varlen_attn" in targets


def test_compiled_runs_keep_the_ids_on_the_host_where_the_variable_length_kernel_compiles_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA a compiled run's ids stay on the host when torch has the kernel (one custom op inside each
    compiled block, no call per document), and the model attends through the compiled blocks' plan; without
    the kernel they go to the device (FlexAttention's mask, as before)."""
    import attrs

    from hyper_parallel.trainer import LLMTrainer
    from tests.support.trainer import tiny_config

    trainer = LLMTrainer(tiny_config("llama3", {"training.max_steps": "1", "compile.enable": "true"}))
    try:
        boundary = torch.tensor([[3, 3, 3, 3], [0, 0, 1, 1]])
        trainer.device = torch.device("cuda")
        _layers._plan_for.cache_clear()
        assert trainer.host_inputs({"document_ids": boundary}) == {}  # this CPU torch has no varlen kernel
        assert trainer.model.attention_plan is None
        monkeypatch.setattr(_layers, "torch_varlen_kernel", lambda: _layers.per_document_attention)
        _layers._plan_for.cache_clear()
        assert trainer.host_inputs({"document_ids": boundary})["document_ids"] is boundary
        plan = AttentionPlan.for_device("cuda", compiled=True)
        assert trainer.model.attention_plan is plan
        assert (plan.varlen, plan.slice_max_documents) == (_layers.per_document_attention, 0)
        assert AttentionPlan.for_device("cuda").varlen is None  # eager blocks: a causal call per document
        eager = attrs.evolve(trainer.config.compile, enable=False)
        trainer.config = attrs.evolve(trainer.config, compile=eager)
        assert trainer.host_inputs({"document_ids": boundary})["document_ids"] is boundary
    finally:
        _layers._plan_for.cache_clear()
        trainer.close()


@custom_op("hyper_parallel_test::per_document_attention", mutates_args=())
def _document_op(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int) -> Tensor:
    """A custom op over the offsets, as torch's varlen_attn is (the CPU has no flash attention kernel)."""
    layout = DocumentOffsets(offsets, offsets, max_len, _layers.per_document_attention)
    out: Tensor = _layers.per_document_attention(q, k, v, layout)
    return out.contiguous()


@_document_op.register_fake
def _document_op_fake(q: Any, k: Any, v: Any, offsets: Any, max_len: int) -> Any:
    return torch.empty_like(q)


def custom_op_kernel(q: Any, k: Any, v: Any, offsets: DocumentOffsets) -> Any:
    return torch.ops.hyper_parallel_test.per_document_attention(q, k, v, offsets.cu_seqlens, offsets.max_len)


def test_compiled_blocks_take_the_offsets_without_a_graph_break_or_a_recompilation_per_batch() -> None:
    """Blocks compiled as the trainer compiles them, attending through a custom op over the offsets (the
    shape of torch's varlen_attn): no graph break, the dense-masked path's outputs, and once a second batch
    has made the document count and the longest document dynamic, no recompilation for further batches."""
    from torch._dynamo.utils import counters

    model = build("llama3", AttentionPlan(varlen=custom_op_kernel))
    dense = build("llama3", AttentionPlan(dense_mask_max_seq=320))
    torch._dynamo.reset()
    counters.clear()
    for layer in model.layers.values():
        layer.forward = torch.compile(layer.forward, backend="eager")
    tokens = torch.randint(0, 512, (2, 320), generator=torch.Generator().manual_seed(1))
    layouts = [
        ((5, 70, 1, 244), (320,)),
        ((9, 311), (160, 160)),
        ((100, 220), (3, 4, 5, 308)),
        ((319, 1), (320,)),
    ]
    graphs = 0
    with torch.no_grad():
        for index, rows in enumerate(layouts):
            ids = ids_of(*rows)
            assert torch.allclose(model(tokens, document_ids=ids), dense(tokens, document_ids=ids), atol=1e-5)
            if index == 1:
                graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs
    assert dict(counters["graph_break"]) == {}
    torch._dynamo.reset()
