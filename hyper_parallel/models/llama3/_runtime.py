"""Runtime hooks of Llama 3 referenced by its ``ModelSpec``: build, parallelize, state-dict adapter.

torch is never imported at module level: each hook imports the private torch modules (``_modules``,
``_parallel``, ``hyper_parallel.models._weights``) from inside its body, so resolving a config
stays cheap. The state-dict adapter only reshapes tensors through their own methods and needs no import.
"""

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_parallel.models._factory import require_torch
from hyper_parallel.models.llama3.args import LLAMA3_FLAVORS, Llama3Args

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["Llama3StateDictAdapter", "build_model", "init_parameter", "load_weights", "parallelize"]


def build_model(args: Llama3Args, *, device: str = "meta") -> Any:
    """Create the Llama 3 module for ``args`` on ``device``.

    On ``"meta"`` nothing is allocated: move it with ``model.to_empty(device=...)`` and call
    ``model.init_weights()`` (or load weights). On any other device the weights are initialised.
    """
    require_torch("Llama 3", "build_model")
    from hyper_parallel.models.llama3._modules import build_llama3

    return build_llama3(args, device)


def parallelize(
    model: Any,
    parallelism: "ParallelismConfig",
    device_mesh: Any,
    *,
    training: "TrainingConfig | None" = None,
    activation_checkpoint: "ActivationCheckpointConfig | None" = None,
    compile: "CompileConfig | None" = None,
) -> Any:
    """Parallelize a Llama 3 module in place for ``parallelism`` on ``device_mesh``.

    The order, arguments and guarantees (parameter names never change) are those of the shared pipeline,
    ``hyper_parallel.parallel.parallelize.parallelize_model``. Returns ``model``.

    Tensor parallelism splits heads and the feed-forward hidden size (Megatron style); with
    ``parallelism.sequence_parallel`` the norms and the residual stream are sharded along the sequence.
    """
    require_torch("Llama 3", "parallelize")
    from hyper_parallel.models.llama3._parallel import parallelize_llama3

    return parallelize_llama3(
        model,
        parallelism,
        device_mesh,
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


def init_parameter(args: Llama3Args, name: str, tensor: Any, generator: Any) -> None:
    """Fill ``tensor``, the full value of parameter ``name``, from ``generator`` (``ModelSpec.init_fn``).

    The distributions of ``Llama3Model.init_weights``: unit-normal embeddings, truncated-normal
    projections (std 0.02; depth-scaled for ``wo``, ``w2`` and ``w3``), unit norms, and an output scaled
    by ``dim ** -0.5`` (tied to the embeddings, these are normal with that std). Used by
    ``hyper_parallel.models.initialize`` one parameter at a time.
    """
    from torch import nn

    std = 0.02
    depth_std = std / math.sqrt(2 * args.n_layers)
    if name == "tok_embeddings.weight" and args.tie_word_embeddings:  # also the output: scaled like it
        nn.init.normal_(tensor, std=args.dim**-0.5, generator=generator)
    elif name == "tok_embeddings.weight":
        nn.init.normal_(tensor, generator=generator)
    elif name == "output.weight":
        final = args.dim**-0.5
        nn.init.trunc_normal_(tensor, std=final, a=-3 * final, b=3 * final, generator=generator)
    elif name.endswith("norm.weight"):
        nn.init.ones_(tensor)
    elif name.endswith(("attention.wo.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")):
        nn.init.trunc_normal_(tensor, std=depth_std, generator=generator)
    elif name.endswith((".wq.weight", ".wk.weight", ".wv.weight", "feed_forward.w1.weight")):
        nn.init.trunc_normal_(tensor, std=std, generator=generator)
    else:
        raise KeyError(f"no initialisation rule for Llama 3 parameter {name!r}")


def load_weights(model: Any, weights_path: str, adapter: "Llama3StateDictAdapter | None" = None) -> Any:
    """Load the Hugging Face safetensors checkpoint in the local folder ``weights_path`` into ``model``.

    Every process reads the files; under a process group prefer ``hyper_parallel.models.
    load_pretrained``, where rank 0 alone reads and broadcasts.
    """
    require_torch("Llama 3", "load_weights")
    from hyper_parallel.models._weights import load_weights as _load

    return _load(model, weights_path, adapter or Llama3StateDictAdapter(model.args, weights_path))


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_OURS_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_TOP_LEVEL = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_IN_LAYER = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_TOP_LEVEL_BACK = {ours: hf for hf, ours in _TOP_LEVEL.items()}
_IN_LAYER_BACK = {ours: hf for hf, ours in _IN_LAYER.items()}


def _hf_to_interleaved(weight: Any, n_heads: int) -> Any:
    """Rows of a q/k projection from HF's half-split rotary layout to Meta's interleaved pairs."""
    out_dim, in_dim = weight.shape
    return weight.view(n_heads, 2, out_dim // n_heads // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def _interleaved_to_hf(weight: Any, n_heads: int) -> Any:
    """Inverse of ``_hf_to_interleaved``."""
    out_dim, in_dim = weight.shape
    return weight.view(n_heads, out_dim // n_heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


class Llama3StateDictAdapter:
    """Converts between Hugging Face Llama checkpoints (``LlamaForCausalLM``) and this model's state dict.

    Names are mapped one to one; the rows of the query and key projections are permuted between HF's
    half-split rotary layout and the interleaved layout of this model. Unknown names raise ``KeyError``.
    """

    #: The flavors a weights folder's ``config.json`` is matched against (``model.flavor`` hints).
    flavors: ClassVar[Mapping[str, Llama3Args]] = LLAMA3_FLAVORS

    def __init__(self, args: Llama3Args, weights_path: str | None = None) -> None:
        self.args = args
        self.weights_path = weights_path

    @property
    def _heads(self) -> dict[str, int]:
        return {"wq": self.args.n_heads, "wk": self.args.n_kv_heads or self.args.n_heads}

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape a Hugging Face state dict into this model's layout."""
        out: dict[str, Any] = {}
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            if name.endswith("rotary_emb.inv_freq"):
                continue
            if name in _TOP_LEVEL:
                out[_TOP_LEVEL[name]] = tensor
                continue
            match = _LAYER.match(name)
            if match is None or match.group(2) not in _IN_LAYER:
                unknown.append(name)
                continue
            ours = _IN_LAYER[match.group(2)]
            kind = ours.split(".")[1]
            if kind in self._heads:
                tensor = _hf_to_interleaved(tensor, self._heads[kind])
            out[f"layers.{match.group(1)}.{ours}"] = tensor
        if unknown:
            raise KeyError(f"unexpected names in the Hugging Face Llama state dict: {unknown[:5]}")
        if self.args.tie_word_embeddings and "output.weight" not in out and "tok_embeddings.weight" in out:
            out["output.weight"] = out["tok_embeddings.weight"]  # a tied checkpoint stores it once
        return out

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape this model's state dict into the Hugging Face layout."""
        out: dict[str, Any] = {}
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            if name in _TOP_LEVEL_BACK:
                out[_TOP_LEVEL_BACK[name]] = tensor
                continue
            match = _OURS_LAYER.match(name)
            if match is None or match.group(2) not in _IN_LAYER_BACK:
                unknown.append(name)
                continue
            kind = match.group(2).split(".")[1]
            if kind in self._heads:
                tensor = _interleaved_to_hf(tensor, self._heads[kind])
            out[f"model.layers.{match.group(1)}.{_IN_LAYER_BACK[match.group(2)]}"] = tensor
        if unknown:
            raise KeyError(f"unexpected names in the Llama 3 state dict: {unknown[:5]}")
        return out

    @staticmethod
    def args_from_hf_config(config: dict[str, Any]) -> Llama3Args:
        """The arguments of the model a Hugging Face ``LlamaForCausalLM`` ``config.json`` describes.

        The inverse of :meth:`hf_config` (RoPE under ``rope_parameters``, or the older top-level
        ``rope_theta`` / ``rope_scaling``). The feed-forward size is given as is (``multiple_of`` set to
        ``intermediate_size``). Raises ``ValueError`` for what this model cannot express (biases,
        another RoPE type, a head size other than ``hidden_size / heads``).
        """
        from hyper_parallel.models.llama3.args import RopeScaling

        if config.get("attention_bias") or config.get("mlp_bias"):
            raise ValueError("attention_bias / mlp_bias: Llama 3 here has no biases")
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        theta = float(rope.get("rope_theta", config.get("rope_theta", 500_000.0)))
        kind = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if kind == "llama3":
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        elif kind != "default":
            raise ValueError(f"rope_type {kind!r} is not supported (only 'default' and 'llama3')")
        dim, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = config.get("head_dim")
        if head_dim is not None and int(head_dim) * heads != dim:
            raise ValueError(f"head_dim {head_dim} x {heads} heads != hidden_size {dim}: not supported")
        hidden = int(config["intermediate_size"])
        base = int(2 * 4 * dim / 3)  # rounded up to a multiple of `hidden` itself, it is `hidden`
        args = Llama3Args(
            dim=dim,
            n_layers=int(config["num_hidden_layers"]),
            n_heads=heads,
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            vocab_size=int(config["vocab_size"]),
            multiple_of=hidden,
            ffn_dim_multiplier=None if base <= hidden else hidden / base,
            norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_seq_len=int(config.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
        if args.ffn_hidden_dim != hidden:
            raise ValueError(f"intermediate_size {hidden} cannot be expressed (got {args.ffn_hidden_dim})")
        for path, message in args.cross_check():
            raise ValueError(f"{path}: {message}")
        return args

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` of the ``LlamaForCausalLM`` that ``to_hf``'s state dict loads into.

        Written in the layout of transformers 5 (RoPE settings under ``rope_parameters``).
        """
        args = self.args
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": args.rope_theta}
        if args.rope_scaling is not None:
            scaling = args.rope_scaling
            rope = {
                "rope_type": "llama3",
                "rope_theta": args.rope_theta,
                "factor": scaling.factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position_embeddings,
            }
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": args.vocab_size,
            "hidden_size": args.dim,
            "intermediate_size": args.ffn_hidden_dim,
            "num_hidden_layers": args.n_layers,
            "num_attention_heads": args.n_heads,
            "num_key_value_heads": args.n_kv_heads or args.n_heads,
            "head_dim": args.dim // args.n_heads,
            "hidden_act": "silu",
            "rms_norm_eps": args.norm_eps,
            "max_position_embeddings": args.max_seq_len,
            "rope_parameters": rope,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": args.tie_word_embeddings,
        }
