"""PyTorch building blocks shared by the built-in models (imported lazily, with the model modules).

Packed documents are kept apart in attention without a ``(seq, seq)`` mask. How is decided in one place:
an :class:`AttentionPlan`, chosen once per run from the device and what this torch serves
(:meth:`AttentionPlan.for_device`), picks one layout per batch (:meth:`AttentionPlan.documents`):

- on CUDA in compiled blocks, when the document ids are read on the host (the trainer keeps them there
  where this plan has the kernel) and this torch has ``torch.nn.attention.varlen.varlen_attn`` (flash
  attention's variable-length kernel, a custom op that compiles into a block without a graph break):
  every document of the flattened batch is one sequence of one kernel call, given by its offsets
  (:class:`DocumentOffsets`), with no padding, no copies and no mask;
- on CUDA in eager blocks, when the document ids are read on the host (the trainer keeps them there)
  and no row holds more than ``SLICE_MAX_DOCUMENTS``, one causal ``scaled_dot_product_attention`` call
  per document, on views of the rows (cuDNN's kernel on Hopper; FlexAttention's Triton kernel costs
  1.75x that for a long document, measured on an H200 by ``python -m bench.attention_probe``);
- otherwise on CUDA, through FlexAttention (``torch.nn.attention.flex_attention``, compiled once per
  process) with a block mask built from the documents' block ranges in ``O((seq / 128)^2)`` per row, never
  from a dense mask; blocks inside one document skip the mask function, blocks across documents are
  skipped;
- elsewhere (the CPU, and accelerators FlexAttention does not serve; FlexAttention has no backward on the
  CPU in torch 2.11-2.13), through a variable-length path: every document becomes its own causal sequence,
  documents of similar length are batched together (lengths rounded up to ``VARLEN_BUCKET``) and each
  group is one ``scaled_dot_product_attention(is_causal=True)`` call; tokens are moved there and back by
  index. No mask is passed at all. A batch without document boundaries takes plain causal attention.

One exception, measured: on the CPU, rows of at most ``DENSE_MASK_MAX_SEQ`` tokens keep the dense
(batch, 1, seq, seq) boolean mask (64 KiB a row at 256 tokens), which SDPA's CPU kernel takes at the cost
of causal attention: there the variable-length path's copies cost more than they save (attention forward
and backward of the Llama 3 debug shape: 1.08x the dense path at 256 tokens, 0.85x at 512, 0.60x at
1,024; the debug configs train at 256).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import attrs
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "AttentionPlan",
    "DocumentOffsets",
    "DocumentSlices",
    "Documents",
    "FeedForward",
    "FlexBlockMask",
    "VarlenPlan",
    "attention",
    "document_block_mask",
    "document_offsets",
    "per_document_attention",
    "rms_norm",
    "swiglu",
    "torch_varlen_kernel",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension, in ``x``'s dtype.

    On accelerators through torch's fused kernel; on CPU, where that kernel's forward is slower than the
    composite (torch 2.13, measured), through the composite. Both compute the same thing.
    """
    if x.device.type != "cpu":
        fused: torch.Tensor = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return fused
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


