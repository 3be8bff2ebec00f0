"""Architecture arguments of Qwen 3.5 (text and vision-language) and their flavor tables.

Qwen 3.5's language model is a hybrid: most blocks use Gated DeltaNet linear attention and every
``full_attention_interval``-th block uses gated full (softmax) attention with partial RoPE, typically
three linear blocks to one full block. The vision-language variant adds a ViT-style vision tower whose
patch embeddings are merged spatially and projected into the language model's hidden size.

Provenance of the numbers: the layout (3 linear : 1 full, gated attention, partial rotary factor 0.25,
conv kernel 4, 256-wide attention heads, 128-wide linear-attention heads) follows the published
Qwen3-Next / Qwen 3.5 architecture. The per-size dimensions below are our best recollection and were
NOT verified against the released ``config.json`` files; check them before loading real weights (the
state-dict adapter will compare them with the checkpoint when it is implemented).
"""

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Literal

import attrs

from hyper_parallel._checks import quote, rebased, said
from hyper_parallel.config_base import config_class
from hyper_parallel.models.spec import ModelArgs

if TYPE_CHECKING:
    from hyper_parallel.models.qwen3_5.estimate import Qwen3_5Costs, Qwen3_5VLCosts

__all__ = [
    "HF_LINEAR_NAMES",
    "QWEN3_5_FLAVORS",
    "QWEN3_5_VL_FLAVORS",
    "Qwen3_5Args",
    "Qwen3_5VLArgs",
    "Qwen3_5VisionArgs",
]

_pos_int = attrs.validators.gt(0)

#: Hugging Face's names of the blocks' linear layers that differ from ours (``hf_linear_names``).
HF_LINEAR_NAMES: Mapping[str, frozenset[str]] = {
    "q_proj": frozenset({"wq"}),
    "k_proj": frozenset({"wk"}),
    "v_proj": frozenset({"wv"}),
    "o_proj": frozenset({"wo"}),
    "gate_proj": frozenset({"w1"}),
    "up_proj": frozenset({"w3"}),
    "down_proj": frozenset({"w2"}),
    "in_proj_qkv": frozenset({"in_proj_q", "in_proj_k", "in_proj_v"}),
}


