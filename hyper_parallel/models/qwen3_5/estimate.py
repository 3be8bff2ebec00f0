"""Torch-free costs of Qwen 3.5 (text and vision-language) for the preflight estimate.

Counts follow ``_modules.py``, ``_vision.py`` and ``_parallel.py`` tensor by tensor: parameter shapes and
their TP split, the tensors autograd saves for backward in each block (checked against ``saved_tensors_hooks``
in ``tests/preflight/test_activations.py``) and the matmul/attention/convolution FLOPs (TorchTitan's
convention, ``preflight/flops.py``; checked against ``FlopCounterMode``). ``P`` is the byte width of the
compute dtype; norms, the gates of Gated DeltaNet and its recurrence run in fp32.

The Gated DeltaNet terms follow the chunked PyTorch gated delta rule of ``_gated_delta.py`` (the path
training takes on the CPU and without flash-linear-attention). With ``H`` value heads (queries and keys
repeated to them), head sizes ``d_k``, ``d_v``, chunk ``C`` (``linear_chunk_size``), the sequence
zero-padded to ``N = ceil(seq / C)`` chunks, and ``w = d_k + d_v`` (the width of the right-hand side
``[beta v | beta exp(gamma) k]``), it keeps in fp32, per padded token and head:

* ``5 d_k``: the chunked q and k, ``k * beta``, the keys decayed to the chunk end and the queries decayed
  from the chunk start;
* ``5 C``: the pair decays, ``k_beta k^T``, the system ``A``, ``q k^T`` and the decayed ``q k^T``;
* ``w``: the solution ``[U | W]`` (plus the inverse ``C`` and the right-hand side ``w`` when ``w > C``,
  where the code inverts ``A`` first);
* ``d_v + 2``: the per-chunk corrections ``delta``, the decays from the chunk start and to its end;
* ``d_v + 1``: the chunked v and beta, unless batch is 1 and nothing is padded (then they are views of
  tensors kept anyway);
* ``d_v``: the rule's output (stacked chunks), which the gated RMSNorm keeps in fp32;
* ``d_k d_v / C``: the state entering every chunk.

Its matmul FLOPs per chunk and head are forward ``4 C^2 d_k + 2 C^2 d_v + 6 C d_k d_v`` (``k_beta k^T``,
``q k^T``, ``intra delta`` and three state products; ``+ 2 C^2 w`` for ``A^-1 [..]`` when ``w > C``),
twice that backward, plus the backward of the triangular solve's matrix ``2 C^2 w`` (``2 C^3`` when
inverting); the first chunk's zero state and the unused final state skip four products of
``2 C d_k d_v`` per sequence and head. The triangular solves themselves are not counted, as
``FlopCounterMode`` does not count them.
"""

import math
from collections.abc import Sequence

from hyper_parallel.models.qwen3_5.args import Qwen3_5Args, Qwen3_5VisionArgs, Qwen3_5VLArgs
from hyper_parallel.preflight.flops import FlopCount, flop_count
from hyper_parallel.preflight.model import ActivationCosts, BlockActivations, ParamGroup, Workload

__all__ = ["Qwen3_5Costs", "Qwen3_5VLCosts", "parameter_shapes", "vision_parameters", "vl_parameter_shapes"]

#: Rows of the vision tower's learned position table (``_vision.NUM_POSITION_EMBEDDINGS``).
VISION_POSITIONS = 2304


def _norm_saved(dim: int) -> int:
    """Bytes per token a zero-centred RMSNorm saves: fp32 x (or its copy), normed x and rsqrt."""
    return 8 * dim + 4


def _padded(seq: int, chunk: int) -> int:
    """The sequence length the chunked gated delta rule computes on: ``seq`` rounded up to whole chunks."""
    return math.ceil(seq / chunk) * chunk


def _cast(p: int, n: int) -> int:
    """Bytes of the fp32 copy ``.float()`` makes of ``n`` elements in the compute dtype (none in fp32)."""
    return 4 * n if p < 4 else 0


