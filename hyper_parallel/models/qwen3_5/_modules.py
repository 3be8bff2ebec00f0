"""Qwen 3.5 hybrid language model in plain PyTorch (imported lazily by ``runtime``).

Every ``full_attention_interval``-th block uses gated full attention (sigmoid output gate, per-head
zero-centred RMSNorm on queries and keys, partial rotary embedding in the half-split layout); the other
blocks use Gated DeltaNet linear attention (causal depthwise convolution over q/k/v, L2-normalised
queries and keys, the gated delta rule recurrence, a gated RMSNorm on the output). All residual norms are
zero-centred: ``x / rms(x) * (1 + weight)``. The recurrence is a plain token-by-token loop in fp32 (a
reference implementation: correct, not fast).

Parameter names: ``tok_embeddings``, ``layers.<i>.{attention_norm, ffn_norm, feed_forward.{w1,w2,w3}}``,
full-attention blocks ``layers.<i>.attention.{wq, wk, wv, wo, q_norm, k_norm}`` (``wq`` yields query
and gate interleaved per head), linear blocks ``layers.<i>.linear_attn.{in_proj_q, in_proj_k,
in_proj_v, in_proj_z, in_proj_b, in_proj_a, conv_q, conv_k, conv_v, dt_bias, A_log, norm, out_proj}``
(Hugging Face's fused ``in_proj_qkv`` and ``conv1d`` split into q, k and v parts), then ``norm`` and
``output``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hyper_parallel.models._layers import FeedForward
from hyper_parallel.models.qwen3_5.args import Qwen3_5Args

#: Frequencies given to the (time, height, width) axes of M-RoPE, interleaved; the released value.
MROPE_SECTIONS = (11, 11, 10)

__all__ = ["GatedAttention", "GatedDeltaNet", "Qwen3_5Model", "build_qwen3_5", "gated_delta_rule"]


class ZeroCenteredRMSNorm(nn.Module):
    """RMSNorm with weight stored around zero: ``x / rms(x) * (1 + weight)``, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last dimension followed by a SiLU gate: ``weight * x / rms(x) * silu(gate)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return (self.weight * normed * F.silu(gate.float())).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` features of ``x`` (batch, heads, seq, head_dim), half-split."""
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

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        query, gate = self.wq(x).view(batch, seq, -1, 2 * self.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(batch, seq, -1)
        q = self.q_norm(query).transpose(1, 2)
        k = self.k_norm(self.wk(x).view(batch, seq, -1, self.head_dim)).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        cos, sin = rope
        if cos.dim() == 3:  # per-sample positions (batch, seq, rotary): broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        repeats = q.shape[1] // k.shape[1]
        if repeats > 1:
            k = k.repeat_interleave(repeats, dim=1)
            v = v.repeat_interleave(repeats, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(batch, seq, -1)
        result: torch.Tensor = self.wo(out * torch.sigmoid(gate))
        return result


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """The gated delta rule over a sequence, token by token, in fp32.

    ``query``/``key`` (batch, seq, heads, d_k) and ``value`` (batch, seq, heads, d_v) share the head count;
    ``log_decay`` and ``beta`` are (batch, seq, heads). With state ``S`` (d_k, d_v) per head::

        S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t / sqrt(d_k)

    after L2-normalising ``q_t`` and ``k_t``. Returns (batch, seq, heads, d_v) in the input dtype.
    """
    dtype = query.dtype
    q = _l2norm(query.float()) / math.sqrt(query.shape[-1])
    k = _l2norm(key.float())
    v, g, b = value.float(), log_decay.float(), beta.float()
    batch, seq, heads, d_k = k.shape
    state = q.new_zeros(batch, heads, d_k, v.shape[-1])
    outputs = []
    for t in range(seq):
        state = state * g[:, t].exp()[..., None, None]
        k_t = k[:, t]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)
        delta = (v[:, t] - predicted) * b[:, t, :, None]
        state = state + k_t[..., :, None] * delta[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    return torch.stack(outputs, dim=1).to(dtype)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank-local shard of a tensor-parallel (DTensor) parameter; a plain tensor unchanged."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _causal_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU of the causal depthwise convolution of ``x`` (batch, seq, channels) by ``weight`` (C, K)."""
    seq, kernel = x.shape[1], weight.shape[-1]
    out = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), padding=kernel - 1, groups=weight.shape[0])
    return F.silu(out[..., :seq]).transpose(1, 2)


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
        self.n_k_heads = args.linear_num_key_heads
        self.n_v_heads = args.linear_num_value_heads
        self.head_k_dim = args.linear_key_head_dim
        self.head_v_dim = args.linear_value_head_dim
        self.key_dim = self.n_k_heads * self.head_k_dim
        self.value_dim = self.n_v_heads * self.head_v_dim
        self.kernel = args.linear_conv_kernel_dim
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the key and value heads.
        q = _causal_conv(self.in_proj_q(x), _local(self.conv_q)).reshape(batch, seq, -1, self.head_k_dim)
        k = _causal_conv(self.in_proj_k(x), _local(self.conv_k)).reshape(batch, seq, -1, self.head_k_dim)
        v = _causal_conv(self.in_proj_v(x), _local(self.conv_v)).reshape(batch, seq, -1, self.head_v_dim)
        groups = v.shape[2] // k.shape[2]
        if groups > 1:  # each query/key head serves `groups` consecutive value heads
            q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
        beta = torch.sigmoid(self.in_proj_b(x))
        decay_rate = -_local(self.A_log).float().exp()
        log_decay = decay_rate * F.softplus(self.in_proj_a(x).float() + _local(self.dt_bias))
        out = gated_delta_rule(q, k, v, log_decay, beta)
        z = self.in_proj_z(x).reshape(batch, seq, -1, self.head_v_dim)
        out = self.norm(out, z).reshape(batch, seq, -1)
        result: torch.Tensor = self.out_proj(out)
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

    def __init__(self, args: Qwen3_5Args, layer_type: str) -> None:
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
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        normed = self.attention_norm(x)
        if self.attention is not None:
            mixed = self.attention(normed, rope)
        else:
            assert self.linear_attn is not None
            mixed = self.linear_attn(normed)
        h: torch.Tensor = x + mixed
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Qwen3_5Model(nn.Module):
    """The Qwen 3.5 hybrid language model: token ids (batch, seq) to logits (batch, seq, vocab)."""

    def __init__(self, args: Qwen3_5Args) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(HybridBlock(args, kind) for kind in args.layer_types())
        self.norm = ZeroCenteredRMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tie_weights()

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

    def forward_embeddings(self, h: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from input embeddings (batch, seq, dim), e.g. with image features merged in.

        ``positions`` (3, batch, seq) are multimodal RoPE positions; ``None`` means ``0 .. seq - 1``.
        """
        rope = self.rope(h.shape[1], h.device, positions)
        for layer in self.layers:
            h = layer(h, rope)
        logits: torch.Tensor = self.output(self.norm(h))
        return logits

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_embeddings(self.embed(tokens))

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
