"""Parameter-efficient fine-tuning: the type of the root ``peft`` field.

The default, ``FullFineTuning.Config``, trains every weight (the model is left as it is).

``LoRA.Config`` freezes the model (no gradient, no optimizer state) and adds to each targeted linear layer
``y = W x + (alpha / rank) * B A dropout(x)``, with ``A`` (``rank x in``) drawn at random and ``B``
(``out x rank``) zero, so training starts from the model's own outputs and only ``A`` and ``B`` train.
The adapters are parameters of the layers they adapt (``<layer>.lora_A``, ``<layer>.lora_B``), so
FSDP2 shards them with their block, activation checkpointing and compile wrap them with it. A checkpoint
holds them and their optimizer state, and the frozen base only when the run cannot build it again: with
``model.weights_path`` (or NF4) the base is read again at every start. ``base_dtype: bfloat16`` stores the
frozen base in bfloat16; ``base_dtype: nf4`` (QLoRA) the adapted layers' frozen weights as torchao's 4-bit
NF4 tensors, with ``quantize_embeddings`` the embeddings too, and the rest of the base in the training
dtype (``storage``: one statement the runtime, the export and the preflight read). ``python -m
hyper_parallel.export`` writes the merged model, or with ``--adapter-only`` an adapter folder the ``peft``
library loads.

The Config answers every question the rest of the code asks of a method: the trainer, the export, the
preflight and ``trainer.rules`` call its methods and never ask which method it is (``FullFineTuning``
answers each with a no-op). The model facts it needs (which layers are the blocks', which the embeddings,
what LoRA adapts by default) come from the model's ``ModelArgs``; the adapters' names and seeds from
``hyper_parallel.models``, whose weight loader skips them.

Nothing here imports torch; the methods import the runtime (``_runtime``, ``_base``) when called.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import attrs

from hyper_parallel.components.peft.storage import BASES, TORCHAO_VERSION, FrozenBase, Part, Roles, lora_roles
from hyper_parallel.config_base import ConfigBase, config_class
from hyper_parallel.models import is_adapter

#: The ``peft.targets`` entry naming every linear layer of the blocks (the ``peft`` library's spelling).
ALL_LINEAR = "all-linear"

if TYPE_CHECKING:
    import torch

    from hyper_parallel.models.spec import ModelArgs, ModelSpec
    from hyper_parallel.preflight.model import ParamGroup
    from hyper_parallel.sections import ParallelismConfig, TrainingConfig

__all__ = ["ALL_LINEAR", "PEFT", "TORCHAO_VERSION", "FullFineTuning", "LoRA"]

#: A checkpoint's full tensors by our names.
Weights = dict[str, "torch.Tensor"]
Issues = Iterator[tuple[str, str]]


class RunGroups(Protocol):
    """The root groups a method's rules read: a ``TrainerConfig`` is one (mypy checks it where the trainer's
    rules pass it). Named structurally so that this layer never imports the trainer above it."""

    @property
    def model(self) -> "ModelSpec": ...
    @property
    def training(self) -> "TrainingConfig": ...
    @property
    def parallelism(self) -> "ParallelismConfig": ...


class PEFT:
    """Base of parameter-efficient methods: holds ``Config`` for the root ``peft`` field."""

    @config_class
    class Config(ConfigBase):
        """Options every parameter-efficient method understands, and the questions the run asks of it.

        Each method answers for a model that trains whole (what ``FullFineTuning`` inherits): nothing
        to add, freeze, store, merge or check.
        """

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True
        #: Whether the method trains parameters of its own over a base (the run then fine-tunes that base).
        trains_adapters: ClassVar[bool] = False

        def apply(self, model: "torch.nn.Module", args: "ModelArgs") -> "torch.nn.Module":
            """Freeze ``model`` (built from ``args``) and add the trainable parameters; returns ``model``.

            Called before the model is parallelized: what it adds is sharded, checkpointed and
            compiled with the layers it belongs to.
            """
            return model

        def after_load(
            self, model: "torch.nn.Module", args: "ModelArgs", *, seed: int, compute_dtype: str
        ) -> None:
            """Give the added parameters their values (from ``seed``) and store the frozen ones as the
            method holds them (``compute_dtype``: ``training.mixed_precision_param``).

            Called once the model is parallelized and its weights are in place, before the first forward
            (FSDP2 re-reads its parameters then).
            """

        def checkpoint_holds_base(self, weights_path: str | None) -> bool:
            """Whether a checkpoint saves the frozen parameters too (``weights_path``: the model's).

            True for every method that trains the whole model; a method that freezes a base it can build
            again says False where it can (see ``LoRA.Config``).
            """
            return True

        def adapter_keys(self, names: Iterable[str]) -> list[str]:
            """Those of ``names`` (a state dict's) that are the method's added parameters."""
            return []

        def merged(
            self,
            weights: Weights,
            args: "ModelArgs",
            compute_dtype: str,
            rebuild_base: Callable[[], Weights] | None,
        ) -> Weights:
            """``weights`` as a plain model's: what the method added folded into the layers it adapts.

            ``rebuild_base`` gives the frozen base the run built when the checkpoint left it out
            (``checkpoint_holds_base``), else is None. ``ValueError`` for weights another method saved.
            """
            if any(is_adapter(name) for name in weights):
                raise ValueError(
                    "the checkpoint holds LoRA adapters but its config's peft is not LoRA.Config"
                )
            return weights

        def adapter_folder(
            self, weights: Weights, to_hf: Callable[[Weights], Weights]
        ) -> tuple[Weights, dict[str, Any]] | None:
            """The ``peft`` library's adapter folder of ``weights``: its tensors and ``adapter_config.json``
            (``to_hf``: the model's state-dict adapter's renaming); None for a method that adds nothing."""
            return None

        def roles(self, groups: Sequence["ParamGroup"], args: "ModelArgs", compute_dtype: str) -> Roles:
            """The preflight's view of ``groups`` (the model's parameters): which train, which are frozen
            and how they are held, and what the method adds."""
            return Roles(tuple((g, "trained") for g in groups))

        def run_issues(self, cfg: "RunGroups") -> Issues:
            """Yield ``(root field path, message)``: the method's rules across root groups (the model it
            adapts, the compute dtype, the explicit parallel degrees); ``trainer.rules`` runs them."""
            yield from ()

        def layout_issues(self, cfg: "RunGroups", degrees: Mapping[str, int]) -> Issues:
            """Yield ``(root field path, message)``: the parallel ``degrees`` (those known) the method
            cannot run with."""
            yield from ()


class FullFineTuning(PEFT):
    """No adapters: every weight of the model trains (the default)."""

    @config_class
    class Config(PEFT.Config):
        """Nothing to choose: the model is trained as it is."""


class LoRA(PEFT):
    """Low-rank adapters on the targeted linear layers of the transformer blocks (Hu et al., 2021)."""

    @config_class
    class Config(PEFT.Config):
        """Rank, scale, dropout and the layers adapted."""

        trains_adapters: ClassVar[bool] = True

        rank: int = attrs.field(
            default=8,
            validator=attrs.validators.gt(0),
            metadata={"help": "Inner dimension r of each adapter (A is r x in, B is out x r)."},
        )
        alpha: float = attrs.field(
            default=16.0,
            validator=attrs.validators.gt(0.0),
            metadata={"help": "Scale numerator: an adapter adds (alpha / rank) * B A x to its layer."},
        )
        dropout: float = attrs.field(
            default=0.0,
            validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0)),
            metadata={"help": "Dropout probability on an adapter's input, in [0, 1); 0 disables."},
        )
        targets: tuple[str, ...] = attrs.field(
            default=(),
            metadata={
                "help": "Linear layers of the blocks to adapt, by last name, ours (wq, w1...) or Hugging "
                "Face's (q_proj, gate_proj...), or all-linear; empty: the model's defaults "
                "(ModelArgs.lora_targets). Routers and routed experts are never adapted."
            },
        )

        base_dtype: Literal["float32", "bfloat16", "nf4"] = attrs.field(
            default="float32",
            metadata={
                "help": "How the frozen base is stored: 'float32' as the model holds it; 'bfloat16' half "
                "that, for runs computing in bfloat16; 'nf4' (QLoRA) the adapted layers' weights as "
                "torchao's 4-bit NormalFloat, about 0.5 byte per weight, and the rest in the training "
                "dtype (needs torchao: the 'qlora' extra)."
            },
        )
        quantize_embeddings: bool = attrs.field(
            default=False,
            metadata={
                "help": "With base_dtype 'nf4': also store the token embedding and the output projection "
                "(one matrix when tied) as NF4; off, they stay in the training dtype, as transformers' "
                "4-bit loading keeps them."
            },
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: a target is a layer's name, listed once; NF4 embeddings need
            an NF4 base."""
            yield from super().cross_check()
            seen: set[str] = set()
            for target in self.targets:
                if target == ALL_LINEAR:
                    if len(self.targets) > 1:
                        yield (
                            "targets",
                            f"{ALL_LINEAR!r} names every linear layer of the blocks: list it alone",
                        )
                elif not target.isidentifier():
                    yield (
                        "targets",
                        f"{target!r} is not a layer name (a Python identifier such as 'wq' or 'q_proj') "
                        f"nor {ALL_LINEAR!r}",
                    )
                if target in seen:
                    yield "targets", f"{target!r} is listed twice"
                seen.add(target)
            if self.quantize_embeddings and not self.base.quantized:
                yield (
                    "quantize_embeddings",
                    "true stores the embeddings as NF4, which needs base_dtype 'nf4', "
                    f"got {self.base_dtype!r}",
                )

        @property
        def base(self) -> FrozenBase:
            """How the frozen base is stored (``base_dtype``'s class): the code asks it, never the string."""
            return BASES[self.base_dtype]

        @property
        def scale(self) -> float:
            """``alpha / rank``: what ``B A x`` is multiplied by."""
            return self.alpha / self.rank

        def target_layers(self, args: "ModelArgs") -> dict[str, frozenset[str]]:
            """Each of ``targets`` and the layers of the model (our last names) it names: ours as they are,
            Hugging Face's through ``ModelArgs.hf_linear_names``, ``all-linear`` every linear layer of the
            blocks (``ModelArgs.block_linear_names``, as peft means it: never the output head). A name the
            model does not know names nothing (an empty set)."""
            ours = args.block_linear_names() or frozenset()
            hf = args.hf_linear_names()
            named: dict[str, frozenset[str]] = {}
            for target in self.targets:
                if target == ALL_LINEAR:
                    named[target] = ours
                elif target in hf:
                    named[target] = hf[target]
                else:
                    named[target] = frozenset({target}) & ours if ours else frozenset({target})
            return named

        def layer_names(self, args: "ModelArgs") -> frozenset[str]:
            """The last names of the linear layers adapted: those ``targets`` name (``target_layers``), or
            the model's defaults (``ModelArgs.lora_targets``) when empty."""
            if not self.targets:
                return frozenset(args.lora_targets() or ())
            return frozenset().union(*self.target_layers(args).values())

        def storage(self, part: Part, compute_dtype: str) -> str:
            """How the frozen ``part`` is held: a dtype's name or ``'nf4'`` (see ``storage``); the runtime,
            the export and the preflight all read this."""
            return self.base.storage(part, compute_dtype, self.quantize_embeddings)

        def apply(self, model: "torch.nn.Module", args: "ModelArgs") -> "torch.nn.Module":
            """Freeze ``model`` and add adapters to the targeted layers (see the module docstring).

            ``ValueError`` when a target matches no linear layer of the blocks.
            """
            from hyper_parallel.components.peft._runtime import apply_lora

            return apply_lora(self, model, args)

        def after_load(
            self, model: "torch.nn.Module", args: "ModelArgs", *, seed: int, compute_dtype: str
        ) -> None:
            """Draw the adapters (``A`` from ``seed``, ``B`` zero), then store the frozen base as
            :meth:`storage` says (bfloat16, NF4 ...)."""
            from hyper_parallel.components.peft._base import store_base
            from hyper_parallel.components.peft._runtime import initialize_adapters

            initialize_adapters(model, seed=seed)
            store_base(model, self, args, compute_dtype)

        def checkpoint_holds_base(self, weights_path: str | None) -> bool:
            """False when the frozen base comes from ``weights_path`` or is quantized (NF4): a checkpoint
            holds the adapters and their optimizer state alone, and a resume or the export builds the base
            again (from those weights, or from the seed) and quantizes it the same way."""
            return weights_path is None and not self.base.quantized

        def adapter_keys(self, names: Iterable[str]) -> list[str]:
            """The adapters' names (``<layer>.lora_A`` / ``<layer>.lora_B``) among ``names``."""
            return [name for name in names if is_adapter(name)]

        def merged(
            self,
            weights: Weights,
            args: "ModelArgs",
            compute_dtype: str,
            rebuild_base: Callable[[], Weights] | None,
        ) -> Weights:
            """``weights`` with each adapted ``W`` replaced by ``W + scale B A`` and the adapters left out.

            A rebuilt base is first held as the run held it (:meth:`storage`): NF4 parts are the values
            their quantization stands for, every part in the dtype it computed in; the adapters are then
            merged in their own dtype (float32). ``ImportError`` when an NF4 base needs torchao.
            """
            from hyper_parallel.components.peft._runtime import merged_weights

            return merged_weights(self, weights, args, compute_dtype, rebuild_base)

        def adapter_folder(
            self, weights: Weights, to_hf: Callable[[Weights], Weights]
        ) -> tuple[Weights, dict[str, Any]]:
            """The adapters of ``weights`` (float32) in the ``peft`` library's layout (no tensors when
            ``weights`` holds none); ``KeyError`` / ``ValueError`` when ``to_hf`` cannot place them."""
            from hyper_parallel.components.peft._runtime import peft_adapter

            adapters = {name: weights[name].float() for name in self.adapter_keys(weights)}
            return peft_adapter(adapters, self, to_hf)

        def roles(self, groups: Sequence["ParamGroup"], args: "ModelArgs", compute_dtype: str) -> Roles:
            """The targeted layers' weights frozen (or NF4) with two trained adapters each; the rest of
            the base frozen as :meth:`storage` says."""
            return lora_roles(
                groups, self.layer_names(args), self.rank, lambda part: self.storage(part, compute_dtype)
            )

        def run_issues(self, cfg: "RunGroups") -> Issues:
            """The targets against the model, the base's dtype against the compute dtype, an NF4 base's
            torchao, sizes and explicit layout (``_rules``)."""
            from hyper_parallel.components.peft._rules import run_issues

            yield from run_issues(self, cfg)

        def layout_issues(self, cfg: "RunGroups", degrees: Mapping[str, int]) -> Issues:
            """An NF4 base's layouts: one process, or FSDP2 over ``dp_shard`` alone in whole NF4 blocks."""
            from hyper_parallel.components.peft._rules import layout_issues

            yield from layout_issues(self, cfg, degrees)
