"""Runtime hooks of Qwen 3.5 MoE referenced by its ``ModelSpec``: build, parallelize, state-dict adapter.

torch is imported only inside the hooks' bodies. The token mixers, norms and embeddings are Qwen 3.5's, so
their initialisation and Hugging Face names come from ``hyper_parallel.models.qwen3_5._runtime``; this
module adds the mixture of experts.
"""

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_parallel.models._factory import require_torch
from hyper_parallel.models.qwen3_5._runtime import Qwen3_5StateDictAdapter
from hyper_parallel.models.qwen3_5._runtime import init_parameter as init_dense_parameter
from hyper_parallel.models.qwen3_5_moe.args import QWEN3_5_MOE_FLAVORS, Qwen3_5MoeArgs

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["Qwen3_5MoeStateDictAdapter", "build_model", "init_parameter", "parallelize"]


def build_model(args: Qwen3_5MoeArgs, *, device: str = "meta") -> Any:
    """Create the Qwen 3.5 MoE language model for ``args`` on ``device`` (``"meta"``: nothing allocated)."""
    require_torch("Qwen 3.5 MoE", "build_model")
    from hyper_parallel.models.qwen3_5_moe._modules import build_qwen3_5_moe

    return build_qwen3_5_moe(args, device)


def parallelize(
    model: Any,
    parallelism: "ParallelismConfig",
    device_mesh: Any,
    *,
    training: "TrainingConfig | None" = None,
    activation_checkpoint: "ActivationCheckpointConfig | None" = None,
    compile: "CompileConfig | None" = None,
) -> Any:
    """Parallelize a Qwen 3.5 MoE model in place: expert parallelism (``parallelism.ep``: each block's
    experts split over the ``ep`` ranks, tokens sent to them by all-to-all), then Qwen 3.5's pipeline
    (AC, compile, FSDP2 over the blocks; the experts' FSDP2 over the data-parallel ranks ``ep`` leaves).
    Tensor parallelism is refused by the arguments (``parallel_issues``)."""
    require_torch("Qwen 3.5 MoE", "parallelize")
    from hyper_parallel.models.qwen3_5_moe._modules import Qwen3_5MoeModel
    from hyper_parallel.parallel.parallelize import parallelize_model

    if not isinstance(model, Qwen3_5MoeModel):
        raise TypeError(f"expected a Qwen3_5MoeModel, got {type(model).__name__}")
    return parallelize_model(
        model,
        parallelism,
        device_mesh,
        blocks=list(model.layers),
        apply_tp=lambda tp_mesh: None,  # refused at resolve time (Qwen3_5MoeArgs.parallel_issues)
        moe_layers=model.moe_layers(),
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


_EXPERT_WEIGHTS = ("feed_forward.experts.w13", "feed_forward.experts.w2")


def init_parameter(args: Qwen3_5MoeArgs, name: str, tensor: Any, generator: Any) -> None:
    """Fill ``tensor``, the full value of parameter ``name`` (``ModelSpec.init_fn``): the experts
    truncated-normal (std 0.02) as ``Qwen3_5MoeModel.init_weights``, the rest as Qwen 3.5."""
    from torch import nn

    if name.endswith(_EXPERT_WEIGHTS):
        nn.init.trunc_normal_(tensor, std=0.02, generator=generator)
    else:
        init_dense_parameter(args, name, tensor, generator)


_HF_LAYER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.mlp\.(.+)$")
_HF_EXPERT = re.compile(r"^experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_MLP = {
    "gate.weight": "router.weight",
    "shared_expert.gate_proj.weight": "shared_expert.w1.weight",
    "shared_expert.up_proj.weight": "shared_expert.w3.weight",
    "shared_expert.down_proj.weight": "shared_expert.w2.weight",
    "shared_expert_gate.weight": "shared_expert_gate.weight",
}
_MLP_BACK = {ours: hf for hf, ours in _MLP.items()}
#: A routed expert's projections in a Hugging Face checkpoint: gate and up form ``w13``, down is ``w2``.
_HF_PROJ = ("gate_proj", "up_proj", "down_proj")
_OURS = re.compile(r"^layers\.(\d+)\.feed_forward\.(.+)$")


class Qwen3_5MoeStateDictAdapter(Qwen3_5StateDictAdapter):
    """Converts between Hugging Face Qwen 3.5 MoE checkpoints and this model's state dict.

    The token mixers, norms and embeddings map as in Qwen 3.5. Each block's ``mlp`` maps to
    ``feed_forward``: ``gate`` to ``router``, the shared expert's projections to ``w1``/``w3``/``w2``;
    the routed experts are accepted per expert (``experts.<j>.{gate,up,down}_proj.weight``, the layout
    of the released checkpoints and of ``save_pretrained``: expert ``j``'s gate and up stacked into
    ``experts.w13[j]``) or fused (``experts.gate_up_proj``, ``experts.down_proj``, transformers'
    in-memory layout, which is ours), and written per expert (``w13[j]`` split back into its halves).
    """

    model = "Qwen 3.5 MoE"
    #: The flavors a weights folder's ``config.json`` is matched against (``model.flavor`` hints).
    flavors: ClassVar[Mapping[str, Any]] = QWEN3_5_MOE_FLAVORS

    @property
    def moe_args(self) -> Qwen3_5MoeArgs:
        assert isinstance(self.args, Qwen3_5MoeArgs)
        return self.args

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and stack a Hugging Face state dict into this model's layout."""
        rest: dict[str, Any] = {}
        out: dict[str, Any] = {}
        per_expert: dict[tuple[str, str], dict[int, Any]] = {}  # (layer, HF projection) -> {expert: tensor}
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            match = _HF_LAYER.match(name)
            if match is None:
                rest[name] = tensor
                continue
            layer, sub = match.groups()
            prefix = f"layers.{layer}.feed_forward."
            expert = _HF_EXPERT.match(sub)
            if sub in _MLP:
                out[prefix + _MLP[sub]] = tensor
            elif expert is not None:
                per_expert.setdefault((layer, expert.group(2)), {})[int(expert.group(1))] = tensor
            elif sub == "experts.gate_up_proj":
                out[prefix + "experts.w13"] = tensor
            elif sub == "experts.down_proj":
                out[prefix + "experts.w2"] = tensor
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"unexpected names in the Hugging Face {self.model} state dict: {unknown[:5]}")
        n = self.moe_args.n_experts
        for layer in sorted({layer for layer, _ in per_expert}, key=int):
            gate, up, down = (self._experts(per_expert, layer, proj) for proj in _HF_PROJ)
            # each expert's gate rows then its up rows, written in place (no second stacked copy); tensor
            # methods only, so the weights check maps shapes through this code without torch
            rows = gate[0].shape[0]
            w13 = gate[0].new_empty((n, rows + up[0].shape[0], *gate[0].shape[1:]))
            w2 = down[0].new_empty((n, *down[0].shape))
            for j in range(n):
                w13[j, :rows].copy_(gate[j])
                w13[j, rows:].copy_(up[j])
                w2[j].copy_(down[j])
            prefix = f"layers.{layer}.feed_forward.experts."
            out[prefix + "w13"] = w13
            out[prefix + "w2"] = w2
        out.update(super().from_hf(rest))
        self._check_experts(out)
        return out

    def _experts(
        self, per_expert: Mapping[tuple[str, str], dict[int, Any]], layer: str, proj: str
    ) -> list[Any]:
        """Expert ``0 .. n - 1``'s ``proj`` weight of ``layer``; a ``ValueError`` naming a missing one."""
        n = self.moe_args.n_experts
        experts = per_expert.get((layer, proj), {})
        if sorted(experts) != list(range(n)):
            missing = sorted(set(range(n)) - set(experts))[:5]
            raise ValueError(
                f"checkpoint does not match the {self.model} arguments: layer {layer} has experts "
                f"{len(experts)} of n_experts={n} for {proj} (missing e.g. {missing})"
            )
        return [experts[j] for j in range(n)]

    def _check_experts(self, state_dict: dict[str, Any]) -> None:
        a = self.moe_args
        expected = {
            "experts.w13": (a.n_experts, 2 * a.ffn_hidden_dim, a.dim),
            "experts.w2": (a.n_experts, a.dim, a.ffn_hidden_dim),
            "shared_expert.w1.weight": (a.shared_expert_hidden_dim, a.dim),
            "router.weight": (a.n_experts, a.dim),
        }
        wrong = [
            f"{name}: checkpoint {tuple(state_dict[name].shape)} != arguments {shape}"
            for key, shape in expected.items()
            for name in (f"layers.0.feed_forward.{key}",)
            if name in state_dict and tuple(state_dict[name].shape) != shape
        ]
        if wrong:
            raise ValueError(f"checkpoint does not match the {self.model} arguments: " + "; ".join(wrong))

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename this model's state dict into the Hugging Face layout (experts one by one)."""
        rest: dict[str, Any] = {}
        out: dict[str, Any] = {}
        unknown: list[str] = []
        for name, tensor in state_dict.items():
            match = _OURS.match(name)
            if match is None:
                rest[name] = tensor
                continue
            layer, sub = match.groups()
            prefix = f"{self.hf_prefix}layers.{layer}.mlp."
            if sub in _MLP_BACK:
                out[prefix + _MLP_BACK[sub]] = tensor
            elif sub == "experts.w13":
                for j, (gate, up) in enumerate(zip(*tensor.chunk(2, dim=1), strict=True)):
                    out[f"{prefix}experts.{j}.gate_proj.weight"] = gate
                    out[f"{prefix}experts.{j}.up_proj.weight"] = up
            elif sub == "experts.w2":
                for j in range(tensor.shape[0]):
                    out[f"{prefix}experts.{j}.down_proj.weight"] = tensor[j]
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"unexpected names in the {self.model} state dict: {unknown[:5]}")
        out.update(super().to_hf(rest))
        return out

    @staticmethod
    def args_from_hf_config(config: dict[str, Any]) -> Qwen3_5MoeArgs:
        """The arguments of the model a Hugging Face ``Qwen3_5MoeForCausalLM`` ``config.json`` describes.

        The inverse of :meth:`hf_config`: the token mixers as Qwen 3.5 reads them, the experts from
        ``moe_intermediate_size``, ``num_experts``, ``num_experts_per_tok`` and
        ``shared_expert_intermediate_size``. The top-k probabilities are always renormalised there
        (``norm_topk_prob``). Raises ``ValueError`` for what this model cannot express.
        """
        fields = Qwen3_5StateDictAdapter.text_fields(config)
        if "router_aux_loss_coef" in config:  # else our default (transformers' too)
            fields["router_aux_loss_coef"] = float(config["router_aux_loss_coef"])
        args = Qwen3_5MoeArgs(
            ffn_hidden_dim=int(config["moe_intermediate_size"]),
            n_experts=int(config["num_experts"]),
            n_experts_per_token=int(config["num_experts_per_tok"]),
            shared_expert_hidden_dim=int(config["shared_expert_intermediate_size"]),
            norm_topk_prob=True,
            **fields,
        )
        for path, message in args.cross_check():
            raise ValueError(f"{path}: {message}")
        return args

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` of the ``Qwen3_5MoeForCausalLM`` that ``to_hf``'s state dict loads into."""
        a = self.moe_args
        if not a.norm_topk_prob:
            raise ValueError(
                "model.args.norm_topk_prob: false has no Hugging Face Qwen 3.5 MoE equivalent (its router "
                "always renormalises the top-k probabilities)"
            )
        config = super().hf_config()
        del config["intermediate_size"]
        config.update(
            {
                "architectures": ["Qwen3_5MoeForCausalLM"],
                "model_type": "qwen3_5_moe_text",
                "moe_intermediate_size": a.ffn_hidden_dim,
                "shared_expert_intermediate_size": a.shared_expert_hidden_dim,
                "num_experts": a.n_experts,
                "num_experts_per_tok": a.n_experts_per_token,
                "router_aux_loss_coef": a.router_aux_loss_coef,
            }
        )
        return config
