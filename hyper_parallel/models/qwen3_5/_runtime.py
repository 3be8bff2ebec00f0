"""Runtime hooks of Qwen 3.5 referenced by its ``ModelSpec``: build, parallelize, state-dict adapters.

torch is never imported at module level: each hook imports the private torch modules (``_modules``,
``_parallel``, ``hyper_parallel.models._weights``) from inside its body. The state-dict adapters
only rename, reshape and split tensors through their own methods; ``to_hf`` imports torch in its body
to concatenate the Gated DeltaNet q/k/v parts back into Hugging Face's fused tensors.

The vision-language model covers images; videos (timestamped frames) are not supported yet.
"""

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from hyper_parallel.models._factory import require_torch
from hyper_parallel.models.qwen3_5.args import (
    NUM_POSITION_EMBEDDINGS,
    QWEN3_5_FLAVORS,
    Qwen3_5Args,
    Qwen3_5VisionArgs,
    Qwen3_5VLArgs,
)

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

ModelArgsLike = Qwen3_5Args | Qwen3_5VLArgs

__all__ = [
    "Qwen3_5StateDictAdapter",
    "Qwen3_5VLStateDictAdapter",
    "build_model",
    "build_vl_model",
    "init_parameter",
    "init_vl_parameter",
    "load_weights",
    "parallelize",
    "parallelize_vl",
]


def build_model(args: Qwen3_5Args, *, device: str = "meta") -> Any:
    """Create the Qwen 3.5 language model for ``args`` on ``device``.

    On ``"meta"`` nothing is allocated: move it with ``model.to_empty(device=...)`` and call
    ``model.init_weights()`` (or load weights). On any other device the weights are initialised.
    """
    require_torch("Qwen 3.5", "build_model")
    from hyper_parallel.models.qwen3_5._modules import build_qwen3_5

    return build_qwen3_5(args, device)


