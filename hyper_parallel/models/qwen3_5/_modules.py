"""Qwen 3.5 hybrid language model in plain PyTorch (imported lazily by ``_runtime``).

Every ``full_attention_interval``-th block uses gated full attention (sigmoid output gate, per-head
zero-centred RMSNorm on queries and keys, partial rotary embedding in the half-split layout); the other
blocks use Gated DeltaNet linear attention (causal depthwise convolution over q/k/v, L2-normalised
queries and keys, the gated delta rule recurrence, a gated RMSNorm on the output). All residual norms are
zero-centred: ``x / rms(x) * (1 + weight)``. The gated delta rule runs chunk by chunk (see
``_gated_delta``); attention goes through ``scaled_dot_product_attention`` with the causal flag.

Packed sequences: ``forward(tokens, document_ids=...)`` keeps the documents of a row apart exactly as if
each ran alone: attention is masked to the document, RoPE positions restart at every document, and the
Gated DeltaNet convolution and state restart at its first token.

Decoding: ``forward(tokens, cache=InferenceCache(...))`` runs only the new tokens; attention blocks keep
their keys and values in the cache, Gated DeltaNet blocks the last inputs of their convolution and their
recurrent state (``hyper_parallel.models._inference``). Without a cache nothing changes.

Parameter names: ``tok_embeddings``, ``layers.<i>.{attention_norm, ffn_norm, feed_forward.{w1,w2,w3}}``,
full-attention blocks ``layers.<i>.attention.{wq, wk, wv, wo, q_norm, k_norm}`` (``wq`` yields query
and gate interleaved per head), linear blocks ``layers.<i>.linear_attn.{in_proj_q, in_proj_k,
in_proj_v, in_proj_z, in_proj_b, in_proj_a, conv_q, conv_k, conv_v, dt_bias, A_log, norm, out_proj}``
(Hugging Face's fused ``in_proj_qkv`` and ``conv1d`` split into q, k and v parts), then ``norm`` and
``output``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from hyper_parallel.models._layers import AttentionPlan, Documents, FeedForward, attention, rms_norm
from hyper_parallel.models.qwen3_5._gated_delta import (
    fla_kernel,
    fla_serves,
    gated_delta_rule,
    recurrent_gated_delta_rule,
)
from hyper_parallel.models.qwen3_5.args import Qwen3_5Args

if TYPE_CHECKING:
    from hyper_parallel.models._inference import InferenceCache, LayerCache

#: Frequencies given to the (time, height, width) axes of M-RoPE, interleaved; the released value.
MROPE_SECTIONS = (11, 11, 10)

__all__ = [
    "GatedAttention",
    "GatedDeltaNet",
    "Qwen3_5Model",
    "build_qwen3_5",
    "gated_delta_rule",
    "recurrent_gated_delta_rule",
]


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm with weight stored around zero: ``x / rms(x) * (1 + weight)``, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x.float(), 1.0 + self.weight.float(), self.eps).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last dimension followed by a SiLU gate: ``weight * x / rms(x) * silu(gate)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # weight folded in: the same arithmetic
            return rms_norm(x, self.weight, self.eps) * F.silu(gate)
        normed = rms_norm(x.float(), None, self.eps).type_as(x)
        return (self.weight * normed * F.silu(gate.float())).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of ``x`` (..., head_dim), half-split; cos/sin broadcast."""
    rotary = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    rotated = x_rot * cos + _rotate_half(x_rot) * sin
    return torch.cat((rotated, x_pass), dim=-1)