class Qwen3_5Costs:
    """Parameter, activation and FLOP counts of one Qwen 3.5 language model."""

    def __init__(self, args: Qwen3_5Args) -> None:
        self.args = args

    def parameters(self) -> Sequence[ParamGroup]:
        a = self.args
        kinds = a.layer_types()
        full, linear = kinds.count("full_attention"), kinds.count("linear_attention")
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        kd, vd = (
            a.linear_num_key_heads * a.linear_key_head_dim,
            a.linear_num_value_heads * a.linear_value_head_dim,
        )
        nv, k = a.linear_num_value_heads, a.linear_conv_kernel_dim
        groups = [
            ParamGroup("embedding", (a.vocab_size, a.dim), in_block=False),
            ParamGroup("norm", (a.dim,), 2 * a.n_layers),
            ParamGroup("mlp", (a.ffn_hidden_dim, a.dim), 2 * a.n_layers, tp_dim=0, linears=("w1", "w3")),
            ParamGroup("mlp", (a.dim, a.ffn_hidden_dim), a.n_layers, tp_dim=1, linears=("w2",)),
            ParamGroup("attention", (2 * q, a.dim), full, tp_dim=0, linears=("wq",)),
            ParamGroup("attention", (kv, a.dim), 2 * full, tp_dim=0, linears=("wk", "wv")),
            ParamGroup("attention", (a.dim, q), full, tp_dim=1, linears=("wo",)),
            ParamGroup("attention", (a.head_dim,), 2 * full),
            ParamGroup(
                "gated_deltanet", (kd, a.dim), 2 * linear, tp_dim=0, linears=("in_proj_q", "in_proj_k")
            ),
            ParamGroup(
                "gated_deltanet", (vd, a.dim), 2 * linear, tp_dim=0, linears=("in_proj_v", "in_proj_z")
            ),
            ParamGroup(
                "gated_deltanet", (nv, a.dim), 2 * linear, tp_dim=0, linears=("in_proj_b", "in_proj_a")
            ),
            ParamGroup("gated_deltanet", (kd, k), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (vd, k), linear, tp_dim=0),
            ParamGroup("gated_deltanet", (nv,), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (a.linear_value_head_dim,), linear),
            ParamGroup("gated_deltanet", (a.dim, vd), linear, tp_dim=1, linears=("out_proj",)),
            ParamGroup("norm", (a.dim,), in_block=False),
        ]
        if not a.tie_word_embeddings:
            groups.append(ParamGroup("output", (a.vocab_size, a.dim), in_block=False))
        return tuple(g for g in groups if g.copies)

    def _full_attention(self, p: int, t: int) -> tuple[int, int]:
        """Bytes per token of a gated full-attention mixer: (no checkpointing, selective op)."""
        a = self.args
        heads, kv_heads = a.n_heads // t, a.n_kv_heads // t
        q, kv = heads * a.head_dim, kv_heads * a.head_dim
        # q_norm / k_norm: fp32 input (in fp32 the whole fused query+gate projection), normed, rsqrt
        q_norm = (8 * q if p == 4 else 4 * q) + 4 * q + 4 * heads
        k_norm = 4 * kv + 4 * kv + 4 * kv_heads
        # q, k and v (grouped-query attention reads the key/value heads unrepeated), output, log-sum-exp
        sdpa = p * (q + 2 * kv) + p * q + 4 * heads
        # the output back in (batch, seq, heads * head_dim), a copy (the queries, contiguous per head after
        # RoPE's concatenation, give SDPA's output that layout), the sigmoid of the gate, the input of wo
        kept = q_norm + k_norm + sdpa + 3 * p * q
        op = p * (2 * q + 2 * kv + a.dim) + p * q + 4 * heads
        return kept, op

    def _gated_deltanet(self, p: int, t: int, batch: int, seq: int) -> tuple[int, int]:
        """Bytes of a Gated DeltaNet mixer over ``batch`` x ``seq`` tokens: (no checkpointing, op)."""
        a = self.args
        hv, hk = a.linear_num_value_heads // t, a.linear_num_key_heads // t
        dk, dv, c = a.linear_key_head_dim, a.linear_value_head_dim, a.linear_chunk_size
        kd, vd = hk * dk, hv * dv
        tokens, padded = batch * seq, batch * _padded(seq, c)
        conv = (seq + a.linear_conv_kernel_dim - 1) / seq  # the padded convolution output is kept whole
        # projections into the convolutions (concatenated), convolution outputs (silu inputs); the silu
        # output (q, k and v are views of it) in fp32, else the fp32 copies of q and k
        per_token = p * (2 * kd + vd) + p * (2 * kd + vd) * conv + (p * (2 * kd + vd) if p == 4 else 8 * kd)
        # rsqrt of the L2 norms of q and k; beta (sigmoid output); softplus input and output
        per_token += 8 * hk + p * hv + 8 * hv
        # gated RMSNorm: its fp32 input (the padded output of the rule in fp32, else a copy), rsqrt, normed,
        # weight * normed, the fp32 gate (z itself in fp32) and silu(gate), the copied input of out_proj
        per_token += (0 if p == 4 else 4 * vd) + 4 * hv + 3 * p * vd + 8 * vd
        # the chunked rule (see the module docstring), all fp32
        wide = dk + dv > c
        chunked = hv * (5 * dk + 5 * c + dk + dv + dv + 2 + (c + dk + dv if wide else 0))
        views = batch == 1 and padded == tokens  # chunked v and beta are views, not copies
        # plus, per chunk, the state entering it and its decay
        kept = per_token * tokens + 4 * chunked * padded + 4 * hv * (dk * dv + 1) * padded // c
        if views:  # fp32: views of kept tensors; otherwise the fp32 copies of v and beta
            kept += (0 if p == 4 else 4 * (vd + hv)) * tokens
        else:
            kept += 4 * (vd + hv) * padded
        kept += (4 * vd if p == 4 else 0) * padded  # fp32 output of the rule, padded (the norm's input)
        op = p * (2 * kd + 2 * vd + 2 * hv + a.dim)
        return int(kept), op * tokens

    def activations(self, work: Workload) -> ActivationCosts:
        a, p, t = self.args, work.param_bytes, work.tp
        tokens, d, f = work.batch * work.seq, a.dim, a.ffn_hidden_dim // t
        mlp = p * d + 3 * p * f  # input of w1/w3, their outputs (SwiGLU keeps only its inputs), input of w2
        mlp_op = p * (2 * f + d)
        # Residual-stream tensors (norms, block input) are split along the sequence under sequence
        # parallelism; the mixers' and feed-forward's inputs are gathered back to the full sequence.
        seq_split = t if work.sequence_parallel and t > 1 else 1
        norm, block_input = _norm_saved(d) // seq_split, p * d // seq_split
        blocks = []
        for kind in a.layer_types():
            if kind == "full_attention":
                kept, op = (n * tokens for n in self._full_attention(p, t))
            else:
                kept, op = self._gated_deltanet(p, t, work.batch, work.seq)
            # two residual norms, the mixer's input, the mixer, the feed-forward
            kept += (2 * norm + p * d + mlp) * tokens
            blocks.append(
                BlockActivations(
                    kept=kept, op=(block_input + mlp_op) * tokens + op, inputs=block_input * tokens
                )
            )
        rotary = int(a.head_dim * a.partial_rotary_factor)
        rope = 2 * work.seq * rotary * 4
        outside = (8 + norm + p * d) * tokens + rope
        outside += 4 * a.vocab_size * work.batch * (work.seq - 1)
        return ActivationCosts(blocks=tuple(blocks), outside=outside, vocab=a.vocab_size, hidden=a.dim)

    def flop_count(self, seq: int) -> FlopCount:
        a = self.args
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        hv = a.linear_num_value_heads
        kd, vd = a.linear_num_key_heads * a.linear_key_head_dim, hv * a.linear_value_head_dim
        kinds = a.layer_types()
        full, linear = kinds.count("full_attention"), kinds.count("linear_attention")
        matmuls = a.n_layers * 3 * a.dim * a.ffn_hidden_dim + a.vocab_size * a.dim  # the output, tied or not
        matmuls += full * a.dim * (3 * q + 2 * kv) + linear * a.dim * (2 * kd + 3 * vd + 2 * hv)
        # the depthwise convolutions' weights (6 per weight and token) with their causal padding's share
        conv = 2 * (2 * kd + vd) * a.linear_conv_kernel_dim * (seq + a.linear_conv_kernel_dim - 1) / seq
        return flop_count(
            weights=matmuls,
            attention_layers=full,
            attention_width=q,
            seq=seq,
            other=linear * (3 * conv + self._chunked_flops(seq)),
        )

    def _chunked_flops(self, seq: int) -> float:
        """FLOPs per token of the chunked gated delta rule, forward and backward (module docstring)."""
        a = self.args
        c, dk, dv = a.linear_chunk_size, a.linear_key_head_dim, a.linear_value_head_dim
        w, chunks = dk + dv, _padded(seq, c) // c
        forward = 4 * c * c * dk + 2 * c * c * dv + 6 * c * dk * dv + (2 * c * c * w if w > c else 0)
        solve_backward = 2 * c * c * (c if w > c else w)
        per_head = chunks * (3 * forward + solve_backward) - 4 * 2 * c * dk * dv
        return a.linear_num_value_heads * per_head / seq

    def tp_degrees(self) -> Sequence[int]:
        a = self.args
        return [
            t
            for t in range(1, a.n_kv_heads + 1)
            if not (a.n_heads % t or a.n_kv_heads % t or a.ffn_hidden_dim % t or a.linear_num_key_heads % t)
        ]


