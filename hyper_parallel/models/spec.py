"""``ModelSpec``: what a model factory returns for the root ``model`` field.

A spec names a model and flavor, carries its typed architecture arguments, and points at the runtime
hooks (build, parallelize, state-dict adapter, parameter initialisation) without calling them.
Resolving a config therefore never creates a model, imports torch or reads the weights.
"""

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import attrs

from hyper_parallel._checks import RuleTypeViolation
from hyper_parallel.config_base import ConfigBase, config_class

__all__ = ["ModelArgs", "ModelSpec"]


@config_class
class ModelArgs(ConfigBase):
    """Base of every model's architecture arguments (``Llama3Args``, ``Qwen3_5Args`` ...); subclasses add
    their dimension checks in ``cross_check``."""

    def num_layers(self) -> int | None:
        """Number of transformer blocks (used by cross-group checks); ``None`` when not applicable."""
        return None

    def max_sequence_length(self) -> int | None:
        """Longest sequence the model supports in tokens; ``None`` when unbounded or unknown."""
        return None

    def vocabulary_size(self) -> int | None:
        """Number of token ids the embedding table holds; ``None`` when not applicable."""
        return None

    def parameter_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """Every parameter's name and shape in the model these arguments build, computed without torch (so
        that ``--dry-run`` can check a weights folder against it); ``None`` when the arguments do not say."""
        return None

    def expert_count(self) -> int | None:
        """Routed experts per mixture-of-experts layer (what ``parallelism.ep`` splits); ``None``: dense."""
        return None

    def supports_sequence_parallel(self) -> bool:
        """Whether the tensor-parallel plan can shard the residual stream along the sequence."""
        return True

    def compile_issue(self, backend: str) -> str | None:
        """Why ``torch.compile`` of the blocks with ``backend`` cannot run yet; ``None`` when it can."""
        return None

    def fuses_loss_head(self) -> bool:
        """Whether the model's forward takes a ``head`` that replaces its output projection (the fused,
        chunked cross entropy of ``loss.chunk_tokens`` is handed the final hidden states and the output
        weight); False unless a model says so."""
        return False

    def block_linear_names(self) -> frozenset[str] | None:
        """The last names of the linear layers in the transformer blocks (what ``peft.targets`` may
        name); ``None`` when the arguments do not say."""
        return None

    def hf_linear_names(self) -> Mapping[str, frozenset[str]]:
        """Hugging Face's last names of the blocks' linear layers (``q_proj``, ``down_proj``...) that differ
        from ours, each to the layers of ours it names (one fused tensor there can be several layers here):
        ``peft.targets`` takes either spelling. Empty when the arguments do not say."""
        return {}

    def lora_targets(self) -> frozenset[str] | None:
        """The linear layers of the blocks LoRA adapts when ``peft.targets`` is empty (a subset of
        ``block_linear_names``); ``None`` when the arguments do not say."""
        return self.block_linear_names()

    def block_prefix(self) -> str:
        """What the names of the transformer blocks' modules start with, before the block's index:
        LoRA adapts linear layers there and nowhere else (never the embeddings or the output head)."""
        return "layers."

    def embedding_layers(self) -> Mapping[str, str]:
        """The modules outside the blocks QLoRA may store as NF4 (``peft.quantize_embeddings``), by the
        preflight's kind of parameter: the token embedding and the output projection (one matrix when
        tied), named as in the built model."""
        return {"embedding": "tok_embeddings", "output": "output"}

    def parallel_issues(self, degrees: Mapping[str, int]) -> Iterator[tuple[str, str]]:
        """Yield ``(root field path, message)`` for resolved parallel ``degrees`` this model cannot run.

        ``degrees`` maps ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``, ``pp`` and ``ep`` to resolved
        values (no -1). Paths start at the root config, e.g. ``"parallelism.tp"``. Subclasses add checks.
        """
        yield from ()


def _is_class(instance: object, attribute: "attrs.Attribute[Any]", value: object) -> None:
    if not isinstance(value, type):
        raise RuleTypeViolation(attribute.name, "must be a class", value)