class GatedAttention(nn.Module):
    """GQA softmax attention with q/k RMSNorm, partial RoPE and a sigmoid gate on the output."""

    def __init__(self, args: Qwen3_5Args) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim * 2, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(args.head_dim, args.norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(args.head_dim, args.norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        documents: Documents | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """Causal attention, inside the packed ``documents`` when given (no mask tensor is built).

        With ``cache``, ``x`` holds the new tokens only: their keys and values join the cached ones.
        """
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        query, gate = self.wq(x).view(batch, seq, -1, 2 * self.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(batch, seq, -1)
        q = self.q_norm(query)
        k = self.k_norm(self.wk(x).view(batch, seq, -1, self.head_dim))
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        cos, sin = rope
        if cos.dim() == 3:  # per-sample positions (batch, seq, rotary): broadcast over heads
            cos, sin = cos[:, :, None], sin[:, :, None]
        else:  # (seq, rotary): broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        if cache is None:
            out = attention(q, k, v, documents)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            k, v, mask, is_causal = cache.attend(k, v)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1]
            ).transpose(1, 2)
        out = out.reshape(batch, seq, -1)
        result: torch.Tensor = self.wo(out * torch.sigmoid(gate))
        return result


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local shard of a tensor-parallel (DTensor) parameter; a plain tensor unchanged.

    An ``isinstance`` test (not a ``getattr`` probe) so ``torch.compile`` can trace through it.
    """
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _causal_conv(x: torch.Tensor, weight: torch.Tensor, resets: torch.Tensor | None) -> torch.Tensor:
    """SiLU of the causal depthwise convolution of ``x`` (batch, channels, seq) by ``weight`` (C, K).

    With ``resets`` (batch, seq), a window never reaches back across the first token of a document.
    """
    seq, kernel = x.shape[-1], weight.shape[-1]
    if resets is None:
        out = F.conv1d(x, weight.unsqueeze(1), padding=kernel - 1, groups=weight.shape[0])[..., :seq]
        return F.silu(out)
    doc = resets.long().cumsum(1)
    out = x * weight[:, -1:]
    for shift in range(1, min(kernel, seq)):
        same_doc = F.pad(doc[:, shift:] == doc[:, :-shift], (shift, 0))[:, None]
        earlier = F.pad(x[..., :-shift], (shift, 0))
        out = out + earlier * weight[:, kernel - 1 - shift, None] * same_doc
    return F.silu(out)


def _cached_conv(x: torch.Tensor, weight: torch.Tensor, cache: LayerCache) -> torch.Tensor:
    """:func:`_causal_conv` of new inputs ``x`` that follow the ones ``cache.conv`` keeps (zeros at first).

    Keeps the last ``kernel - 1`` inputs for the next call.
    """
    reach = weight.shape[-1] - 1
    past = cache.conv if cache.conv is not None else x.new_zeros((*x.shape[:2], reach))
    window = torch.cat((past, x), dim=-1)
    cache.conv = window[..., window.shape[-1] - reach :]
    return F.silu(F.conv1d(window, weight.unsqueeze(1), groups=weight.shape[0]))


class GatedDeltaNet(nn.Module):
    """Linear-attention token mixer of Qwen 3.5 (Gated DeltaNet with a short causal convolution).

    Hugging Face fuses the q, k and v projections (``in_proj_qkv``) and their depthwise convolution
    (``conv1d``); here each has its own parameter (``in_proj_{q,k,v}``, ``conv_{q,k,v}``) so that tensor
    parallelism can split all of them by heads with plain ``Shard(0)`` placements. The state-dict adapter
    splits and concatenates them. Every per-head size is inferred from the (possibly local) tensors, so
    the forward works unchanged on a rank holding a slice of the key and value heads.
    """

    def __init__(self, args: Qwen3_5Args) -> None:
        super().__init__()
        #: flash-linear-attention's kernel (None: the PyTorch chunked one), chosen when the layer is built,
        #: outside any compiled block (see _gated_delta); set None to run the PyTorch kernel.
        self.fla: Callable[..., Any] | None = fla_kernel(args.linear_key_head_dim)
        self.n_k_heads = args.linear_num_key_heads
        self.n_v_heads = args.linear_num_value_heads
        self.head_k_dim = args.linear_key_head_dim
        self.head_v_dim = args.linear_value_head_dim
        self.key_dim = self.n_k_heads * self.head_k_dim
        self.value_dim = self.n_v_heads * self.head_v_dim
        self.kernel = args.linear_conv_kernel_dim
        self.chunk_size = args.linear_chunk_size
        self.in_proj_q = nn.Linear(args.dim, self.key_dim, bias=False)
        self.in_proj_k = nn.Linear(args.dim, self.key_dim, bias=False)
        self.in_proj_v = nn.Linear(args.dim, self.value_dim, bias=False)
        self.in_proj_z = nn.Linear(args.dim, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(args.dim, self.n_v_heads, bias=False)
        self.in_proj_a = nn.Linear(args.dim, self.n_v_heads, bias=False)
        self.conv_q = nn.Parameter(torch.empty(self.key_dim, self.kernel))
        self.conv_k = nn.Parameter(torch.empty(self.key_dim, self.kernel))
        self.conv_v = nn.Parameter(torch.empty(self.value_dim, self.kernel))
        self.dt_bias = nn.Parameter(torch.ones(self.n_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, args.norm_eps)
        self.out_proj = nn.Linear(self.value_dim, args.dim, bias=False)

    def forward(
        self, x: torch.Tensor, resets: torch.Tensor | None = None, cache: LayerCache | None = None
    ) -> torch.Tensor:
        """``resets`` (batch, seq) bool: True at the first token of a packed document (state restarts).

        With ``cache``, ``x`` holds the new tokens only: the convolution continues from the inputs the
        cache keeps and the recurrence from its state, and both are updated.
        """
        # One convolution over q, k and v: the transposed projections are concatenated by channel
        # (the one copy the channels-first convolution needs anyway), then split again as views.
        projected = (self.in_proj_q(x), self.in_proj_k(x), self.in_proj_v(x))
        channels = [p.shape[-1] for p in projected]  # rank-local under tensor parallelism
        mixed = torch.cat([p.transpose(1, 2) for p in projected], dim=1)
        weight = torch.cat((_local(self.conv_q), _local(self.conv_k), _local(self.conv_v)))
        convolved = (
            _causal_conv(mixed, weight, resets) if cache is None else _cached_conv(mixed, weight, cache)
        )
        q, k, v = torch.split(convolved.transpose(1, 2), channels, dim=-1)
        # -1 heads: under tensor parallelism each rank holds a slice of the key and value heads.
        q = torch.unflatten(q, -1, (-1, self.head_k_dim))
        k = torch.unflatten(k, -1, (-1, self.head_k_dim))
        v = torch.unflatten(v, -1, (-1, self.head_v_dim))
        beta = torch.sigmoid(self.in_proj_b(x))
        decay_rate = -_local(self.A_log).float().exp()
        log_decay = decay_rate * F.softplus(self.in_proj_a(x).float() + _local(self.dt_bias))
        initial = None if cache is None else cache.state
        fla = self.fla if fla_serves(q) else None
        out, state = gated_delta_rule(
            q,
            k,
            v,
            log_decay,
            beta,
            chunk_size=self.chunk_size,
            initial_state=initial,
            resets=resets,
            fla=fla,
        )
        if cache is not None:
            cache.state = state
        z = torch.unflatten(self.in_proj_z(x), -1, (-1, self.head_v_dim))
        result: torch.Tensor = self.out_proj(self.norm(out, z).flatten(2))
        return result

    @torch.no_grad()
    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.kernel)
        for conv in (self.conv_q, self.conv_k, self.conv_v):
            nn.init.uniform_(conv, -bound, bound)
        nn.init.ones_(self.dt_bias)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0.01, 16.0).log())
        self.norm.reset_parameters()


class HybridBlock(nn.Module):
    """Pre-norm block whose token mixer is gated full attention or Gated DeltaNet."""

    def __init__(self, args: Qwen3_5Args, layer_type: str, feed_forward: nn.Module | None = None) -> None:
        """``feed_forward``: the block's channel mixer (a mixture of experts); ``None`` a dense SwiGLU."""
        super().__init__()
        self.layer_type = layer_type
        self.attention_norm = ZeroCenteredRMSNorm(args.dim, args.norm_eps)
        self.attention: GatedAttention | None = None
        self.linear_attn: GatedDeltaNet | None = None
        if layer_type == "full_attention":
            self.attention = GatedAttention(args)
        else:
            self.linear_attn = GatedDeltaNet(args)
        self.ffn_norm = ZeroCenteredRMSNorm(args.dim, args.norm_eps)
        self.feed_forward = feed_forward or FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        documents: Documents | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        normed = self.attention_norm(x)
        if self.attention is not None:
            mixed = self.attention(normed, rope, documents=documents, cache=cache)
        else:
            assert self.linear_attn is not None
            resets = None if documents is None else documents.resets
            mixed = self.linear_attn(normed, resets=resets, cache=cache)
        h: torch.Tensor = x + mixed
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Qwen3_5Model(nn.Module):
    """The Qwen 3.5 hybrid language model: token ids (batch, seq) to logits (batch, seq, vocab)."""

    def __init__(self, args: Qwen3_5Args) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(self.make_block(args, kind) for kind in args.layer_types())
        self.norm = ZeroCenteredRMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        #: How attention keeps packed documents apart; None: the plan of the device the batch runs on
        #: (``AttentionPlan.for_device``).
        self.attention_plan: AttentionPlan | None = None

    def make_block(self, args: Qwen3_5Args, layer_type: str) -> HybridBlock:
        """One block of ``layer_type`` (a subclass gives it another feed-forward network)."""
        return HybridBlock(args, layer_type)

    def tie_weights(self) -> None:
        """Share the embedding matrix with the output projection when ``tie_word_embeddings``."""
        if self.args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def rope(
        self, seq_len: int, device: torch.device, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the partial rotary embedding, in fp32.

        Without ``positions``: (seq_len, rotary_dim) for positions ``0 .. seq_len - 1``. With
        multimodal ``positions`` (3, batch, seq) of temporal/height/width indices: (batch, seq,
        rotary_dim), the frequencies interleaved between the three axes as in Qwen's M-RoPE (frequency
        ``i`` follows height if ``i % 3 == 1`` and ``i < 3 * sections[1]``, width if ``i % 3 == 2`` and
        ``i < 3 * sections[2]``, else time). Equal axes give the plain 1-D embedding.
        """
        rotary_dim = int(self.args.head_dim * self.args.partial_rotary_factor)
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
        inv_freq = 1.0 / (self.args.rope_theta**exponents)
        if positions is None:
            angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
        else:
            per_axis = positions.float()[..., None] * inv_freq  # (3, batch, seq, rotary_dim // 2)
            index = torch.arange(inv_freq.shape[0], device=device)
            axis = torch.zeros_like(index)
            axis[(index % 3 == 1) & (index < 3 * MROPE_SECTIONS[1])] = 1
            axis[(index % 3 == 2) & (index < 3 * MROPE_SECTIONS[2])] = 2
            angles = per_axis.gather(0, axis.expand_as(per_axis)[:1]).squeeze(0)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings (batch, seq, dim)."""
        h: torch.Tensor = self.tok_embeddings(tokens)
        return h

    def forward_embeddings(
        self,
        h: torch.Tensor,
        positions: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits from input embeddings (batch, seq, dim), e.g. with image features merged in.

        ``positions`` (3, batch, seq) are multimodal RoPE positions; ``None`` means ``0 .. seq - 1``, or
        the position inside each document when ``document_ids`` (see ``forward``) are given. ``head``
        (see ``forward``) replaces the output projection.
        """
        plan = self.attention_plan or AttentionPlan.for_device(h.device)
        documents = None if document_ids is None else plan.documents(document_ids, h.shape[:2], h.device)
        if positions is None and documents is not None:
            positions = documents.positions.expand(3, *documents.positions.shape)
        # Angles in fp32, applied in the activations' dtype (FSDP's mixed precision casts them likewise).
        rope = tuple(r.to(h.dtype) for r in self.rope(h.shape[1], h.device, positions))
        for layer in self.layers:
            h = layer(h, rope, documents=documents)
        if head is not None:
            return head(self.norm(h), self.output.weight)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    def forward(
        self,
        tokens: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        cache: InferenceCache | None = None,
        head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) of ``tokens`` (batch, seq).

        ``document_ids`` (batch, seq): the document of every token when several are packed in a row
        (a new document starts wherever the id changes). Tokens then see only their own document, as if
        each document ran alone; ``None`` treats each row as one sequence.

        ``cache`` (decoding): ``tokens`` follow the ``cache.position`` tokens the cache holds; only they
        are computed, and the cache keeps what the next call needs.

        ``head`` replaces the output projection: it is called with the normed final hidden states and the
        output weight, inside this forward (where FSDP holds the weight gathered), and what it returns is
        returned (the fused, chunked loss: ``components/loss/_chunked.py``).
        """
        if cache is not None:
            return self._decode(tokens, cache)
        return self.forward_embeddings(self.embed(tokens), document_ids=document_ids, head=head)

    def _decode(self, tokens: torch.Tensor, cache: InferenceCache) -> torch.Tensor:
        """Logits of ``tokens`` at positions ``cache.position`` on (the RoPE rows of the whole sequence)."""
        start, seq = cache.position, tokens.shape[1]
        h = self.embed(tokens)
        cos, sin = self.rope(start + seq, h.device)
        rope = (cos[start:], sin[start:])
        for index, layer in enumerate(self.layers):
            h = layer(h, rope, cache=cache.layer(str(index)))
        cache.advance(seq)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random initialisation: normal linears and embeddings, zero-centred norms, DeltaNet defaults."""
        self.tie_weights()
        nn.init.normal_(self.tok_embeddings.weight, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module is not self.output:
                nn.init.trunc_normal_(module.weight, std=std)
            elif isinstance(module, (ZeroCenteredRMSNorm, GatedRMSNorm, GatedDeltaNet)):
                module.reset_parameters()
        if not self.args.tie_word_embeddings:
            nn.init.trunc_normal_(self.output.weight, std=std)


def build_qwen3_5(args: Qwen3_5Args, device: str) -> Qwen3_5Model:
    """The module on ``device``; initialised unless ``device`` is ``"meta"``."""
    with torch.device(device):
        model = Qwen3_5Model(args)
    if torch.device(device).type != "meta":
        model.init_weights()
    return model