def vision_parameters(v: Qwen3_5VisionArgs, out_dim: int) -> tuple[ParamGroup, ...]:
    """Parameters of the vision tower (``_vision.VisionTower``); FSDP wraps each block, not the stem."""
    h, i, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size**2
    return (
        ParamGroup(
            "vision", (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size), in_block=False
        ),
        ParamGroup("vision", (h,), in_block=False),
        ParamGroup("vision", (VISION_POSITIONS, h), in_block=False),
        ParamGroup("vision", (h,), 4 * v.depth),  # norm1, norm2: weight and bias
        ParamGroup("vision", (3 * h, h), v.depth),
        ParamGroup("vision", (3 * h,), v.depth),
        ParamGroup("vision", (h, h), v.depth),
        ParamGroup("vision", (h,), 2 * v.depth),  # proj and linear_fc2 biases
        ParamGroup("vision", (i, h), v.depth),
        ParamGroup("vision", (i,), v.depth),
        ParamGroup("vision", (h, i), v.depth),
        ParamGroup("vision", (h,), 2, in_block=False),  # merger norm
        ParamGroup("vision", (merged, merged), in_block=False),
        ParamGroup("vision", (merged,), in_block=False),
        ParamGroup("vision", (out_dim, merged), in_block=False),
        ParamGroup("vision", (out_dim,), in_block=False),
    )


