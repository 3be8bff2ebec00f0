"""Torch-free costs of Qwen 3.5 (text and vision-language) for the preflight estimate.

Counts follow ``_modules.py``, ``_vision.py`` and ``_parallel.py`` tensor by tensor: parameter shapes and
their TP split, the tensors autograd saves for backward in each block (checked against
``saved_tensors_hooks`` in ``tests/test_preflight_activations.py``) and the matmul/attention/convolution
FLOPs (checked against ``FlopCounterMode``). ``P`` is the byte width of the compute dtype; norms, the
gates of Gated DeltaNet and its recurrence run in fp32.

The Gated DeltaNet term models the token-by-token reference recurrence of ``_modules.gated_delta_rule``,
which keeps two fp32 ``(heads, d_k, d_v)`` states per token for backward; a chunked kernel keeps far less,
and this term must follow the implementation (the activation test fails when they diverge).
"""

from collections.abc import Sequence

from hyper_parallel.models.qwen3_5.args import Qwen3_5Args, Qwen3_5VisionArgs, Qwen3_5VLArgs
from hyper_parallel.preflight.model import ActivationCosts, BlockActivations, ParamGroup, Workload

__all__ = ["Qwen3_5Costs", "Qwen3_5VLCosts", "vision_parameters"]

#: Rows of the vision tower's learned position table (``_vision.NUM_POSITION_EMBEDDINGS``).
VISION_POSITIONS = 2304


def _norm_saved(dim: int) -> int:
    """Bytes per token a zero-centred RMSNorm saves: fp32 x (or its copy), normed x and rsqrt."""
    return 8 * dim + 4


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
            ParamGroup("mlp", (a.ffn_hidden_dim, a.dim), 2 * a.n_layers, tp_dim=0),
            ParamGroup("mlp", (a.dim, a.ffn_hidden_dim), a.n_layers, tp_dim=1),
            ParamGroup("attention", (2 * q, a.dim), full, tp_dim=0),
            ParamGroup("attention", (kv, a.dim), 2 * full, tp_dim=0),
            ParamGroup("attention", (a.dim, q), full, tp_dim=1),
            ParamGroup("attention", (a.head_dim,), 2 * full),
            ParamGroup("gated_deltanet", (kd, a.dim), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (vd, a.dim), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (nv, a.dim), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (kd, k), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (vd, k), linear, tp_dim=0),
            ParamGroup("gated_deltanet", (nv,), 2 * linear, tp_dim=0),
            ParamGroup("gated_deltanet", (a.linear_value_head_dim,), linear),
            ParamGroup("gated_deltanet", (a.dim, vd), linear, tp_dim=1),
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
        kv_saved = q if kv_heads < heads else kv
        # q, (repeated) k and v, output, log-sum-exp, sigmoid of the gate, input of wo
        sdpa = p * (q + 2 * kv_saved) + p * q + 4 * heads
        kept = q_norm + k_norm + sdpa + 2 * p * q
        op = p * (2 * q + 2 * kv + a.dim) + p * q + 4 * heads
        return kept, op

    def _gated_deltanet(self, p: int, t: int, seq: int) -> tuple[int, int]:
        """Bytes per token of a Gated DeltaNet mixer: (no checkpointing, selective op)."""
        a = self.args
        hv = a.linear_num_value_heads // t
        dk, dv = a.linear_key_head_dim, a.linear_value_head_dim
        kd, vd = a.linear_num_key_heads // t * dk, hv * dv
        conv = (seq + a.linear_conv_kernel_dim - 1) / seq  # the padded convolution output is kept whole
        # projections into the convolutions, convolution outputs (silu inputs)
        convs = p * (2 * kd + vd) + int(p * (2 * kd + vd) * conv)
        # q and k (repeated to the value heads): fp32 input of the L2 norm, its rsqrt, the normalised copy
        qk = 2 * (4 * hv * dk + 4 * hv + 4 * hv * dk)
        # beta (sigmoid output and its fp32 copy), softplus input and output, exp of the log decay
        gates = p * hv + _cast(p, hv) + 3 * 4 * hv
        # per token of the recurrence: decayed and updated fp32 states, v - prediction and delta
        recurrence = 2 * 4 * hv * dk * dv + 2 * 4 * hv * dv
        # gated RMSNorm: fp32 x, rsqrt, normed, weight * normed, fp32 gate, silu(gate); input of out_proj
        norm = 4 * vd + 4 * hv + 2 * p * vd + (4 * vd if p < 4 else p * vd) + 4 * vd + p * vd
        kept = convs + qk + gates + recurrence + norm
        op = p * (2 * kd + 2 * vd + 2 * hv + a.dim)
        return kept, op

    def activations(self, work: Workload) -> ActivationCosts:
        a, p, t = self.args, work.param_bytes, work.tp
        tokens, d, f = work.batch * work.seq, a.dim, a.ffn_hidden_dim // t
        mlp = p * d + 4 * p * f
        mlp_op = p * (2 * f + d)
        blocks = []
        for kind in a.layer_types():
            if kind == "full_attention":
                kept, op = self._full_attention(p, t)
            else:
                kept, op = self._gated_deltanet(p, t, work.seq)
            # two residual norms, the mixer's input, the mixer, the feed-forward
            kept += 2 * _norm_saved(d) + p * d + mlp
            blocks.append(
                BlockActivations(kept=kept * tokens, op=(p * d + op + mlp_op) * tokens, inputs=p * d * tokens)
            )
        rotary = int(a.head_dim * a.partial_rotary_factor)
        rope = 2 * work.seq * rotary * 4
        outside = (8 + _norm_saved(d) + p * d) * tokens + rope
        outside += 4 * a.vocab_size * work.batch * (work.seq - 1)
        return ActivationCosts(blocks=tuple(blocks), outside=outside, vocab=a.vocab_size)

    def flops_per_token(self, seq: int) -> int:
        a = self.args
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        hv = a.linear_num_value_heads
        kd, vd = a.linear_num_key_heads * a.linear_key_head_dim, hv * a.linear_value_head_dim
        kinds = a.layer_types()
        full, linear = kinds.count("full_attention"), kinds.count("linear_attention")
        matmuls = a.n_layers * 3 * a.dim * a.ffn_hidden_dim + a.vocab_size * a.dim  # the output, tied or not
        matmuls += full * a.dim * (3 * q + 2 * kv) + linear * a.dim * (2 * kd + 3 * vd + 2 * hv)
        # QK^T and AV over the whole square forward, five such products backward (scores recomputed)
        attention = full * 14 * seq * q
        conv = 2 * (2 * kd + vd) * a.linear_conv_kernel_dim * (seq + a.linear_conv_kernel_dim - 1) / seq
        recurrence = 2 * 2 * hv * a.linear_key_head_dim * a.linear_value_head_dim  # read-out and output
        return int(6 * matmuls + attention + 3 * linear * (conv + recurrence))

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

    def flops_per_token(self, seq: int) -> int:
        return Qwen3_5Costs(self.args.text).flops_per_token(seq)

    def tp_degrees(self) -> Sequence[int]:
        return Qwen3_5Costs(self.args.text).tp_degrees()