def parallelize(
    model: Any,
    parallelism: "ParallelismConfig",
    device_mesh: Any,
    *,
    training: "TrainingConfig | None" = None,
    activation_checkpoint: "ActivationCheckpointConfig | None" = None,
    compile: "CompileConfig | None" = None,
) -> Any:
    """Parallelize a Qwen 3.5 language model in place for ``parallelism`` on ``device_mesh``.

    The order, arguments and guarantees (parameter names never change) are those of the shared pipeline,
    ``hyper_parallel.parallel.parallelize.parallelize_model``. Returns ``model``.

    Tensor parallelism splits the heads of the full-attention and the Gated DeltaNet blocks (a rank holds
    the key heads its value heads use) and the feed-forward networks; embeddings and the output (which may
    share one matrix) are replicated across ``tp``. With ``parallelism.sequence_parallel`` the residual
    stream between blocks and its norms are split along the sequence, and each token mixer and
    feed-forward network gathers the full sequence first (see ``_parallel.apply_tp``).
    """
    require_torch("Qwen 3.5", "parallelize")
    from hyper_parallel.models.qwen3_5._parallel import parallelize_qwen3_5

    return parallelize_qwen3_5(
        model,
        parallelism,
        device_mesh,
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


_ZERO_CENTRED_NORMS = ("attention_norm.weight", "ffn_norm.weight", "q_norm.weight", "k_norm.weight")


def init_parameter(args: Qwen3_5Args, name: str, tensor: Any, generator: Any) -> None:
    """Fill ``tensor``, the full value of language-model parameter ``name`` (``ModelSpec.init_fn``).

    The distributions of ``Qwen3_5Model.init_weights``: normal embeddings and truncated-normal linears
    (std 0.02), zero residual and q/k norms (stored around zero), unit gated norms, and Gated DeltaNet's
    defaults (uniform convolutions, unit ``dt_bias``, ``A_log = log U(0.01, 16)``).
    """
    from torch import nn

    std = 0.02
    if name == "tok_embeddings.weight":
        nn.init.normal_(tensor, std=std, generator=generator)
    elif name == "norm.weight" or name.endswith(_ZERO_CENTRED_NORMS):
        nn.init.zeros_(tensor)
    elif name.endswith("linear_attn.norm.weight") or name.endswith("linear_attn.dt_bias"):
        nn.init.ones_(tensor)
    elif name.endswith(("linear_attn.conv_q", "linear_attn.conv_k", "linear_attn.conv_v")):
        bound = 1.0 / math.sqrt(args.linear_conv_kernel_dim)
        nn.init.uniform_(tensor, -bound, bound, generator=generator)
    elif name.endswith("linear_attn.A_log"):
        nn.init.uniform_(tensor, 0.01, 16.0, generator=generator).log_()
    elif name.endswith(".weight"):
        nn.init.trunc_normal_(tensor, std=std, generator=generator)
    else:
        raise KeyError(f"no initialisation rule for Qwen 3.5 parameter {name!r}")


def init_vl_parameter(args: Qwen3_5VLArgs, name: str, tensor: Any, generator: Any) -> None:
    """``init_parameter`` for the vision-language model: ``language_model.*`` as the text model; the vision
    tower as ``VisionTower.init_weights`` (truncated-normal weights, zero biases, unit LayerNorms)."""
    from torch import nn

    if name.startswith("language_model."):
        init_parameter(args.text, name[len("language_model.") :], tensor, generator)
        return
    if not name.startswith("visual."):
        raise KeyError(f"no initialisation rule for Qwen 3.5 VL parameter {name!r}")
    module, _, kind = name.rpartition(".")
    if module.rpartition(".")[2].startswith("norm"):
        (nn.init.ones_ if kind == "weight" else nn.init.zeros_)(tensor)
    elif kind == "bias":
        nn.init.zeros_(tensor)
    elif module == "visual.pos_embed":
        nn.init.normal_(tensor, std=0.02, generator=generator)
    else:
        nn.init.trunc_normal_(tensor, std=0.02, generator=generator)


def load_weights(model: Any, weights_path: str, adapter: "Qwen3_5StateDictAdapter | None" = None) -> Any:
    """Load the Hugging Face safetensors checkpoint in the local folder ``weights_path`` into ``model``.

    Every process reads the files; under a process group prefer ``hyper_parallel.models.
    load_pretrained``, where rank 0 alone reads and broadcasts.
    """
    require_torch("Qwen 3.5", "load_weights")
    from hyper_parallel.models._weights import load_weights as _load

    if adapter is None:
        vl = isinstance(model.args, Qwen3_5VLArgs)
        adapter = (Qwen3_5VLStateDictAdapter if vl else Qwen3_5StateDictAdapter)(model.args, weights_path)
    return _load(model, weights_path, adapter)


def build_vl_model(args: Qwen3_5VLArgs, *, device: str = "meta") -> Any:
    """Create the Qwen 3.5 vision-language model (vision tower + language model) for ``args``.

    ``device`` works as for ``build_model``. The module's ``forward(tokens, pixel_values, grid_thw,
    image_token_id)`` replaces image placeholder tokens by vision features and uses M-RoPE positions.
    """
    require_torch("Qwen 3.5", "build_vl_model")
    from hyper_parallel.models.qwen3_5._vl import build_qwen3_5_vl

    return build_qwen3_5_vl(args, device)


def parallelize_vl(
    model: Any,
    parallelism: "ParallelismConfig",
    device_mesh: Any,
    *,
    training: "TrainingConfig | None" = None,
    activation_checkpoint: "ActivationCheckpointConfig | None" = None,
    compile: "CompileConfig | None" = None,
) -> Any:
    """Parallelize a Qwen 3.5 vision-language model in place, as ``parallelize`` does the language model.

    The vision tower is not split by tensor parallelism (it is small next to the language model); its
    blocks are checkpointed, compiled and sharded by FSDP2 like the language model's.
    """
    require_torch("Qwen 3.5", "parallelize_vl")
    from hyper_parallel.models.qwen3_5._parallel import parallelize_qwen3_5_vl

    return parallelize_qwen3_5_vl(
        model,
        parallelism,
        device_mesh,
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


_HF_PREFIXES = ("model.language_model.", "model.")
_HF_IGNORED = ("mtp.", "model.visual.")  # multi-token-prediction head and vision tower: not in this model
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_TOP_LEVEL = {
    "embed_tokens.weight": "tok_embeddings.weight",
    "norm.weight": "norm.weight",
}
_IN_LAYER = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "linear_attn.in_proj_z.weight": "linear_attn.in_proj_z.weight",
    "linear_attn.in_proj_b.weight": "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight": "linear_attn.in_proj_a.weight",
    "linear_attn.dt_bias": "linear_attn.dt_bias",
    "linear_attn.A_log": "linear_attn.A_log",
    "linear_attn.norm.weight": "linear_attn.norm.weight",
    "linear_attn.out_proj.weight": "linear_attn.out_proj.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
#: Hugging Face's fused Gated DeltaNet tensors (channels q | k | v) and our q, k and v parts of them.
_FUSED = {
    "linear_attn.in_proj_qkv.weight": (
        "linear_attn.in_proj_q.weight",
        "linear_attn.in_proj_k.weight",
        "linear_attn.in_proj_v.weight",
    ),
    # (C, 1, K) in Hugging Face, (C, K) here
    "linear_attn.conv1d.weight": ("linear_attn.conv_q", "linear_attn.conv_k", "linear_attn.conv_v"),
}
_FUSED_BACK = {ours: (hf, index) for hf, parts in _FUSED.items() for index, ours in enumerate(parts)}
_TOP_LEVEL_BACK = {ours: hf for hf, ours in _TOP_LEVEL.items()}
_IN_LAYER_BACK = {ours: hf for hf, ours in _IN_LAYER.items()}


class Qwen3_5StateDictAdapter:
    """Converts between Hugging Face Qwen 3.5 checkpoints and this model's state dict.

    ``from_hf`` accepts the text-only layout (``Qwen3_5ForCausalLM``: ``model.layers...``) and the
    released vision-language layout (``model.language_model.layers...``), skipping the vision tower and
    the multi-token-prediction head (``mtp.*``); a tied checkpoint without ``lm_head.weight`` is
    completed from the embeddings. ``to_hf`` writes the text-only layout. Unknown names raise
    ``KeyError``; dimensions that disagree with the arguments raise ``ValueError``.
    """

    model = "Qwen 3.5"
    hf_prefix = "model."
    #: The flavors a weights folder's ``config.json`` is matched against (``model.flavor`` hints).
    flavors: ClassVar[Mapping[str, Any]] = QWEN3_5_FLAVORS

    def __init__(self, args: ModelArgsLike, weights_path: str | None = None) -> None:
        self.args = args
        self.weights_path = weights_path

    @property
    def text_args(self) -> Qwen3_5Args:
        return self.args.text if isinstance(self.args, Qwen3_5VLArgs) else self.args

    def _check_dims(self, state_dict: dict[str, Any]) -> None:
        args = self.text_args
        expected = {"tok_embeddings.weight": (args.vocab_size, args.dim)}
        if args.n_layers:
            expected["layers.0.feed_forward.w1.weight"] = (args.ffn_hidden_dim, args.dim)
        wrong = [
            f"{name}: checkpoint {tuple(state_dict[name].shape)} != arguments {shape}"
            for name, shape in expected.items()
            if name in state_dict and tuple(state_dict[name].shape) != shape
        ]
        if wrong:
            raise ValueError("checkpoint does not match the Qwen 3.5 arguments: " + "; ".join(wrong))

    def _split_fused(self, name: str, tensor: Any) -> tuple[Any, ...]:
        """The q, k and v parts (along the channels) of a fused DeltaNet tensor; convolutions as (C, K)."""
        args = self.text_args
        key_dim = args.linear_num_key_heads * args.linear_key_head_dim
        sizes = [key_dim, key_dim, args.linear_num_value_heads * args.linear_value_head_dim]
        if tensor.shape[0] != sum(sizes):
            raise ValueError(
                f"checkpoint does not match the {self.model} arguments: {name} has {tensor.shape[0]} "
                f"channels, expected q|k|v = {sizes}"
            )
        if name.endswith("conv1d.weight"):
            tensor = tensor.reshape(tensor.shape[0], tensor.shape[-1])
        return tuple(tensor.split(sizes, dim=0))

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape a Hugging Face state dict into this model's layout."""
        out: dict[str, Any] = {}
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            if name.startswith(_HF_IGNORED) or name.endswith("rotary_emb.inv_freq"):
                continue
            if name == "lm_head.weight":
                out["output.weight"] = tensor
                continue
            prefix = next((p for p in _HF_PREFIXES if name.startswith(p)), None)
            rest = name[len(prefix) :] if prefix else name
            match = _LAYER.match(rest)
            if prefix is None:
                unknown.append(name)
            elif rest in _TOP_LEVEL:
                out[_TOP_LEVEL[rest]] = tensor
            elif match is not None and match.group(2) in _IN_LAYER:
                out[f"layers.{match.group(1)}.{_IN_LAYER[match.group(2)]}"] = tensor
            elif match is not None and match.group(2) in _FUSED:
                for ours, part in zip(_FUSED[match.group(2)], self._split_fused(name, tensor), strict=True):
                    out[f"layers.{match.group(1)}.{ours}"] = part
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"unexpected names in the Hugging Face {self.model} state dict: {unknown[:5]}")
        if (
            "output.weight" not in out
            and self.text_args.tie_word_embeddings
            and "tok_embeddings.weight" in out
        ):
            out["output.weight"] = out["tok_embeddings.weight"]
        self._check_dims(out)
        return out

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape this model's state dict into the Hugging Face layout."""
        out: dict[str, Any] = {}
        unknown: list[str] = []
        fused: dict[str, dict[int, Any]] = {}  # HF name -> {part index: our tensor}
        for name, tensor in state_dict.items():
            match = _LAYER.match(name)
            if name == "output.weight":
                out["lm_head.weight"] = tensor
            elif name in _TOP_LEVEL_BACK:
                out[self.hf_prefix + _TOP_LEVEL_BACK[name]] = tensor
            elif match is not None and match.group(2) in _IN_LAYER_BACK:
                out[f"{self.hf_prefix}layers.{match.group(1)}.{_IN_LAYER_BACK[match.group(2)]}"] = tensor
            elif match is not None and match.group(2) in _FUSED_BACK:
                hf, index = _FUSED_BACK[match.group(2)]
                fused.setdefault(f"{self.hf_prefix}layers.{match.group(1)}.{hf}", {})[index] = tensor
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"unexpected names in the {self.model} state dict: {unknown[:5]}")
        incomplete = [name for name, parts in fused.items() if len(parts) != 3]
        if incomplete:
            raise KeyError(f"{self.model} state dict lacks q, k or v parts of: {incomplete[:5]}")
        if fused:
            import torch

            for name, parts in fused.items():
                tensor = torch.cat([parts[0], parts[1], parts[2]], dim=0)
                out[name] = tensor.unsqueeze(1) if name.endswith("conv1d.weight") else tensor
        return out

    @staticmethod
    def args_from_hf_config(config: dict[str, Any]) -> Qwen3_5Args:
        """The arguments of the model a Hugging Face ``Qwen3_5ForCausalLM`` ``config.json`` describes.

        The inverse of :meth:`hf_config`. ``layer_types`` must repeat one full-attention block every
        ``n`` blocks (``full_attention_interval``); ``linear_chunk_size`` (not a Hugging Face key) is read
        when present. Raises ``ValueError`` for what this model cannot express.
        """
        args = Qwen3_5Args(
            ffn_hidden_dim=int(config["intermediate_size"]), **Qwen3_5StateDictAdapter.text_fields(config)
        )
        for path, message in args.cross_check():
            raise ValueError(f"{path}: {message}")
        return args

    @staticmethod
    def text_fields(config: dict[str, Any]) -> dict[str, Any]:
        """The arguments of the hybrid token mixers, norms and embeddings a ``config.json`` gives.

        Every argument of :class:`Qwen3_5Args` but the feed-forward size, which the dense model and the
        mixture of experts read from different keys. Raises ``ValueError`` for what this model cannot
        express, ``KeyError`` for a missing key.
        """
        if config.get("attention_bias"):
            raise ValueError("attention_bias: Qwen 3.5 here has no attention biases")
        if config.get("attn_output_gate", True) is not True:
            raise ValueError("attn_output_gate: the exported Qwen 3.5 attention is always gated")
        rope = dict(config.get("rope_parameters") or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
        n_layers = int(config["num_hidden_layers"])
        types = list(config.get("layer_types") or [])
        interval = next(
            (
                n
                for n in range(1, n_layers + 1)
                if types
                == ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(n_layers)]
            ),
            None,
        )
        if interval is None:
            raise ValueError(
                "layer_types: not one full-attention block every n blocks, which is all this model builds"
            )
        chunk_default = int(attrs.fields_dict(Qwen3_5Args)["linear_chunk_size"].default or 64)
        return {
            "dim": int(config["hidden_size"]),
            "n_layers": n_layers,
            "vocab_size": int(config["vocab_size"]),
            "n_heads": int(config["num_attention_heads"]),
            "n_kv_heads": int(config["num_key_value_heads"]),
            "head_dim": int(config["head_dim"]),
            "partial_rotary_factor": float(
                rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.25))
            ),
            "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10_000_000.0))),
            "full_attention_interval": interval,
            "linear_num_key_heads": int(config["linear_num_key_heads"]),
            "linear_num_value_heads": int(config["linear_num_value_heads"]),
            "linear_key_head_dim": int(config["linear_key_head_dim"]),
            "linear_value_head_dim": int(config["linear_value_head_dim"]),
            "linear_conv_kernel_dim": int(config.get("linear_conv_kernel_dim", 4)),
            "linear_chunk_size": int(config.get("linear_chunk_size") or chunk_default),
            "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
            "max_seq_len": int(config.get("max_position_embeddings", 262_144)),
        }

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` of the ``Qwen3_5ForCausalLM`` that ``to_hf``'s state dict loads into.

        Written in the layout of transformers 5 (``qwen3_5_text``, RoPE under ``rope_parameters``).
        Raises ``ValueError`` for arguments Hugging Face's model cannot express.
        """
        args = self.text_args
        if not args.attn_output_gate:
            raise ValueError(
                "model.args.attn_output_gate: false has no Hugging Face Qwen 3.5 equivalent (its full "
                "attention is always gated)"
            )
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": args.vocab_size,
            "hidden_size": args.dim,
            "intermediate_size": args.ffn_hidden_dim,
            "num_hidden_layers": args.n_layers,
            "num_attention_heads": args.n_heads,
            "num_key_value_heads": args.n_kv_heads,
            "head_dim": args.head_dim,
            "hidden_act": "silu",
            "layer_types": list(args.layer_types()),
            "linear_num_key_heads": args.linear_num_key_heads,
            "linear_num_value_heads": args.linear_num_value_heads,
            "linear_key_head_dim": args.linear_key_head_dim,
            "linear_value_head_dim": args.linear_value_head_dim,
            "linear_conv_kernel_dim": args.linear_conv_kernel_dim,
            "rms_norm_eps": args.norm_eps,
            "max_position_embeddings": args.max_seq_len,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": args.rope_theta,
                "partial_rotary_factor": args.partial_rotary_factor,
            },
            "attention_bias": False,
            "tie_word_embeddings": args.tie_word_embeddings,
        }


_VISUAL_RENAMES = (("patch_embed.proj.", "patch_embed."),)
#: The epsilon of transformers' Qwen 3.5 vision LayerNorms (fixed there, not a config key).
_HF_VISION_NORM_EPS = 1e-6


class Qwen3_5VLStateDictAdapter(Qwen3_5StateDictAdapter):
    """Converts between Hugging Face Qwen 3.5 vision-language checkpoints and this model's state dict.

    Hugging Face ``model.visual.*`` maps to ``visual.*`` (the patch embedding's ``proj`` level dropped);
    the language model (``model.language_model.*``, ``lm_head``) maps to ``language_model.*`` as in the
    text adapter. The multi-token-prediction head (``mtp.*``) is skipped.
    """

    model = "Qwen 3.5 VL"
    hf_prefix = "model.language_model."

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename a Hugging Face ``Qwen3_5ForConditionalGeneration`` state dict into this model's layout."""
        text = {k: v for k, v in state_dict.items() if not k.startswith("model.visual.")}
        out = {f"language_model.{k}": v for k, v in super().from_hf(text).items()}
        for name, tensor in state_dict.items():
            if name.startswith("model.visual."):
                rest = name[len("model.visual.") :]
                for hf, ours in _VISUAL_RENAMES:
                    rest = rest.replace(hf, ours, 1) if rest.startswith(hf) else rest
                out[f"visual.{rest}"] = tensor
        return out

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename this model's state dict into the Hugging Face vision-language layout."""
        text = {
            k[len("language_model.") :]: v for k, v in state_dict.items() if k.startswith("language_model.")
        }
        out = super().to_hf(text)
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            if name.startswith("language_model."):
                continue
            if not name.startswith("visual."):
                unknown.append(name)
                continue
            rest = name[len("visual.") :]
            for hf, ours in _VISUAL_RENAMES:
                rest = rest.replace(ours, hf, 1) if rest.startswith(ours) else rest
            out[f"model.visual.{rest}"] = tensor
        if unknown:
            raise KeyError(f"unexpected names in the {self.model} state dict: {unknown[:5]}")
        return out

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` of the ``Qwen3_5ForConditionalGeneration`` that ``to_hf``'s state dict loads
        into (transformers 5: the language model under ``text_config``, the tower under ``vision_config``).

        The tower's activation, RoPE and position table are Qwen 3.5's, which transformers' defaults hold;
        a ``vision.norm_eps`` other than its fixed 1e-6 cannot be written (``ValueError``).
        """
        args = self.args
        assert isinstance(args, Qwen3_5VLArgs)
        vision = args.vision
        if vision.norm_eps != _HF_VISION_NORM_EPS:
            raise ValueError(
                f"model.args.vision.norm_eps: {vision.norm_eps} has no Hugging Face Qwen 3.5 VL equivalent "
                f"(its vision norms use {_HF_VISION_NORM_EPS})"
            )
        text = super().hf_config()
        del text["architectures"]
        return {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text,
            "vision_config": {
                "model_type": "qwen3_5_vision",
                "depth": vision.depth,
                "hidden_size": vision.hidden_size,
                "num_heads": vision.n_heads,
                "intermediate_size": vision.intermediate_size,
                "in_channels": vision.in_channels,
                "patch_size": vision.patch_size,
                "temporal_patch_size": vision.temporal_patch_size,
                "spatial_merge_size": vision.spatial_merge_size,
                "out_hidden_size": args.text.dim,
                "num_position_embeddings": NUM_POSITION_EMBEDDINGS,
                "hidden_act": "gelu_pytorch_tanh",
            },
            "image_token_id": args.image_token_id,
            "tie_word_embeddings": text["tie_word_embeddings"],
        }

    @staticmethod
    def args_from_hf_config(config: dict[str, Any]) -> Qwen3_5VLArgs:  # type: ignore[override]
        """The arguments of the model a ``Qwen3_5ForConditionalGeneration`` ``config.json`` describes: the
        inverse of :meth:`hf_config`. Raises ``ValueError`` for what this model cannot express."""
        text_config, vision_config = dict(config["text_config"]), dict(config["vision_config"])
        text = Qwen3_5StateDictAdapter.args_from_hf_config(text_config)
        if int(vision_config.get("out_hidden_size", text.dim)) != text.dim:
            raise ValueError("vision_config.out_hidden_size: the tower must project to text hidden_size")
        table = int(vision_config.get("num_position_embeddings", NUM_POSITION_EMBEDDINGS))
        if table != NUM_POSITION_EMBEDDINGS:
            raise ValueError(f"vision_config.num_position_embeddings: {table}, not {NUM_POSITION_EMBEDDINGS}")
        if vision_config.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ValueError("vision_config.hidden_act: only gelu_pytorch_tanh is built")
        vision = Qwen3_5VisionArgs(
            depth=int(vision_config["depth"]),
            hidden_size=int(vision_config["hidden_size"]),
            n_heads=int(vision_config["num_heads"]),
            intermediate_size=int(vision_config["intermediate_size"]),
            in_channels=int(vision_config.get("in_channels", 3)),
            patch_size=int(vision_config.get("patch_size", 16)),
            temporal_patch_size=int(vision_config.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision_config.get("spatial_merge_size", 2)),
        )
        image_token_id = int(config.get("image_token_id", 248_056))
        args = Qwen3_5VLArgs(text=text, vision=vision, image_token_id=image_token_id)
        for path, message in args.cross_check():
            raise ValueError(f"{path}: {message}")
        return args