class _SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` that keeps only its two inputs for backward and recomputes ``silu(gate)``.

    Plain autograd would also keep ``silu(gate)``: a third (tokens, hidden) tensor per block.
    """

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad * F.silu(gate)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, keeping only the two inputs for backward when a gradient is needed."""
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        hidden: torch.Tensor = _SwiGLU.apply(gate, up)  # type: ignore[no-untyped-call]
        return hidden
    return F.silu(gate, inplace=True).mul_(up)  # nothing is saved: reuse the gate's buffer


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(swiglu(self.w1(x), self.w3(x)))
        return result


#: Padded-length granularity of the variable-length path: documents whose lengths round up to the same
#: multiple share one attention call. 64 measured best on the CPU (32 and 128 within 10%, powers of two
#: up to 2x slower at 2,048 tokens).
VARLEN_BUCKET = 64
#: Longest row for which the CPU keeps the dense document mask (see the module docstring).
DENSE_MASK_MAX_SEQ = 256
#: FlexAttention's block size (its default): the block mask holds one entry per 128 x 128 tile.
FLEX_BLOCK = 128
#: Most documents in a row for which CUDA takes one causal attention call per document (see the module
#: docstring). On an H200 at 2 x 4,096 tokens (Llama 3.2-1B's heads), forward + backward, against causal
#: attention: FlexAttention's block mask costs 1.81x for rows of 4,000 + 96 tokens, the calls 1.40x (about
#: 0.2 ms a call beyond their share of the causal square); for 16 packed documents a row the block mask
#: costs 0.81x, where 32 calls would cost their launches.
SLICE_MAX_DOCUMENTS = 4


class DocumentSlices(NamedTuple):
    """Every row's documents in turn, as token counts over the flattened ``batch * seq`` tokens (no
    document crosses a row): each is one causal attention call (:func:`_sliced_attention`)."""

    lengths: tuple[int, ...]


class DocumentOffsets(NamedTuple):
    """Every document of the flattened ``batch * seq`` tokens as one sequence of a variable-length kernel.

    The kernel travels with the offsets (as :class:`FlexBlockMask`'s does): ``kernel(q, k, v, offsets)``
    on (tokens, heads, head_dim) tensors returns causal attention inside each document
    (:func:`torch_varlen_kernel` on CUDA; :func:`per_document_attention` anywhere).
    """

    #: (documents + 1,) int32 on the model's device: where every document starts, then ``batch * seq``.
    cu_seqlens: torch.Tensor
    #: The same offsets in host memory, for a kernel that splits the tokens there (no device sync).
    host_offsets: torch.Tensor
    #: The longest document's length (read on the host, with the offsets: no device sync).
    max_len: int
    kernel: Callable[..., Any]


class VarlenPlan(NamedTuple):
    """Where every token goes in the variable-length path (see the module docstring)."""

    #: (documents, padded length) of each group, in the order the groups lie in the padded layout.
    sizes: tuple[tuple[int, int], ...]
    #: (slots,) int64: the token (flat index ``row * seq + position``) each padded slot holds; padding
    #: slots repeat their document's last token (causal attention never lets a real token see them).
    gather: torch.Tensor
    #: (batch * seq,) int64: the padded slot of every token.
    where: torch.Tensor
    #: (slots, 1, 1) bool: True where a slot holds a real token (padding gets no gradient).
    valid: torch.Tensor


class FlexBlockMask(NamedTuple):
    """A FlexAttention ``BlockMask`` with the kernel that runs it (the plan's, compiled once per process).

    The kernel travels with the mask so that ``attention`` reads it from its input: a compiled block traces
    no cache lookup and no import.
    """

    mask: Any
    kernel: Callable[..., Any]


class Documents(NamedTuple):
    """Packed documents of a batch, in the forms the layers consume (see :meth:`AttentionPlan.documents`)."""

    #: (batch, seq) bool: True at the first token of every document after the first one of its row.
    resets: torch.Tensor
    #: (batch, seq) int64: the position of every token inside its document (RoPE positions).
    positions: torch.Tensor
    #: (batch, seq) int64: the document of every token, counted from 0 in each row.
    ids: torch.Tensor
    #: How attention keeps documents apart: :class:`DocumentOffsets`, :class:`DocumentSlices` or a
    #: :class:`FlexBlockMask` (CUDA),
    #: a :class:`VarlenPlan`, a dense (batch, 1, seq, seq) bool mask (CPU rows of at most
    #: ``DENSE_MASK_MAX_SEQ`` tokens), or None when no row holds more than one document (plain causal
    #: attention).
    layout: Any


@attrs.frozen
class AttentionPlan:
    """Which attention kernels one run uses, chosen once (:meth:`for_device`); each batch's layout follows
    from it and from where that batch's document ids are (:meth:`documents`).

    Built explicitly, a plan runs any of the paths on any device that has the kernels: a test or a bench
    passes ``flex=None`` to take the variable-length path on CUDA, or ``slice_max_documents`` on the CPU
    to take one call per document there.
    """

    #: FlexAttention compiled (uncompiled it materialises the scores) where it trains, else None.
    flex: Callable[..., Any] | None = None
    #: A variable-length kernel (see :class:`DocumentOffsets`), taken when the ids are in host memory;
    #: None never.
    varlen: Callable[..., Any] | None = None
    #: Most documents a row may hold for one causal call per document, taken when the ids are in host
    #: memory (their lengths are then read without a device sync); 0 never.
    slice_max_documents: int = 0
    #: Longest row that keeps the dense document mask; 0 never.
    dense_mask_max_seq: int = 0

    @classmethod
    def for_device(cls, device: torch.device | str, compiled: bool = False) -> AttentionPlan:
        """The plan of a run on ``device``'s type whose blocks are ``compiled`` or not, made once per
        process (see the module docstring)."""
        return _plan_for(torch.device(device).type, compiled)

    def documents(
        self,
        document_ids: torch.Tensor,
        shape: tuple[int, ...] | torch.Size,
        device: torch.device | None = None,
    ) -> Documents:
        """Document boundaries from ``document_ids`` (batch, seq): a document starts where the id changes.

        ``shape`` is the (batch, seq) of the tokens; any other shape of ``document_ids`` is an error.
        Nothing of size ``seq x seq`` is built (but the short CPU rows of the module docstring): the block
        mask has ``(seq / 128)^2`` entries per row, and the variable-length plan is a few index vectors of
        about ``batch * seq`` entries. ``device`` is where the model runs: when ``document_ids`` are
        elsewhere (in host memory), the layout is chosen there (no device sync) and the rest moved.
        """
        if tuple(document_ids.shape) != tuple(shape):
            raise ValueError(
                f"document_ids must have the (batch, seq) shape {tuple(shape)} of the tokens, "
                f"got {tuple(document_ids.shape)}"
            )
        resets = F.pad(document_ids[:, 1:] != document_ids[:, :-1], (1, 0))
        index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
        starts = torch.where(resets, index, 0).cummax(dim=1).values
        ids = resets.cumsum(dim=1)  # an id reused later in the row is still a new document
        target = document_ids.device if device is None else torch.device(device)
        layout = self._layout(resets, ids, target)
        positions = index - starts
        if target != document_ids.device:
            resets, positions, ids = (x.to(target, non_blocking=True) for x in (resets, positions, ids))
        return Documents(resets=resets, positions=positions, ids=ids, layout=layout)

    def _layout(self, resets: torch.Tensor, ids: torch.Tensor, device: torch.device) -> Any:
        """The one layout choice of a batch (see :class:`Documents`), made on ``resets``' device and
        placed on ``device``."""
        on_host = resets.device.type == "cpu"
        if self.flex is not None and not on_host:
            return FlexBlockMask(document_block_mask(ids), self.flex)  # no host sync: static shapes
        if not bool(resets.any()):
            return None
        if on_host and self.varlen is not None:
            offsets, max_len = document_offsets(resets)
            return DocumentOffsets(offsets.to(device, non_blocking=True), offsets, max_len, self.varlen)
        if on_host and int(resets.sum(dim=1).max()) < self.slice_max_documents:
            return DocumentSlices(tuple(_document_spans(resets)[1].tolist()))
        if self.flex is not None:
            return FlexBlockMask(document_block_mask(ids.to(device, non_blocking=True)), self.flex)
        if resets.shape[1] <= self.dense_mask_max_seq:
            return (ids[:, :, None] == ids[:, None, :]).tril()[:, None].to(device)
        plan = _varlen_plan(resets)
        if device == resets.device:
            return plan
        return plan._replace(**{k: getattr(plan, k).to(device) for k in ("gather", "where", "valid")})


@functools.cache
def _plan_for(device_type: str, compiled: bool) -> AttentionPlan:
    """:meth:`AttentionPlan.for_device`, once per device type and compilation: FlexAttention trains on
    CUDA only (torch 2.11-2.13), where rows of a few documents take cuDNN's causal kernel instead in eager
    blocks (one call each, measured faster than flash attention's variable-length kernel there) and
    torch's variable-length kernel in compiled ones (one custom op that compiles inline, where a call per
    document would break each block's graph); the CPU keeps the dense mask for short rows; other devices
    take the variable-length path."""
    if device_type == "cuda":
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        if compiled:
            return AttentionPlan(flex=flex, varlen=torch_varlen_kernel())
        return AttentionPlan(flex=flex, slice_max_documents=SLICE_MAX_DOCUMENTS)
    if device_type == "cpu":
        return AttentionPlan(dense_mask_max_seq=DENSE_MASK_MAX_SEQ)
    return AttentionPlan()


def document_block_mask(ids: torch.Tensor, block: int = FLEX_BLOCK) -> Any:
    """FlexAttention ``BlockMask`` for causal attention inside documents, from ``ids`` (batch, seq).

    ``ids`` never decrease along a row, so a tile of keys ``j`` and queries ``i`` (``j <= i``) holds a
    pair of one document iff the key tile's first document is at most the query tile's last and the
    query tile's first at most the key tile's last; it is full (no mask function needed) when both
    tiles lie in one and the same document and ``j < i``. Everything is computed on ``ids``' device
    from the tiles' first and last ids: ``(seq / block)^2`` booleans per row, and no host sync.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, seq = ids.shape
    tiles = -(-seq // block)
    padded = torch.cat((ids, ids[:, -1:].expand(batch, tiles * block - seq)), dim=1)
    grid = padded.view(batch, tiles, block)
    first, last = grid[..., 0], grid[..., -1]
    index = torch.arange(tiles, device=ids.device)
    causal = index[:, None] >= index[None, :]  # (query tile, key tile)
    touch = causal & (first[:, None, :] <= last[:, :, None]) & (first[:, :, None] <= last[:, None, :])
    single = first == last
    full = (
        (index[:, None] > index[None, :])
        & (single[:, :, None] & single[:, None, :])
        & (first[:, :, None] == first[:, None, :])
    )
    partial = touch & ~full

    def ordered(tile_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = tile_mask.sum(-1, dtype=torch.int32)[:, None]
        order = torch.argsort(tile_mask.to(torch.int8), dim=-1, descending=True, stable=True)
        return counts, order.to(torch.int32)[:, None]

    def same_document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (padded[b, q] == padded[b, kv]) & (q >= kv)

    kv_num, kv_index = ordered(partial)
    full_num, full_index = ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_index,
        full_num,
        full_index,
        BLOCK_SIZE=block,
        mask_mod=same_document,
        seq_lengths=(seq, seq),
    )


def document_offsets(resets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``cu_seqlens`` (documents + 1,) int32 of the flattened rows and the longest document's length.

    Every row start and every reset opens a document (none crosses a row); read on ``resets``' device.
    """
    starts, lengths = _document_spans(resets)
    ends = starts.new_tensor([resets.numel()])
    return torch.cat((starts, ends)).to(torch.int32), int(lengths.max())


@torch.compiler.disable  # reads the offsets on the host: eager (the CPU's and fp32's path, not a fast one)
def per_document_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: DocumentOffsets
) -> torch.Tensor:
    """Causal attention of each document alone, one SDPA call each on views of its tokens: the reference
    of the variable-length kernels' interface (see :class:`DocumentOffsets`), and what serves where flash
    attention does not (the CPU, float32). The lengths are read from the host copy of the offsets."""
    slices = DocumentSlices(tuple(torch.diff(offsets.host_offsets).tolist()))
    out: torch.Tensor = _sliced_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), slices)
    return out.squeeze(0)


def torch_varlen_kernel() -> Callable[..., Any] | None:
    """torch's ``varlen_attn`` (flash attention) behind the :class:`DocumentOffsets` interface, or None
    where this torch lacks it or flash attention is not built.

    Its keyword arguments changed across releases: causal attention is ``window_size=(-1, 0)`` (2.11 on)
    or ``is_causal=True`` (2.10); grouped-query attention is ``enable_gqa=True`` where it exists, else the
    key/value heads are repeated (a copy). It is a custom op with a fake implementation and an autograd
    formula, so dynamo traces it into a compiled block (no graph break; a new ``max_len`` or document count
    recompiles once, then both are dynamic). float32 (which flash attention refuses) takes
    :func:`per_document_attention`.
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if not torch.backends.cuda.is_flash_attention_available():
        return None
    parameters = inspect.signature(varlen_attn).parameters
    causal: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
    native_gqa = "enable_gqa" in parameters

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: DocumentOffsets) -> torch.Tensor:
        if q.dtype not in (torch.bfloat16, torch.float16):
            reference: torch.Tensor = per_document_attention(q, k, v, offsets)
            return reference
        extra = dict(causal)
        if q.shape[1] != k.shape[1]:
            if native_gqa:
                extra["enable_gqa"] = True
            else:
                groups = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        cu_seqlens, max_len = offsets.cu_seqlens, offsets.max_len
        out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **extra)
        return cast(torch.Tensor, out)  # a tensor: no auxiliary output is asked for

    return kernel


def _document_spans(resets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Start (flat index ``row * seq + position``) and length of every document, row after row."""
    first = resets.clone()
    first[:, 0] = True
    starts = first.flatten().nonzero().squeeze(1)
    return starts, torch.diff(starts, append=starts.new_tensor([resets.numel()]))


def _varlen_plan(resets: torch.Tensor, bucket: int = VARLEN_BUCKET) -> VarlenPlan:
    """Group every document of the batch with those of its padded length (see :class:`VarlenPlan`)."""
    batch, seq = resets.shape
    starts, lengths = _document_spans(resets)
    padded = ((lengths + bucket - 1) // bucket * bucket).clamp(max=seq)
    sizes, gathers, valids = [], [], []
    where = torch.empty(batch * seq, dtype=torch.long, device=resets.device)
    offset = 0
    for length in sorted(set(padded.tolist())):
        chosen = (padded == length).nonzero().squeeze(1)
        start, count = starts[chosen], lengths[chosen]
        slot = torch.arange(length, device=resets.device)
        tokens = start[:, None] + torch.minimum(slot[None, :], count[:, None] - 1)
        valid = slot[None, :] < count[:, None]
        where[tokens[valid]] = torch.arange(offset, offset + tokens.numel(), device=resets.device).view_as(
            tokens
        )[valid]
        sizes.append((len(chosen), length))
        gathers.append(tokens.flatten())
        valids.append(valid.flatten())
        offset += tokens.numel()
    return VarlenPlan(tuple(sizes), torch.cat(gathers), where, torch.cat(valids)[:, None, None])


class _ToPadded(torch.autograd.Function):
    """Rows ``x[gather]``; backward reads each token's gradient from its own slot (``where``).

    Padding slots copy a real token, but nothing real depends on them (they follow their document's last
    token, and their outputs are dropped), so the gradient of a token is its slot's alone.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, gather: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(where)
        return x.index_select(0, gather)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (where,) = ctx.saved_tensors
        return grad.index_select(0, where), None, None


class _FromPadded(torch.autograd.Function):
    """Rows ``x[where]`` (each token's slot); backward gives padding slots a zero gradient."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, where: torch.Tensor, gather: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(gather, valid)
        return x.index_select(0, where)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        gather, valid = ctx.saved_tensors
        return grad.index_select(0, gather).masked_fill_(~valid, 0), None, None, None


@torch.compiler.disable  # data-dependent group sizes: eager, not a recompilation per batch
def _varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan) -> torch.Tensor:
    """Causal attention of each document alone; (batch, seq, heads, head_dim) in and out."""
    batch, seq, heads, head_dim = q.shape
    flat = [
        _ToPadded.apply(x.reshape(batch * seq, x.shape[2], head_dim), plan.gather, plan.where)  # type: ignore[no-untyped-call]
        for x in (q, k, v)
    ]
    # split, not slicing: one backward concatenation instead of a zero-filled gradient per group.
    groups = [count * length for count, length in plan.sizes]
    outputs = []
    for (count, length), qp, kp, vp in zip(plan.sizes, *(x.split(groups) for x in flat), strict=True):
        qp, kp, vp = (x.view(count, length, -1, head_dim).transpose(1, 2) for x in (qp, kp, vp))
        out = F.scaled_dot_product_attention(
            qp, kp, vp, is_causal=True, enable_gqa=qp.shape[1] != kp.shape[1]
        )
        outputs.append(out.transpose(1, 2).reshape(count * length, heads, head_dim))
    joined = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    result: torch.Tensor = _FromPadded.apply(joined, plan.where, plan.gather, plan.valid)  # type: ignore[no-untyped-call]
    return result.view(batch, seq, heads, head_dim)


@torch.compiler.disable  # the documents' lengths change every batch: eager, not a recompilation per batch
def _sliced_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slices: DocumentSlices
) -> torch.Tensor:
    """Causal attention of each document alone, one call on views of its tokens; (batch, seq, heads,
    head_dim) in and out. Splitting the flattened rows (not slicing them) makes the backward one
    concatenation of the documents' gradients, not one zero-filled full-size gradient per document."""
    batch, seq, heads, head_dim = q.shape
    gqa = heads != k.shape[2]
    lengths = list(slices.lengths)
    parts = [torch.split(x.reshape(1, batch * seq, x.shape[2], head_dim), lengths, dim=1) for x in (q, k, v)]
    outputs = [
        F.scaled_dot_product_attention(
            qd.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2), is_causal=True, enable_gqa=gqa
        ).transpose(1, 2)
        for qd, kd, vd in zip(*parts, strict=True)
    ]
    return torch.cat(outputs, dim=1).view(batch, seq, heads, head_dim)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents | None = None
) -> torch.Tensor:
    """Causal (grouped-query) attention of ``q`` (batch, seq, heads, head_dim) over ``k``/``v`` (batch,
    seq, kv_heads, head_dim), inside documents when ``documents`` says where they are.

    Returns (batch, seq, heads, head_dim). No attention mask tensor is built but for short CPU rows
    (see the module docstring).
    """
    layout = None if documents is None else documents.layout
    gqa = q.shape[2] != k.shape[2]  # no copies of the key/value heads
    if isinstance(layout, DocumentOffsets):
        batch, seq, heads, head_dim = q.shape
        flat = [x.reshape(batch * seq, x.shape[2], head_dim) for x in (q, k, v)]
        packed: torch.Tensor = layout.kernel(*flat, layout)
        return packed.view(batch, seq, heads, head_dim)
    if isinstance(layout, VarlenPlan):
        varlen: torch.Tensor = _varlen_attention(q, k, v, layout)
        return varlen
    if isinstance(layout, DocumentSlices):
        sliced: torch.Tensor = _sliced_attention(q, k, v, layout)
        return sliced
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if layout is None:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    elif isinstance(layout, FlexBlockMask):
        out = layout.kernel(qt, kt, vt, block_mask=layout.mask, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=layout, enable_gqa=gqa)
    result: torch.Tensor = out.transpose(1, 2)
    return result
