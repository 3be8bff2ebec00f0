"""Learning-rate schedule configuration: the type of the root ``lr_scheduler`` field.

Schedules are described in optimizer steps. Checks that need ``training.max_steps`` (for example a warmup
longer than the whole run) live in ``TrainerConfig.cross_check``, which sees both groups.
"""

from typing import TYPE_CHECKING, ClassVar, Literal

import attrs

from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    import torch

    from hyper_parallel.components.lr_scheduler._runtime import WarmupDecayLR

__all__ = ["LRScheduler", "WarmupDecay"]


class LRScheduler:
    """Base of learning-rate schedulers: holds ``Config`` for the root ``lr_scheduler`` field."""

    @config_class
    class Config(ConfigBase):
        """The linear warmup every schedule starts with."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        warmup_steps: int = attrs.field(
            default=10,
            validator=attrs.validators.ge(0),
            metadata={"help": "Steps of linear warmup from near 0 to the peak learning rate; 0 disables it."},
        )


class WarmupDecay(LRScheduler):
    """Linear warmup, an optional constant plateau, then a linear or cosine decay (or none)."""

    @config_class
    class Config(LRScheduler.Config):
        """Warmup, plateau and decay; the decay phase is the last ``decay_ratio`` of the run."""

        decay_type: Literal["linear", "cosine", "constant"] = attrs.field(
            default="cosine",
            metadata={"help": "Shape of the decay phase: 'linear', 'cosine', or 'constant' (no decay)."},
        )
        decay_ratio: float | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(
                attrs.validators.and_(attrs.validators.gt(0.0), attrs.validators.le(1.0))
            ),
            metadata={
                "help": "Fraction of training.max_steps spent decaying, in (0, 1], after a constant plateau; "
                "null decays over every step after warmup."
            },
        )
        min_lr_factor: float = attrs.field(
            # Not 0: the last step would train at learning rate 0, a step paid for and wasted.
            default=0.1,
            validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0)),
            metadata={
                "help": "Learning rate of the last step as a fraction of the peak, in [0, 1]; 0 spends the "
                "last step at learning rate 0."
            },
        )

        def decay_steps(self, max_steps: int) -> int:
            """Number of decay steps in a run of ``max_steps`` optimizer steps."""
            if self.decay_ratio is None:
                return max(max_steps - self.warmup_steps, 0)
            return round(max_steps * self.decay_ratio)

        def build(self, optimizer: "torch.optim.Optimizer", training_steps: int) -> "WarmupDecayLR":
            """A ``LambdaLR``: linear warmup, plateau, then the decay down to ``min_lr_factor`` x peak.

            Call ``step()`` once after each optimizer step. Its ``state_dict`` is the position alone, so
            a resumed run follows the schedule of its current config from the saved step; the closed
            form is documented in ``hyper_parallel.components.lr_scheduler._runtime``.
            """
            from hyper_parallel.components.lr_scheduler._runtime import build_warmup_decay

            return build_warmup_decay(self, optimizer, training_steps)
