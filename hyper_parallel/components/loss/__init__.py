"""Loss configuration: the type of the root ``loss`` field.

The ``Config`` describes the training objective; the loss callable itself is created at run time.
"""

from typing import TYPE_CHECKING, ClassVar, Literal

import attrs

from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    from hyper_parallel.components.loss._runtime import CausalLMLossFn

__all__ = ["CausalLMLoss", "Loss"]


class Loss:
    """Base of losses: holds ``Config`` for the root ``loss`` field."""

    @config_class
    class Config(ConfigBase):
        """Options shared by every loss."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        #: ``sum`` is the default: a token's weight must not depend on which micro-batch or rank it landed
        #: in, or gradient accumulation would change the run (sparse fine-tuning labels make it change a
        #: lot). ``mean`` stays for runs that want every micro-batch weighed equally, and for old configs.
        reduction: Literal["mean", "sum"] = attrs.field(
            default="sum",
            metadata={
                "help": "'sum': token losses summed over the whole optimizer step (every micro-batch and "
                "data-parallel rank) and divided by its counted tokens, so accumulation changes nothing; "
                "'mean': each micro-batch's mean token loss, averaged over micro-batches and ranks."
            },
        )


class CausalLMLoss(Loss):
    """Next-token cross entropy for causal language models, with optional smoothing and z-loss."""

    @config_class
    class Config(Loss.Config):
        """Cross-entropy options."""

        ignore_index: int = attrs.field(
            default=-100,
            metadata={"help": "Label value excluded from the loss (padding and masked prompt tokens)."},
        )
        label_smoothing: float = attrs.field(
            default=0.0,
            validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0)),
            metadata={
                "help": "Probability mass spread uniformly over the vocabulary, in [0, 1); 0 disables."
            },
        )
        z_loss_weight: float = attrs.field(
            default=0.0,
            validator=attrs.validators.ge(0.0),
            metadata={"help": "Weight of the z-loss (squared log-sum-exp of the logits); 0 disables it."},
        )
        chunk_tokens: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.ge(0)),
            metadata={
                "help": "Fuse the output projection into the loss, this many tokens of logits at a time "
                "(never the whole tokens x vocab in float32); 0: whole logits; null: 1024 where it can."
            },
        )

        def build(self) -> "CausalLMLossFn":
            """``loss(logits, labels)``: shifted next-token cross entropy, the mean over counted tokens
            (``reduction`` is how the trainer weighs the micro-batches of a step: it reads it itself)."""
            from hyper_parallel.components.loss._runtime import build_causal_lm_loss

            return build_causal_lm_loss(self)
