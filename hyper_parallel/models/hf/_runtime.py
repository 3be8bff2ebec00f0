"""Runtime hooks of a transformers causal LM referenced by its ``ModelSpec``: build, parallelize, init,
state-dict adapter.

The trainer's models map token ids (and, for packed rows, document ids) to logits; ``CausalLM`` gives
transformers' module that interface without changing it: it holds the module as ``causal_lm`` (our
parameter names are ``causal_lm.`` + transformers'), passes position ids that restart at every document,
and returns the logits. transformers reads packed documents from such position ids (a new document
wherever the position does not follow the previous one) and keeps them apart in its attention mask for
every implementation, so document masking is exact.

torch and transformers are imported inside the hooks only (the spec references these functions at
resolve time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from hyper_parallel.models._factory import require_torch
from hyper_parallel.models.hf.args import HfArgs, text_config

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["PREFIX", "HfStateDictAdapter", "build_model", "init_parameter", "parallelize"]

#: The wrapper's attribute holding transformers' module: our parameter names are it + transformers'.
PREFIX = "causal_lm."


def build_model(args: HfArgs, *, device: str = "meta") -> Any:
    """transformers' causal LM of ``args`` in a ``CausalLM`` on ``device`` (``meta``: nothing allocated)."""
    require_torch("transformers model", "build_model")
    from hyper_parallel.models.hf._module import CausalLM

    return CausalLM(args, device)


def parallelize(
    model: Any,
    parallelism: ParallelismConfig,
    device_mesh: Any,
    *,
    training: TrainingConfig | None = None,
    activation_checkpoint: ActivationCheckpointConfig | None = None,
    compile: CompileConfig | None = None,
) -> Any:
    """Activation checkpointing, ``torch.compile`` and FSDP2 (HSDP, DDP) per decoder layer, in place.

    The layers are found generically (``_layout.decoder_layers``); the order is the shared pipeline's
    (``hyper_parallel.parallel.parallelize.parallelize_model``). Tensor parallelism splits the linear layers
    the model's ``base_model_tp_plan`` names (``_tensor_parallel``); ``--dry-run`` refused what it cannot.
    """
    require_torch("transformers model", "parallelize")
    from hyper_parallel.models.hf._layout import decoder_layers
    from hyper_parallel.models.hf._tensor_parallel import apply_tp
    from hyper_parallel.parallel.parallelize import parallelize_model

    args: HfArgs = model.args
    layout = args.layout()

    def split(mesh: Any) -> None:
        issue = args.tp_issue(mesh.size())
        if issue is not None:
            raise ValueError(f"parallelism.tp: {issue}")
        apply_tp(model, layout.tp_plan, layout.base_prefix.rstrip("."), mesh)

    _, layers = decoder_layers(model.causal_lm)
    return parallelize_model(
        model,
        parallelism,
        device_mesh,
        blocks=layers,
        apply_tp=split,
        training=training,
        activation_checkpoint=activation_checkpoint,
        compile=compile,
    )


def init_parameter(args: HfArgs, name: str, tensor: Any, generator: Any) -> None:
    """Fill ``tensor``, the full value of parameter ``name``, from ``generator`` (``ModelSpec.init_fn``).

    transformers' default initialisation (``PreTrainedModel._init_weights``): matrices (linear layers,
    embeddings) normal with std ``initializer_range`` (0.02 without one), biases zero, and norm weights
    as their module builds them (ones; zeros for the ``1 + weight`` norms of Gemma), drawn one parameter at
    a time so that every layout starts from the same weights.
    """
    from torch import nn

    std = float(text_config(args.config()).get("initializer_range") or 0.02)
    if tensor.dim() >= 2:
        nn.init.normal_(tensor, mean=0.0, std=std, generator=generator)
    elif name.endswith("bias"):
        nn.init.zeros_(tensor)
    else:
        tensor.fill_(args.layout().vector_defaults.get(name, 1.0))


class HfStateDictAdapter:
    """Between this model's state dict (``causal_lm.`` + transformers' names) and transformers' own.

    The names differ by the prefix only; a checkpoint with tied embeddings stores the embeddings once
    (``lm_head.weight`` is given them back on load and left out of an export, as ``save_pretrained``
    does).
    """

    #: The arguments are the weights folder's own ``config.json`` (``overrides`` applied): ``check_weights``
    #: compares no fields with it (an override of ``rope_theta`` is the user's choice), only the tensors.
    reads_config_json: ClassVar[bool] = True

    def __init__(self, args: HfArgs, weights_path: str | None = None) -> None:
        self.args = args
        self.weights_path = weights_path

    def from_hf(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """transformers' names -> ours (tied output head added back when stored once)."""
        out = {PREFIX + name: tensor for name, tensor in state_dict.items()}
        layout = self.args.layout()
        if layout.tied and layout.output + ".weight" not in out and layout.embedding + ".weight" in out:
            out[layout.output + ".weight"] = out[layout.embedding + ".weight"]
        return out

    def to_hf(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """Ours -> transformers' names; ``KeyError`` for a name outside the model."""
        unknown = [name for name in state_dict if not name.startswith(PREFIX)]
        if unknown:
            raise KeyError(f"unexpected names in the state dict of a transformers model: {unknown[:5]}")
        return {name[len(PREFIX) :]: tensor for name, tensor in state_dict.items()}

    def hf_config(self) -> dict[str, Any]:
        """The ``config.json`` transformers loads the model from (``config.json`` after ``overrides``)."""
        config = dict(self.args.config())
        config.pop("dtype", None)
        config.pop("torch_dtype", None)
        return config