class Qwen3_5VLCosts:
    """Qwen 3.5 vision-language model: the language model's costs plus the vision tower's parameters.

    Activations and FLOPs cover the language model over ``seq`` tokens; the vision tower's depend on how
    many image patches a batch holds, which the config does not say.
    """

    def __init__(self, args: Qwen3_5VLArgs) -> None:
        self.args = args

    def parameters(self) -> Sequence[ParamGroup]:
        return (
            *vision_parameters(self.args.vision, self.args.text.dim),
            *Qwen3_5Costs(self.args.text).parameters(),
        )

    def activations(self, work: Workload) -> ActivationCosts:
        text = Qwen3_5Costs(self.args.text).activations(work)
        return text._replace(note="language model only; vision tower activations depend on the images")

    def flop_count(self, seq: int) -> FlopCount:
        return Qwen3_5Costs(self.args.text).flop_count(seq)

    def tp_degrees(self) -> Sequence[int]:
        return Qwen3_5Costs(self.args.text).tp_degrees()


def _mixer_shapes(a: Qwen3_5Args, kind: str) -> dict[str, tuple[int, ...]]:
    """The token mixer's parameters of one block (``_modules.Attention`` or ``GatedDeltaNet``)."""
    if kind == "full_attention":
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        return {
            "attention.wq.weight": (2 * q, a.dim),  # queries and their output gate
            "attention.wk.weight": (kv, a.dim),
            "attention.wv.weight": (kv, a.dim),
            "attention.wo.weight": (a.dim, q),
            "attention.q_norm.weight": (a.head_dim,),
            "attention.k_norm.weight": (a.head_dim,),
        }
    kd = a.linear_num_key_heads * a.linear_key_head_dim
    vd, nv = a.linear_num_value_heads * a.linear_value_head_dim, a.linear_num_value_heads
    k = a.linear_conv_kernel_dim
    return {
        "linear_attn.conv_q": (kd, k),
        "linear_attn.conv_k": (kd, k),
        "linear_attn.conv_v": (vd, k),
        "linear_attn.dt_bias": (nv,),
        "linear_attn.A_log": (nv,),
        "linear_attn.in_proj_q.weight": (kd, a.dim),
        "linear_attn.in_proj_k.weight": (kd, a.dim),
        "linear_attn.in_proj_v.weight": (vd, a.dim),
        "linear_attn.in_proj_z.weight": (vd, a.dim),
        "linear_attn.in_proj_b.weight": (nv, a.dim),
        "linear_attn.in_proj_a.weight": (nv, a.dim),
        "linear_attn.norm.weight": (a.linear_value_head_dim,),
        "linear_attn.out_proj.weight": (a.dim, vd),
    }


