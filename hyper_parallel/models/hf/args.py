"""Architecture arguments of a transformers causal LM: its ``config.json``, as the model is built from it.

The arguments are the folder's ``config.json`` with ``overrides`` applied (canonical JSON text, so that
the arguments stay a frozen, comparable value) and the attention implementation transformers runs. What
the trainer asks of a model's arguments (layers, vocabulary, parameter names and shapes, the linear
layers LoRA may adapt, the parallel layouts it can run) is read from that ``config.json``, and where the
answer depends on the modules transformers builds, from the model built on ``meta`` (``_layout``: torch
and transformers are imported there, never at this module's import).
"""

import json
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import attrs

from hyper_parallel.config_base import config_class
from hyper_parallel.models.spec import ModelArgs

if TYPE_CHECKING:
    from hyper_parallel.models.hf._layout import Layout
    from hyper_parallel.models.hf.estimate import HfCosts

__all__ = ["AttnImplementation", "HfArgs", "text_config"]

#: transformers' attention implementations the trainer runs: both keep packed documents apart exactly
#: (transformers reads the documents from position ids that restart at each one).
AttnImplementation = Literal["sdpa", "eager"]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's fields of a parsed ``config.json``: its ``text_config`` where it nests one
    (a multimodal model's), else the whole config."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


@lru_cache(maxsize=16)
def _parsed(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


@config_class
class HfArgs(ModelArgs):
    """A transformers causal LM's ``config.json`` (after ``overrides``) and how transformers runs it."""

    config_json: str = attrs.field(
        validator=attrs.validators.min_len(2),
        repr=False,
        metadata={"help": "The model's config.json (overrides applied), as JSON text."},
    )
    hub_id: str | None = attrs.field(
        default=None,
        metadata={
            "help": "The Hugging Face Hub id (org/name[@revision]) the folder was found by; null: a folder."
        },
    )
    attn_implementation: AttnImplementation = attrs.field(
        default="sdpa",
        validator=attrs.validators.in_(("sdpa", "eager")),
        metadata={"help": "transformers' attention implementation: 'sdpa' or 'eager'."},
    )

    # -- config.json ---------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The parsed ``config.json`` (a shared value: do not modify it)."""
        return _parsed(self.config_json)

    @property
    def model_type(self) -> str:
        """``config.json``'s ``model_type`` (transformers' name of the architecture)."""
        return str(self.config()["model_type"])

    def _int(self, key: str) -> int | None:
        value = text_config(self.config()).get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def num_layers(self) -> int | None:
        """``num_hidden_layers``."""
        return self._int("num_hidden_layers")

    def max_sequence_length(self) -> int | None:
        """``max_position_embeddings``."""
        return self._int("max_position_embeddings")

    def vocabulary_size(self) -> int | None:
        """``vocab_size``."""
        return self._int("vocab_size")

    # -- the weights of a Hub id ------------------------------------------------------------------------
    def fetch_weights(self, *, dry_run: bool = False) -> str | None:
        """Bring a Hub id's weights into the cache (the launch, on the rank that reads them), or with
        ``dry_run`` say in one line what that would download (None: nothing; also for a local folder)."""
        if self.hub_id is None:
            return None
        from hyper_parallel._hub import fetch_weights

        return fetch_weights(self.hub_id, "model.path", dry_run=dry_run)

    # -- what the built model says --------------------------------------------------------------------
    def layout(self) -> "Layout":
        """Names and shapes of the model transformers builds from these arguments (built on ``meta``)."""
        from hyper_parallel.models.hf._layout import layout_of

        return layout_of(self.config_json, self.attn_implementation)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name (ours: ``causal_lm.`` + transformers') and shape, tied ones included."""
        return dict(self.layout().shapes)

    def block_linear_names(self) -> frozenset[str]:
        """The last names of the linear layers in the decoder layers (``q_proj``, ``qkv_proj``...)."""
        return self.layout().block_linears

    def block_prefix(self) -> str:
        """Where the decoder layers are: ``causal_lm.model.layers.`` for most models."""
        return self.layout().block_prefix

    def embedding_layers(self) -> Mapping[str, str]:
        """The input embeddings and the output head as the built model names them."""
        layout = self.layout()
        return {"embedding": layout.embedding, "output": layout.output}

    # -- what the trainer can run ---------------------------------------------------------------------
    def supports_sequence_parallel(self) -> bool:
        """transformers' plans keep the residual stream replicated (no sequence split)."""
        return False

    def heads(self) -> tuple[int, int]:
        """``(num_attention_heads, num_key_value_heads)`` of ``config.json``."""
        heads = self._int("num_attention_heads") or 1
        return heads, self._int("num_key_value_heads") or heads

    def tp_issue(self, tp: int) -> str | None:
        """Why tensor parallelism over ``tp`` ranks cannot split this model by its ``base_model_tp_plan``."""
        from hyper_parallel.models.hf._tensor_parallel import plan_issue

        layout = self.layout()
        return plan_issue(layout.tp_plan, layout.shapes, layout.base_prefix, *self.heads(), tp)

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Tensor parallelism follows the model's own ``base_model_tp_plan`` (refused with the reason
        where it has none or it does not divide); context, pipeline and expert parallelism are refused: the
        trainer applies FSDP2, HSDP, DDP and TP per decoder layer to transformers' modules, nothing else."""
        tp = degrees.get("tp", 1)
        if tp > 1:
            issue = self.tp_issue(tp)
            if issue is not None:
                yield "parallelism.tp", f"{issue} (model_type {self.model_type!r}); set parallelism.tp to 1"
        reasons = {
            "cp": "context parallelism of a transformers model is not supported (its attention takes "
            "whole sequences)",
            "pp": "pipeline parallelism of a transformers model is not supported (its forward runs the "
            "decoder layers in one call)",
            "ep": "expert parallelism of a transformers model is not supported",
        }
        for key, reason in reasons.items():
            if degrees.get(key, 1) > 1:
                yield f"parallelism.{key}", f"{reason}; set parallelism.{key} to 1"

    def preflight(self) -> "HfCosts":
        """Parameter, activation and FLOP counts for the preflight estimate."""
        from hyper_parallel.models.hf.estimate import HfCosts

        return HfCosts(self)