@config_class
class Qwen3_5Args(ModelArgs):
    """Dimensions of the hybrid Qwen 3.5 language model (dense feed-forward)."""

    dim: int = attrs.field(validator=_pos_int, metadata={"help": "Hidden size of the residual stream."})
    n_layers: int = attrs.field(validator=_pos_int, metadata={"help": "Number of transformer blocks."})
    ffn_hidden_dim: int = attrs.field(
        validator=_pos_int, metadata={"help": "Hidden size of the SwiGLU feed-forward network."}
    )
    vocab_size: int = attrs.field(
        default=248_320,
        validator=_pos_int,
        metadata={"help": "Number of token embeddings (rows of the embedding and output matrices)."},
    )
    n_heads: int = attrs.field(
        validator=_pos_int, metadata={"help": "Query heads of the full-attention blocks."}
    )
    n_kv_heads: int = attrs.field(
        validator=_pos_int, metadata={"help": "Key/value heads of the full-attention blocks (GQA)."}
    )
    head_dim: int = attrs.field(
        default=256, validator=_pos_int, metadata={"help": "Width of each full-attention head."}
    )
    attn_output_gate: bool = attrs.field(
        default=True,
        metadata={"help": "Gate the full-attention output with a sigmoid of the input (gated attention)."},
    )
    partial_rotary_factor: float = attrs.field(
        default=0.25,
        validator=attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(1.0)),
        metadata={"help": "Fraction of each full-attention head dimension that receives RoPE, in (0, 1]."},
    )
    rope_theta: float = attrs.field(
        default=10_000_000.0,
        validator=attrs.validators.gt(0.0),
        metadata={"help": "Base of the rotary position embedding frequencies."},
    )
    full_attention_interval: int = attrs.field(
        default=4,
        validator=_pos_int,
        metadata={"help": "Every n-th block uses full attention, the others linear attention (4 = 3:1)."},
    )
    linear_num_key_heads: int = attrs.field(
        validator=_pos_int, metadata={"help": "Query/key heads of the Gated DeltaNet blocks."}
    )
    linear_num_value_heads: int = attrs.field(
        validator=_pos_int, metadata={"help": "Value heads of the Gated DeltaNet blocks."}
    )
    linear_key_head_dim: int = attrs.field(
        default=128, validator=_pos_int, metadata={"help": "Width of each Gated DeltaNet query/key head."}
    )
    linear_value_head_dim: int = attrs.field(
        default=128, validator=_pos_int, metadata={"help": "Width of each Gated DeltaNet value head."}
    )
    linear_conv_kernel_dim: int = attrs.field(
        default=4,
        validator=_pos_int,
        metadata={"help": "Kernel size of the causal short convolution in the Gated DeltaNet blocks."},
    )
    linear_chunk_size: int = attrs.field(
        default=64,
        validator=_pos_int,
        metadata={
            "help": "Tokens per chunk of the chunked gated delta rule in training (speed/memory only)."
        },
    )
    norm_eps: float = attrs.field(
        default=1e-6, validator=attrs.validators.gt(0.0), metadata={"help": "Epsilon of RMSNorm."}
    )
    tie_word_embeddings: bool = attrs.field(
        default=False,
        metadata={"help": "Share the token embedding matrix with the output projection."},
    )
    max_seq_len: int = attrs.field(
        default=262_144,
        validator=_pos_int,
        metadata={"help": "Longest sequence in tokens the model is configured for."},
    )

    def fuses_loss_head(self) -> bool:
        return True

    def layer_types(self) -> tuple[Literal["linear_attention", "full_attention"], ...]:
        """The attention kind of each block, in order."""
        return tuple(
            "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"
            for i in range(self.n_layers)
        )

    def num_layers(self) -> int:
        """Number of transformer blocks."""
        return self.n_layers

    def max_sequence_length(self) -> int:
        """Longest supported sequence in tokens."""
        return self.max_seq_len

    def vocabulary_size(self) -> int:
        """Number of token ids the embedding table holds."""
        return self.vocab_size

    def compile_issue(self, backend: str) -> str | None:
        """aot_eager fails in the Gated DeltaNet gating's backward (a view of a strided gradient)."""
        if backend == "aot_eager":
            return (
                "'aot_eager' cannot compile Qwen 3.5's blocks yet (its backward of the Gated DeltaNet "
                "gating fails); use 'inductor' or 'eager'"
            )
        return None

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for head counts and the hybrid layout that cannot work."""
        if self.n_heads % self.n_kv_heads:
            yield (
                "n_kv_heads",
                said("must divide ", quote("n_heads", self.n_heads), f", got {self.n_kv_heads}"),
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            yield (
                "linear_num_key_heads",
                said(
                    "must divide ",
                    quote("linear_num_value_heads", self.linear_num_value_heads),
                    f", got {self.linear_num_key_heads}",
                ),
            )
        rotary = self.head_dim * self.partial_rotary_factor
        if rotary != int(rotary) or int(rotary) % 2:
            yield (
                "partial_rotary_factor",
                f"head_dim * partial_rotary_factor = {rotary:g} must be an even whole number",
            )
        if self.full_attention_interval > self.n_layers:
            yield (
                "full_attention_interval",
                said(
                    "must be <= ",
                    quote("n_layers", self.n_layers),
                    f" so at least one block uses full attention, got {self.full_attention_interval}",
                ),
            )

    def block_linear_names(self) -> frozenset[str]:
        """Attention ``wq wk wv wo``, the MLP's ``w1 w2 w3`` (a shared expert's under MoE) and the Gated
        DeltaNet's ``in_proj_q in_proj_k in_proj_v in_proj_z in_proj_a in_proj_b out_proj``."""
        return frozenset(
            {"wq", "wk", "wv", "wo", "w1", "w2", "w3", "out_proj"} | {f"in_proj_{part}" for part in "qkvzab"}
        )

    def hf_linear_names(self) -> Mapping[str, frozenset[str]]:
        """Hugging Face's attention and MLP (or shared expert) ``q_proj``... ``down_proj``, and the Gated
        DeltaNet's fused ``in_proj_qkv`` (our ``in_proj_q in_proj_k in_proj_v``); its ``in_proj_z``,
        ``in_proj_a``, ``in_proj_b`` and ``out_proj`` are named as here."""
        return HF_LINEAR_NAMES

    def lora_targets(self) -> frozenset[str]:
        """All of them but the Gated DeltaNet's per-head gate projections ``in_proj_a`` and ``in_proj_b``
        (one output per head: the rest of the layer's projections carry its weights)."""
        return self.block_linear_names() - {"in_proj_a", "in_proj_b"}

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(root field path, message)``: tensor parallelism splits both kinds of heads and the FFN;
        pipeline parallelism is not supported yet."""
        tp = degrees.get("tp", 1)
        if self.n_heads % tp or self.n_kv_heads % tp:
            yield (
                "parallelism.tp",
                f"must divide the model's {self.n_heads} attention heads and {self.n_kv_heads} key/value "
                f"heads, got {tp}",
            )
        if self.linear_num_key_heads % tp:  # value heads are a multiple of key heads (cross_check)
            yield (
                "parallelism.tp",
                f"must divide the model's {self.linear_num_key_heads} linear-attention (Gated DeltaNet) key "
                f"heads and {self.linear_num_value_heads} value heads, got {tp}",
            )
        if self.ffn_hidden_dim % tp:
            yield (
                "parallelism.tp",
                f"must divide the model's feed-forward hidden size {self.ffn_hidden_dim}, got {tp}",
            )
        pp = degrees.get("pp", 1)
        if pp > 1:  # blocks in a ModuleList, embeddings tied to the output: no stage split yet
            yield (
                "parallelism.pp",
                "pipeline parallelism is not supported yet by Qwen 3.5 (its model is not split into "
                f"pipeline stages); use 1 and scale with dp_shard (FSDP) or tp, got {pp}",
            )

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape (torch-free, ``estimate.parameter_shapes``)."""
        from hyper_parallel.models.qwen3_5.estimate import parameter_shapes

        return parameter_shapes(self)

    def preflight(self) -> "Qwen3_5Costs":
        """Parameter, activation and FLOP counts for the preflight estimate (torch-free)."""
        from hyper_parallel.models.qwen3_5.estimate import Qwen3_5Costs

        return Qwen3_5Costs(self)


