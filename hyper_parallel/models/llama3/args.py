"""Architecture arguments of Llama 3 / 3.1 and the table of published flavors.

The numbers for 8B, 70B and 405B follow Meta's published Llama 3.1 model cards and ``params.json``
(128K context with Llama 3.1 rope scaling). ``debugmodel`` is a tiny model for tests and smoke runs.
"""

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import attrs

from hyper_parallel._checks import quote, said
from hyper_parallel.config_base import config_class
from hyper_parallel.models.spec import ModelArgs

if TYPE_CHECKING:
    from hyper_parallel.models.llama3.estimate import Llama3Costs

__all__ = ["HF_LINEAR_NAMES", "LLAMA3_FLAVORS", "Llama3Args", "RopeScaling"]

_pos_int = attrs.validators.gt(0)

#: Hugging Face's names of the attention and SwiGLU projections -> ours (``Llama3Args.hf_linear_names``).
HF_LINEAR_NAMES: Mapping[str, frozenset[str]] = {
    hf: frozenset({ours})
    for hf, ours in {
        "q_proj": "wq",
        "k_proj": "wk",
        "v_proj": "wv",
        "o_proj": "wo",
        "gate_proj": "w1",
        "up_proj": "w3",
        "down_proj": "w2",
    }.items()
}