@attrs.frozen(kw_only=True, slots=False)
class ModelSpec:
    """A model chosen by name and flavor, with its arguments and runtime hooks (not yet called)."""

    #: Not a ``_target_``: a config names a factory that returns a spec (``...llama3.create_model_spec``).
    __abstract__: ClassVar[bool] = True
    #: The flavor of a spec whose ``flavor: auto`` could not read ``weights_path``'s ``config.json`` yet
    #: (not on this machine): its arguments are the family's default flavor's until the launch reads it.
    UNREAD: ClassVar[str] = "auto"

    name: str = attrs.field(
        validator=attrs.validators.min_len(1),
        metadata={"help": "Model family name, e.g. 'llama3' or 'qwen3_5'."},
    )
    flavor: str = attrs.field(
        default="custom",
        validator=attrs.validators.min_len(1),
        metadata={"help": "Size or variant within the family, e.g. '8B' or 'debugmodel'."},
    )

    # A spec written by hand (RFC 5.4: name and hooks only) gets the base arguments, which state no limit.
    args: ModelArgs = attrs.field(
        factory=ModelArgs,
        # "made_from": the factory parameter a config sets these through (a hint for 'model.args.X').
        metadata={
            "help": "Typed architecture arguments of this flavor (after overrides).",
            "made_from": "overrides",
        },
    )
    weights_path: str | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.min_len(1)),
        metadata={
            "help": "Folder of pretrained weights (a Hub id's cached snapshot); null trains from random init."
        },
    )
    build_model_fn: Callable[..., Any] = attrs.field(
        validator=attrs.validators.is_callable(),
        metadata={"help": "Runtime hook creating the model from args (called by the trainer, not here)."},
    )
    parallelize_fn: Callable[..., Any] = attrs.field(
        validator=attrs.validators.is_callable(),
        metadata={"help": "Runtime hook applying TP/FSDP/PP/CP and compile to a built model."},
    )
    state_dict_adapter: type = attrs.field(
        validator=_is_class,
        metadata={"help": "Class converting between this model's state dict and the Hugging Face layout."},
    )
    init_fn: Callable[..., Any] | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.is_callable()),
        metadata={"help": "Runtime hook (args, name, full_tensor, generator) filling one parameter."},
    )
    # Not an argument: set by the config layer on the spec a factory returns, so that a copy or a pickle
    # of the spec can still be written back (and overridden) as that factory call. Never compared.
    recipe: object = attrs.field(
        default=None,
        init=False,
        eq=False,
        repr=False,
        metadata={"help": "The factory call that made this spec (set by the config layer; not compared)."},
    )

    @property
    def flavor_unread(self) -> bool:
        """Whether ``flavor: auto`` is still to read ``weights_path``'s ``config.json`` (``UNREAD``)."""
        return self.flavor == self.UNREAD

    @property
    def awaits_weights(self) -> bool:
        """Whether the spec was made before its weights were on this machine: ``flavor: auto`` unread, or a
        Hub id the cache lacked (kept as written). The launch resolves the config again once its file
        checks fetched them; nothing builds such a spec."""
        from hyper_parallel._hub import is_hub_id

        return self.flavor_unread or (self.weights_path is not None and is_hub_id(self.weights_path))

    def title(self) -> str:
        """``qwen3_5 debugmodel + n_layers=6, dim=512``: the family, the flavor and the arguments its factory
        was asked to override (what the flavor's name alone would misstate); an unread ``auto`` says so."""
        made = getattr(self.recipe, "args", None)
        overrides = made.get("overrides") if isinstance(made, Mapping) else None
        flavor = f"{self.flavor} (config.json not read yet: the default flavor's sizes)"
        shown = f"{self.name} {flavor if self.flavor_unread else self.flavor}"
        if isinstance(overrides, Mapping) and overrides:
            shown += " + " + ", ".join(f"{key}={value}" for key, value in overrides.items())
        return shown

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for inconsistent model arguments, under ``args.``."""
        for path, message in self.args.cross_check():
            yield (f"args.{path}" if path else "args"), message
