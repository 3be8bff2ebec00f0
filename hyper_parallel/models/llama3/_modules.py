"""Llama 3 decoder in plain PyTorch (imported lazily by ``_runtime``; never at config-resolution time).

Layout and parameter names follow Meta's reference implementation: ``tok_embeddings``, ``layers.<i>``
with ``attention.{wq,wk,wv,wo}``, ``attention_norm``, ``feed_forward.{w1,w2,w3}``, ``ffn_norm``, then
``norm`` and ``output``. Rotary embeddings rotate interleaved pairs ``(x[2i], x[2i+1])`` as Meta does; the
state-dict adapter permutes the query/key rows of Hugging Face checkpoints (half-split layout) into it.

Packed sequences: ``forward(tokens, document_ids=...)`` keeps the documents of a row apart exactly as if
each ran alone (attention masked to the document, RoPE positions restarting at every document).

Decoding: ``forward(tokens, cache=InferenceCache(...))`` runs only the new tokens and keeps every block's
keys and values in the cache (``hyper_parallel.models._inference``); without a cache nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hyper_parallel.models._layers import AttentionPlan, Documents, FeedForward, attention, rms_norm
from hyper_parallel.models.llama3.args import Llama3Args, RopeScaling

if TYPE_CHECKING:
    from hyper_parallel.models._inference import InferenceCache, LayerCache

__all__ = ["Llama3Model", "build_llama3", "rope_inverse_frequencies"]


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None, device: torch.device | None = None
) -> torch.Tensor:
    """Inverse RoPE frequencies (``head_dim // 2``), with Llama 3.1's frequency-dependent scaling."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rope_rotations(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Unit complex rotations ``exp(i * position * frequency)``: positions (...,) -> (..., head_dim // 2)."""
    angles = positions.float()[..., None] * inv_freq.to(positions.device)
    return torch.polar(torch.ones_like(angles), angles)


def apply_interleaved_rope(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x[..., 2i], x[..., 2i+1])`` of ``x`` (batch, seq, heads, head_dim) in fp32.

    Each pair is a complex number multiplied by its rotation; ``rotations`` is (seq, head_dim // 2) or
    per sample (batch, seq, head_dim // 2).
    """
    pairs = torch.view_as_complex(torch.unflatten(x.float(), -1, (-1, 2)))
    rotated = pairs * rotations.unsqueeze(-2)  # broadcast over heads
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm computed in fp32: ``weight * x / rms(x)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # weight folded in: the same arithmetic
            return rms_norm(x, self.weight, self.eps)
        return self.weight * rms_norm(x.float(), None, self.eps).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    """Grouped-query causal self-attention with rotary embeddings."""

    def __init__(self, args: Llama3Args) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads or args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        documents: Documents | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        """Causal attention, inside the packed ``documents`` when given (no mask tensor is built).

        With ``cache``, ``x`` holds the new tokens only: their keys and values join the cached ones.
        """
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_interleaved_rope(q, rope), apply_interleaved_rope(k, rope)
        if cache is None:
            out = attention(q, k, v, documents)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            k, v, mask, is_causal = cache.attend(k, v)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1]
            ).transpose(1, 2)
        result: torch.Tensor = self.wo(out.reshape(batch, seq, -1))
        return result


class TransformerBlock(nn.Module):
    """Pre-norm block: attention then SwiGLU, each with a residual connection."""

    def __init__(self, args: Llama3Args) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        documents: Documents | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        h: torch.Tensor = x + self.attention(self.attention_norm(x), rope, documents=documents, cache=cache)
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Llama3Model(nn.Module):
    """The Llama 3 decoder: token ids (batch, seq) to logits (batch, seq, vocab)."""

    def __init__(self, args: Llama3Args) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(args.vocab_size, args.dim)
        # Keyed by index, so a pipeline stage can drop the blocks it does not own and keep the names
        # (``layers.<i>.*``) of the whole model.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Linear | None = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()
        #: Sequence shards of the residual stream a stage without embeddings receives (tensor
        #: parallelism with sequence parallelism sets it); the rotary embedding needs the full length.
        self.residual_sequence_shards = 1
        #: How attention keeps packed documents apart; None: the plan of the device the batch runs on
        #: (``AttentionPlan.for_device``).
        self.attention_plan: AttentionPlan | None = None

    def tie_weights(self) -> None:
        """Share the embedding matrix with the output projection when ``tie_word_embeddings``."""
        if self.args.tie_word_embeddings and self.output is not None and self.tok_embeddings is not None:
            self.output.weight = self.tok_embeddings.weight

    def rope(self, seq_len: int, device: torch.device, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Complex rotations of the rotary embedding, computed in fp32.

        (seq_len, head_dim // 2) for positions ``0 .. seq_len - 1``, or (batch, seq, head_dim // 2) for
        per-token ``positions`` (batch, seq).
        """
        if seq_len > self.args.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_seq_len {self.args.max_seq_len}")
        head_dim = self.args.dim // self.args.n_heads
        inv_freq = rope_inverse_frequencies(head_dim, self.args.rope_theta, self.args.rope_scaling, device)
        if positions is None:
            positions = torch.arange(seq_len, device=device)
        return _rope_rotations(inv_freq, positions)

    def forward(
        self,
        tokens: torch.Tensor,
        document_ids: torch.Tensor | None = None,
        cache: InferenceCache | None = None,
        head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits (batch, seq, vocab) of ``tokens`` (batch, seq).

        ``document_ids`` (batch, seq): the document of every token when several are packed in a row
        (a new document starts wherever the id changes). Tokens then attend only within their document
        and RoPE positions restart at each, as if each document ran alone; ``None`` treats each row as
        one sequence.

        A pipeline stage (see ``hyper_parallel.parallel.pipeline``) lacks what it does not own: without
        ``tok_embeddings`` the input is the residual stream (batch, seq, dim) of the previous stage, and
        without ``norm``/``output`` the residual stream is returned instead of logits.

        ``cache`` (decoding): ``tokens`` follow the ``cache.position`` tokens the cache holds; only they
        are computed, and the cache keeps their keys and values.

        ``head`` replaces the output projection: it is called with the normed final hidden states and the
        output weight, inside this forward (where FSDP holds the weight gathered), and what it returns is
        returned (the fused, chunked loss: ``components/loss/_chunked.py``).
        """
        if cache is not None:
            return self._decode(tokens, cache)
        if self.tok_embeddings is not None:
            h: torch.Tensor = self.tok_embeddings(tokens)
            seq_len = tokens.shape[1]
        else:
            h, seq_len = tokens, tokens.shape[1] * self.residual_sequence_shards
        plan = self.attention_plan or AttentionPlan.for_device(h.device)
        documents = (
            None if document_ids is None else plan.documents(document_ids, (h.shape[0], seq_len), h.device)
        )
        positions = None if documents is None else documents.positions
        rope = self.rope(seq_len, h.device, positions)
        for layer in self.layers.values():
            h = layer(h, rope, documents=documents)
        if self.norm is not None:
            h = self.norm(h)
        if head is not None and self.output is not None:
            return head(h, self.output.weight)
        if self.output is not None:
            h = self.output(h)
        return h

    def _decode(self, tokens: torch.Tensor, cache: InferenceCache) -> torch.Tensor:
        """Logits of ``tokens`` at positions ``cache.position`` on (the RoPE rows of the whole sequence)."""
        if self.tok_embeddings is None or self.norm is None or self.output is None:
            raise ValueError("decoding with a cache needs the whole model, not a pipeline stage")
        start, seq = cache.position, tokens.shape[1]
        h: torch.Tensor = self.tok_embeddings(tokens)
        rope = self.rope(start + seq, h.device)[start:]
        for name, layer in self.layers.items():
            h = layer(h, rope, cache=cache.layer(name))
        cache.advance(seq)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    @torch.no_grad()
    def init_weights(self, std: float = 0.02) -> None:
        """Random initialisation (normal embeddings, truncated-normal linears, unit norms)."""
        depth_std = std / math.sqrt(2 * self.args.n_layers)
        if self.tok_embeddings is not None:
            tied = self.args.tie_word_embeddings  # then also the output: scaled like it
            nn.init.normal_(self.tok_embeddings.weight, std=self.args.dim**-0.5 if tied else 1.0)
        for layer in self.layers.values():
            assert isinstance(layer, TransformerBlock)
            for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv):
                nn.init.trunc_normal_(linear.weight, std=std)
            nn.init.trunc_normal_(layer.attention.wo.weight, std=depth_std)
            nn.init.trunc_normal_(layer.feed_forward.w1.weight, std=std)
            for linear in (layer.feed_forward.w2, layer.feed_forward.w3):
                nn.init.trunc_normal_(linear.weight, std=depth_std)
            layer.attention_norm.reset_parameters()
            layer.ffn_norm.reset_parameters()
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None and not self.args.tie_word_embeddings:
            final_std = self.args.dim**-0.5
            nn.init.trunc_normal_(self.output.weight, std=final_std, a=-3 * final_std, b=3 * final_std)


def build_llama3(args: Llama3Args, device: str) -> Llama3Model:
    """The module on ``device``; initialised unless ``device`` is ``"meta"``."""
    with torch.device(device):
        model = Llama3Model(args)
    if torch.device(device).type != "meta":
        model.init_weights()
    return model