#: Rows of the learned position table (a 48 x 48 grid), as in the released configs; not in the args yet.
NUM_POSITION_EMBEDDINGS = 2304


@config_class
class Qwen3_5VisionArgs:
    """The vision tower of the Qwen 3.5 vision-language model (a nested ``vision`` section)."""

    depth: int = attrs.field(validator=_pos_int, metadata={"help": "Number of vision transformer blocks."})
    hidden_size: int = attrs.field(
        validator=_pos_int, metadata={"help": "Hidden size of the vision transformer."}
    )
    n_heads: int = attrs.field(validator=_pos_int, metadata={"help": "Attention heads of the vision blocks."})
    intermediate_size: int = attrs.field(
        validator=_pos_int, metadata={"help": "Hidden size of the vision feed-forward network."}
    )
    in_channels: int = attrs.field(
        default=3, validator=_pos_int, metadata={"help": "Image channels (3 for RGB)."}
    )
    patch_size: int = attrs.field(
        default=16, validator=_pos_int, metadata={"help": "Side length in pixels of one image patch."}
    )
    temporal_patch_size: int = attrs.field(
        default=2, validator=_pos_int, metadata={"help": "Video frames folded into one patch."}
    )
    spatial_merge_size: int = attrs.field(
        default=2,
        validator=_pos_int,
        metadata={"help": "Side of the square of patches merged into one language-model token."},
    )
    norm_eps: float = attrs.field(
        default=1e-6, validator=attrs.validators.gt(0.0), metadata={"help": "Epsilon of the vision norms."}
    )

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)``: heads must split the vision hidden size."""
        if self.hidden_size % self.n_heads:
            yield (
                "n_heads",
                said("must divide ", quote("hidden_size", self.hidden_size), f", got {self.n_heads}"),
            )


@config_class
class Qwen3_5VLArgs(ModelArgs):
    """Qwen 3.5 vision-language model: the hybrid language model plus a vision tower."""

    text: Qwen3_5Args = attrs.field(metadata={"help": "The language model (see the qwen3_5 text flavors)."})
    vision: Qwen3_5VisionArgs = attrs.field(
        metadata={"help": "The vision tower; its merged output is projected to text.dim."}
    )
    image_token_id: int = attrs.field(
        default=248_056,
        validator=attrs.validators.ge(0),
        metadata={
            "help": "Token id of the image placeholders the vision features replace (Qwen 3.5: 248056)."
        },
    )

    def num_layers(self) -> int:
        """Number of language-model blocks."""
        return self.text.n_layers

    def max_sequence_length(self) -> int:
        """Longest supported sequence in tokens."""
        return self.text.max_seq_len

    def vocabulary_size(self) -> int:
        """Number of token ids the embedding table holds."""
        return self.text.vocab_size

    def supports_sequence_parallel(self) -> bool:
        """The language model's answer: the vision tower is never split by tensor parallelism."""
        return self.text.supports_sequence_parallel()

    def compile_issue(self, backend: str) -> str | None:
        """The language model's answer (its Gated DeltaNet blocks are what a backend may fail on)."""
        return self.text.compile_issue(backend)

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` from both towers, under ``text.`` and ``vision.``."""
        for path, message in self.text.cross_check():
            yield f"text.{path}", rebased(message, "text")
        for path, message in self.vision.cross_check():
            yield f"vision.{path}", rebased(message, "vision")

    def block_linear_names(self) -> frozenset[str]:
        """Those of the language model (LoRA adapts its blocks, never the vision tower's)."""
        return self.text.block_linear_names()

    def hf_linear_names(self) -> Mapping[str, frozenset[str]]:
        """Those of the language model."""
        return self.text.hf_linear_names()

    def lora_targets(self) -> frozenset[str]:
        """Those of the language model."""
        return self.text.lora_targets()

    def block_prefix(self) -> str:
        """The language model's blocks, under ``language_model`` (the vision tower's are never adapted)."""
        return "language_model." + self.text.block_prefix()

    def embedding_layers(self) -> Mapping[str, str]:
        """The language model's, under ``language_model``."""
        return {kind: f"language_model.{name}" for kind, name in self.text.embedding_layers().items()}

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(root field path, message)`` of the language model (tensor parallelism leaves the
        vision tower whole, so its heads need not divide ``tp``)."""
        yield from self.text.parallel_issues(degrees)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape, both towers (torch-free, ``estimate.vl_parameter_shapes``)."""
        from hyper_parallel.models.qwen3_5.estimate import vl_parameter_shapes

        return vl_parameter_shapes(self)

    def preflight(self) -> "Qwen3_5VLCosts":
        """Parameter, activation and FLOP counts for the preflight estimate (torch-free)."""
        from hyper_parallel.models.qwen3_5.estimate import Qwen3_5VLCosts

        return Qwen3_5VLCosts(self)


#: Flavor name -> language-model arguments. Sizes other than debugmodel: UNVERIFIED (see module docs).
QWEN3_5_FLAVORS: dict[str, Qwen3_5Args] = {
    "debugmodel": Qwen3_5Args(
        dim=256,
        n_layers=4,
        ffn_hidden_dim=512,
        vocab_size=2048,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
        max_seq_len=4096,
    ),
    # UNVERIFIED dims (hidden 1024, 24 layers, FFN 3584, 8 q / 2 kv heads, 16 / 16 linear heads).
    "0.8B": Qwen3_5Args(
        dim=1024,
        n_layers=24,
        ffn_hidden_dim=3584,
        n_heads=8,
        n_kv_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
    # UNVERIFIED dims (hidden 2048, 24 layers, FFN 6144, 8 q / 2 kv heads, 16 / 16 linear heads).
    "2B": Qwen3_5Args(
        dim=2048,
        n_layers=24,
        ffn_hidden_dim=6144,
        n_heads=8,
        n_kv_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
    # UNVERIFIED dims (hidden 2560, 32 layers, FFN 9216, 16 q / 4 kv heads, 16 / 32 linear heads).
    "4B": Qwen3_5Args(
        dim=2560,
        n_layers=32,
        ffn_hidden_dim=9216,
        n_heads=16,
        n_kv_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        tie_word_embeddings=True,
    ),
    # Matches the architecture defaults of transformers 5.24 (tests/models/test_qwen3_5.py checks it).
    "9B": Qwen3_5Args(
        dim=4096,
        n_layers=32,
        ffn_hidden_dim=12288,
        n_heads=16,
        n_kv_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
    ),
}

# UNVERIFIED: the vision towers follow the Qwen3-VL design (SigLIP-2 style ViT, 16-pixel patches,
# 2x2 spatial merge); the depth and widths used by each Qwen 3.5 size were not checked.
_SMALL_VISION = Qwen3_5VisionArgs(depth=24, hidden_size=1024, n_heads=16, intermediate_size=4096)
_LARGE_VISION = Qwen3_5VisionArgs(depth=27, hidden_size=1152, n_heads=16, intermediate_size=4304)

#: Flavor name -> vision-language arguments (same flavor names as the text model).
QWEN3_5_VL_FLAVORS: dict[str, Qwen3_5VLArgs] = {
    "debugmodel": Qwen3_5VLArgs(
        text=QWEN3_5_FLAVORS["debugmodel"],
        vision=Qwen3_5VisionArgs(depth=2, hidden_size=128, n_heads=4, intermediate_size=256),
    ),
    "0.8B": Qwen3_5VLArgs(text=QWEN3_5_FLAVORS["0.8B"], vision=_SMALL_VISION),
    "2B": Qwen3_5VLArgs(text=QWEN3_5_FLAVORS["2B"], vision=_SMALL_VISION),
    "4B": Qwen3_5VLArgs(text=QWEN3_5_FLAVORS["4B"], vision=_LARGE_VISION),
    "9B": Qwen3_5VLArgs(text=QWEN3_5_FLAVORS["9B"], vision=_LARGE_VISION),
}
