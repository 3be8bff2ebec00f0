"""Torch-free costs of the Llama 3 decoder for the preflight estimate (``Llama3Args.preflight()``).

Counts follow ``_modules.py`` and ``_parallel.py`` tensor by tensor: parameter shapes and their TP split, the
tensors autograd saves for backward in each block (checked against ``saved_tensors_hooks`` in
``tests/preflight/test_activations.py``) and the matmul/attention FLOPs (TorchTitan's convention, checked
against ``FlopCounterMode``). ``P`` below is the byte width of the compute dtype; norms and RoPE run in fp32
(RoPE as complex64 rotations); attention is SDPA, which reads grouped key/value heads unrepeated.
"""

from collections.abc import Sequence

from hyper_parallel.models.llama3.args import Llama3Args
from hyper_parallel.preflight.flops import FlopCount, flop_count
from hyper_parallel.preflight.model import ActivationCosts, BlockActivations, ParamGroup, Workload

__all__ = ["Llama3Costs", "parameter_shapes"]


def rms_norm_saved(dim: int, p: int) -> int:
    """Bytes per token an fp32-computed RMSNorm saves: fp32 x (or its copy), rsqrt, normed x in dtype ``p``.

    ``x * rsqrt(mean(x^2) + eps)`` keeps x and the rsqrt; the weight product keeps the normed x (cast back
    to the compute dtype).
    """
    return 4 * dim + 4 + p * dim


class Llama3Costs:
    """Parameter, activation and FLOP counts of one Llama 3 configuration."""

    def __init__(self, args: Llama3Args) -> None:
        self.args = args

    @property
    def _head_dim(self) -> int:
        return self.args.dim // self.args.n_heads

    @property
    def _kv_heads(self) -> int:
        return self.args.n_kv_heads or self.args.n_heads

    def parameters(self) -> Sequence[ParamGroup]:
        a, layers = self.args, self.args.n_layers
        q, kv, f = a.n_heads * self._head_dim, self._kv_heads * self._head_dim, a.ffn_hidden_dim
        return (
            # tied (Llama 3.2): one tensor, which tensor parallelism leaves whole
            ParamGroup("embedding", (a.vocab_size, a.dim), tp_dim=None, in_block=False)
            if a.tie_word_embeddings
            else ParamGroup("embedding", (a.vocab_size, a.dim), tp_dim=0, in_block=False, tp_full_grad=True),
            ParamGroup("attention", (q, a.dim), layers, tp_dim=0, linears=("wq",)),
            ParamGroup("attention", (kv, a.dim), 2 * layers, tp_dim=0, linears=("wk", "wv")),
            ParamGroup("attention", (a.dim, q), layers, tp_dim=1, linears=("wo",)),
            ParamGroup("mlp", (f, a.dim), 2 * layers, tp_dim=0, linears=("w1", "w3")),
            ParamGroup("mlp", (a.dim, f), layers, tp_dim=1, linears=("w2",)),
            ParamGroup("norm", (a.dim,), 2 * layers),
            ParamGroup("norm", (a.dim,), in_block=False),
        ) + (
            ()
            if a.tie_word_embeddings
            else (ParamGroup("output", (a.vocab_size, a.dim), tp_dim=0, in_block=False),)
        )

    def activations(self, work: Workload) -> ActivationCosts:
        a, p, t = self.args, work.param_bytes, work.tp
        tokens = work.batch * work.seq
        heads, q = a.n_heads // t, a.n_heads * self._head_dim // t
        kv, f, d = self._kv_heads * self._head_dim // t, a.ffn_hidden_dim // t, a.dim
        # Residual-stream tensors are split along the sequence under sequence parallelism; the inputs of
        # the column-parallel matmuls are gathered back to the full sequence.
        seq_split = t if work.sequence_parallel and t > 1 else 1
        norm = rms_norm_saved(d, p) // seq_split
        # input of wq/wk/wv, q, k and v (grouped-query attention reads the key/value heads unrepeated),
        # the attention output (also wo's input, a view of it), log-sum-exp
        attention = p * d + p * (q + 2 * kv) + p * q + 4 * heads
        # input of w1/w3, w1 and w3 outputs (SwiGLU keeps only its inputs), input of w2
        mlp = p * d + 3 * p * f
        kept = 2 * norm + attention + mlp
        block_input = p * d // seq_split
        matmuls = p * (q + 2 * kv + d + 2 * f + d) + p * q + 4 * heads
        block = BlockActivations(
            kept=kept * tokens, op=(block_input + matmuls) * tokens, inputs=block_input * tokens
        )
        rope = 8 * work.seq * (self._head_dim // 2)  # complex64 rotations, shared by every block
        # token ids, final norm, output input, fp32 log-softmax of the (gathered) logits of seq - 1 tokens
        outside = 8 * tokens + (rms_norm_saved(d, p) // seq_split + p * d) * tokens + rope
        outside += 4 * a.vocab_size * work.batch * (work.seq - 1)
        return ActivationCosts(
            blocks=(block,) * a.n_layers, outside=outside, vocab=a.vocab_size, hidden=a.dim
        )

    def flop_count(self, seq: int) -> FlopCount:
        a = self.args
        q, kv, f = a.n_heads * self._head_dim, self._kv_heads * self._head_dim, a.ffn_hidden_dim
        matmul_params = a.n_layers * (a.dim * (2 * q + 2 * kv) + 3 * a.dim * f) + a.vocab_size * a.dim
        return flop_count(weights=matmul_params, attention_layers=a.n_layers, attention_width=q, seq=seq)

    def tp_degrees(self) -> Sequence[int]:
        return [
            t for t in range(1, self._kv_heads + 1) if self.args.n_heads % t == 0 and self._kv_heads % t == 0
        ]


def parameter_shapes(a: Llama3Args) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape in ``_modules.Transformer`` (the output even when tied to the
    embeddings, as ``named_parameters(remove_duplicate=False)`` lists it), computed without torch."""
    head = a.dim // a.n_heads
    q, kv, f = a.n_heads * head, (a.n_kv_heads or a.n_heads) * head, a.ffn_hidden_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (a.vocab_size, a.dim)}
    for i in range(a.n_layers):
        block = {
            "attention_norm.weight": (a.dim,),
            "attention.wq.weight": (q, a.dim),
            "attention.wk.weight": (kv, a.dim),
            "attention.wv.weight": (kv, a.dim),
            "attention.wo.weight": (a.dim, q),
            "ffn_norm.weight": (a.dim,),
            "feed_forward.w1.weight": (f, a.dim),
            "feed_forward.w2.weight": (a.dim, f),
            "feed_forward.w3.weight": (f, a.dim),
        }
        shapes.update({f"layers.{i}.{name}": shape for name, shape in block.items()})
    shapes["norm.weight"] = (a.dim,)
    shapes["output.weight"] = (a.vocab_size, a.dim)
    return shapes