def parameter_shapes(
    a: Qwen3_5Args, feed_forward: dict[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape in ``_modules.Qwen3_5Model`` (the output even when tied), computed
    without torch; ``feed_forward`` replaces each block's dense SwiGLU (the mixture of experts' does)."""
    f = a.ffn_hidden_dim
    ffn = feed_forward or {
        "feed_forward.w1.weight": (f, a.dim),
        "feed_forward.w2.weight": (a.dim, f),
        "feed_forward.w3.weight": (f, a.dim),
    }
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (a.vocab_size, a.dim)}
    for i, kind in enumerate(a.layer_types()):
        block = {
            "attention_norm.weight": (a.dim,),
            **_mixer_shapes(a, kind),
            "ffn_norm.weight": (a.dim,),
            **ffn,
        }
        shapes.update({f"layers.{i}.{name}": shape for name, shape in block.items()})
    shapes["norm.weight"] = (a.dim,)
    shapes["output.weight"] = (a.vocab_size, a.dim)
    return shapes


def vl_parameter_shapes(a: Qwen3_5VLArgs) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape in the vision-language model: ``visual.*`` (``_vision.VisionTower``)
    then ``language_model.*``, computed without torch."""
    v = a.vision
    h, i, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size**2
    shapes: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.weight": (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
        "visual.patch_embed.bias": (h,),
        "visual.pos_embed.weight": (VISION_POSITIONS, h),
    }
    for n in range(v.depth):
        block = {
            "norm1.weight": (h,),
            "norm1.bias": (h,),
            "attn.qkv.weight": (3 * h, h),
            "attn.qkv.bias": (3 * h,),
            "attn.proj.weight": (h, h),
            "attn.proj.bias": (h,),
            "norm2.weight": (h,),
            "norm2.bias": (h,),
            "mlp.linear_fc1.weight": (i, h),
            "mlp.linear_fc1.bias": (i,),
            "mlp.linear_fc2.weight": (h, i),
            "mlp.linear_fc2.bias": (h,),
        }
        shapes.update({f"visual.blocks.{n}.{name}": shape for name, shape in block.items()})
    shapes.update(
        {
            "visual.merger.norm.weight": (h,),
            "visual.merger.norm.bias": (h,),
            "visual.merger.linear_fc1.weight": (merged, merged),
            "visual.merger.linear_fc1.bias": (merged,),
            "visual.merger.linear_fc2.weight": (a.text.dim, merged),
            "visual.merger.linear_fc2.bias": (a.text.dim,),
        }
    )
    shapes.update({f"language_model.{name}": shape for name, shape in parameter_shapes(a.text).items()})
    return shapes
