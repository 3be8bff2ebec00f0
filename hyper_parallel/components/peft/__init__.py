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
dtype (``_base``). ``python -m
hyper_parallel.export`` writes the merged model, or with ``--adapter-only`` an adapter folder the ``peft``
library loads.

Nothing here imports torch; the runtime is ``hyper_parallel.components.peft._runtime``.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, Literal

import attrs

from hyper_parallel.config.base import ConfigBase, config_class

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_TARGETS", "EMBEDDING_LAYERS", "PEFT", "TORCHAO_VERSION", "FullFineTuning", "LoRA"]

#: The torchao release QLoRA is written against (the ``qlora`` extra pins it).
TORCHAO_VERSION = "0.18.0"

#: The linear layers LoRA adapts by default (those of them a model has): attention (``wq``, ``wk``,
#: ``wv``, ``wo``), the MLP (``w1``, ``w2``, ``w3``, shared experts' included) and Qwen 3.5's Gated
#: DeltaNet projections.
DEFAULT_TARGETS: tuple[str, ...] = (
    "wq",
    "wk",
    "wv",
    "wo",
    "w1",
    "w2",
    "w3",
    "in_proj_q",
    "in_proj_k",
    "in_proj_v",
    "in_proj_z",
    "out_proj",
)


#: The layers outside the blocks that ``quantize_embeddings`` stores as NF4, by the preflight's kind of
#: parameter: the token embedding and the output projection (one matrix when tied).
EMBEDDING_LAYERS: dict[str, str] = {"embedding": "tok_embeddings", "output": "output"}


class PEFT:
    """Base of parameter-efficient methods: holds ``Config`` for the root ``peft`` field.

    A namespace, not an object the trainer builds (see ``Loss``): an implementation subclasses both,
    ``Impl(PEFT)`` with ``Impl.Config(PEFT.Config)``.
    """

    @config_class
    class Config(ConfigBase):
        """Options every parameter-efficient method understands."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        def apply(self, model: "torch.nn.Module") -> "torch.nn.Module":
            """Freeze ``model`` and add the trainable parameters; returns ``model``."""
            raise NotImplementedError

        def checkpoint_holds_base(self, weights_path: str | None) -> bool:
            """Whether a checkpoint saves the frozen parameters too (``weights_path``: the model's).

            True for every method that trains the whole model; a method that freezes a base it can build
            again says False where it can (see ``LoRA.Config``).
            """
            return True


class FullFineTuning(PEFT):
    """No adapters: every weight of the model trains (the default)."""

    @config_class
    class Config(PEFT.Config):
        """Nothing to choose: the model is trained as it is."""

        def apply(self, model: "torch.nn.Module") -> "torch.nn.Module":
            """``model`` unchanged."""
            return model


class LoRA(PEFT):
    """Low-rank adapters on the targeted linear layers of the transformer blocks (Hu et al., 2021)."""

    @config_class
    class Config(PEFT.Config):
        """Rank, scale, dropout and the layers adapted."""

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
                "help": "Linear layers of the blocks to adapt, by their last name (wq, w1, in_proj_q...); "
                "empty: those of DEFAULT_TARGETS the model has. Routers and routed experts are never adapted."
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
                if not target.isidentifier():
                    yield "targets", f"{target!r} is not a layer name (a Python identifier such as 'wq')"
                elif target in seen:
                    yield "targets", f"{target!r} is listed twice"
                seen.add(target)
            if self.quantize_embeddings and self.base_dtype != "nf4":
                yield (
                    "quantize_embeddings",
                    "true stores the embeddings as NF4, which needs base_dtype 'nf4', "
                    f"got {self.base_dtype!r}",
                )

        def checkpoint_holds_base(self, weights_path: str | None) -> bool:
            """False when the frozen base comes from ``weights_path`` or is stored as NF4: a checkpoint
            holds the adapters and their optimizer state alone, and a resume or the export builds the base
            again (from those weights, or from the seed) and quantizes it the same way."""
            return weights_path is None and self.base_dtype != "nf4"

        @property
        def layer_names(self) -> frozenset[str]:
            """The last names of the linear layers adapted: ``targets``, or ``DEFAULT_TARGETS`` when empty."""
            return frozenset(self.targets or DEFAULT_TARGETS)

        @property
        def scale(self) -> float:
            """``alpha / rank``: what ``B A x`` is multiplied by."""
            return self.alpha / self.rank

        def apply(self, model: "torch.nn.Module") -> "torch.nn.Module":
            """Freeze ``model`` and add adapters to the targeted layers (see the module docstring).

            ``ValueError`` when a target matches no linear layer of the blocks.
            """
            from hyper_parallel.components.peft._runtime import apply_lora

            return apply_lora(self, model)