@config_class
class RopeScaling:
    """Llama 3.1 frequency-dependent RoPE scaling (a nested ``rope_scaling`` section)."""

    factor: float = attrs.field(
        default=8.0,
        validator=attrs.validators.ge(1.0),
        metadata={"help": "Divisor applied to the low RoPE frequencies (context extension factor)."},
    )
    low_freq_factor: float = attrs.field(
        default=1.0,
        validator=attrs.validators.gt(0.0),
        metadata={"help": "Wavelengths above original_max_position_embeddings / low_freq_factor are scaled."},
    )
    high_freq_factor: float = attrs.field(
        default=4.0,
        validator=attrs.validators.gt(0.0),
        metadata={"help": "Wavelengths below original_max_position_embeddings / high_freq_factor are kept."},
    )
    original_max_position_embeddings: int = attrs.field(
        default=8192,
        validator=_pos_int,
        metadata={"help": "Context length in tokens the model was pretrained with before scaling."},
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: the two frequency bands must not overlap."""
        if self.high_freq_factor <= self.low_freq_factor:
            yield (
                "high_freq_factor",
                said(
                    "must be > ",
                    quote("low_freq_factor", self.low_freq_factor),
                    f", got {self.high_freq_factor}",
                ),
            )


@config_class
class Llama3Args(ModelArgs):
    """Dimensions of a Llama 3 decoder (grouped-query attention, SwiGLU feed-forward, RMSNorm)."""

    dim: int = attrs.field(validator=_pos_int, metadata={"help": "Hidden size of the residual stream."})
    n_layers: int = attrs.field(validator=_pos_int, metadata={"help": "Number of transformer blocks."})
    n_heads: int = attrs.field(validator=_pos_int, metadata={"help": "Number of query attention heads."})
    n_kv_heads: int | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(_pos_int),
        metadata={"help": "Number of key/value heads (grouped-query attention); null means n_heads."},
    )
    vocab_size: int = attrs.field(
        default=128_256,
        validator=_pos_int,
        metadata={"help": "Number of token embeddings (rows of the embedding and output matrices)."},
    )
    multiple_of: int = attrs.field(
        default=256,
        validator=_pos_int,
        metadata={"help": "The feed-forward hidden size is rounded up to a multiple of this."},
    )
    ffn_dim_multiplier: float | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.gt(0.0)),
        metadata={"help": "Scale of the feed-forward hidden size over 8/3 * dim; null means 1."},
    )
    norm_eps: float = attrs.field(
        default=1e-5,
        validator=attrs.validators.gt(0.0),
        metadata={"help": "Epsilon of RMSNorm."},
    )
    rope_theta: float = attrs.field(
        default=500_000.0,
        validator=attrs.validators.gt(0.0),
        metadata={"help": "Base of the rotary position embedding frequencies."},
    )
    rope_scaling: RopeScaling | None = attrs.field(
        default=None,
        metadata={"help": "Llama 3.1 RoPE scaling for long context; null uses plain RoPE."},
    )
    max_seq_len: int = attrs.field(
        default=8192,
        validator=_pos_int,
        metadata={"help": "Longest sequence in tokens the RoPE cache is built for."},
    )
    tie_word_embeddings: bool = attrs.field(
        default=False,
        metadata={"help": "Share the embedding matrix with the output projection (Llama 3.2 1B and 3B)."},
    )

    def fuses_loss_head(self) -> bool:
        return True

    @property
    def ffn_hidden_dim(self) -> int:
        """Feed-forward hidden size: ``8/3 * dim`` times the multiplier, rounded up to ``multiple_of``."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    def num_layers(self) -> int:
        """Number of transformer blocks."""
        return self.n_layers

    def max_sequence_length(self) -> int:
        """Longest supported sequence in tokens."""
        return self.max_seq_len

    def vocabulary_size(self) -> int:
        """Number of token ids the embedding table holds."""
        return self.vocab_size

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: heads must split the hidden size and share KV heads evenly."""
        if self.dim % self.n_heads:
            yield "n_heads", said("must divide ", quote("dim", self.dim), f", got {self.n_heads}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            yield (
                "n_kv_heads",
                said("must divide ", quote("n_heads", self.n_heads), f", got {self.n_kv_heads}"),
            )
        if self.dim % self.n_heads == 0 and (self.dim // self.n_heads) % 2:
            yield "n_heads", f"dim / n_heads = {self.dim // self.n_heads} must be even for RoPE"
        if self.rope_scaling is not None:
            for path, message in self.rope_scaling.cross_check():
                yield f"rope_scaling.{path}", message

    def block_linear_names(self) -> frozenset[str]:
        """Attention ``wq wk wv wo`` and the SwiGLU ``w1 w2 w3``."""
        return frozenset({"wq", "wk", "wv", "wo", "w1", "w2", "w3"})

    def hf_linear_names(self) -> Mapping[str, frozenset[str]]:
        """``LlamaForCausalLM``'s ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj`` (the names
        the state-dict adapter renames)."""
        return HF_LINEAR_NAMES

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(root field path, message)``: tensor parallelism splits the query and key/value heads;
        tied embeddings cannot be cut into pipeline stages (the first and last stages would share them)."""
        if self.tie_word_embeddings and degrees.get("pp", 1) > 1:
            yield (
                "parallelism.pp",
                "pipeline parallelism is not supported yet with tie_word_embeddings (the embeddings on the "
                "first stage are the output projection of the last); set parallelism.pp to 1",
            )
        tp, kv_heads = degrees.get("tp", 1), self.n_kv_heads or self.n_heads
        if self.n_heads % tp or kv_heads % tp:
            yield (
                "parallelism.tp",
                f"must divide the model's {self.n_heads} attention heads and {kv_heads} key/value heads, "
                f"got {tp}",
            )

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape (torch-free, ``estimate.parameter_shapes``)."""
        from hyper_parallel.models.llama3.estimate import parameter_shapes

        return parameter_shapes(self)

    def preflight(self) -> "Llama3Costs":
        """Parameter, activation and FLOP counts for the preflight estimate (torch-free)."""
        from hyper_parallel.models.llama3.estimate import Llama3Costs

        return Llama3Costs(self)


_LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

_LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)

#: Flavor name -> arguments. Published Llama 3.1 and 3.2 (1B, 3B) values; debugmodel is ours.
LLAMA3_FLAVORS: dict[str, Llama3Args] = {
    "debugmodel": Llama3Args(
        dim=256, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=2048, multiple_of=64, max_seq_len=2048
    ),
    "1B": Llama3Args(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.5,
        multiple_of=256,
        rope_scaling=_LLAMA32_ROPE,
        max_seq_len=131_072,
        tie_word_embeddings=True,
    ),
    "3B": Llama3Args(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        ffn_dim_multiplier=1.0,
        multiple_of=256,
        rope_scaling=_LLAMA32_ROPE,
        max_seq_len=131_072,
        tie_word_embeddings=True,
    ),
    "8B": Llama3Args(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=1024,
        rope_scaling=_LLAMA31_ROPE,
        max_seq_len=131_072,
    ),
    "70B": Llama3Args(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        ffn_dim_multiplier=1.3,
        multiple_of=4096,
        rope_scaling=_LLAMA31_ROPE,
        max_seq_len=131_072,
    ),
    "405B": Llama3Args(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        ffn_dim_multiplier=1.2,
        multiple_of=4096,
        rope_scaling=_LLAMA31_ROPE,
        max_seq_len=131_072,
    ),
}
