"""Optimizer configuration: the type of the root ``optimizer`` field.

The base ``Optimizer.Config`` holds what every optimizer shares (learning rate, weight decay and which
parameters are exempt from it); ``AdamW`` and ``SGD`` add their own options. At run time the trainer
hands the model parameters to the chosen implementation; nothing here imports torch.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    import torch

__all__ = ["SGD", "AdamW", "Optimizer"]


class Optimizer:
    """Base of optimizers: holds ``Config`` for the root ``optimizer`` field."""

    @config_class
    class Config(ConfigBase):
        """Learning rate and weight-decay options shared by every optimizer."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        lr: float = attrs.field(
            default=3e-4,
            validator=attrs.validators.gt(0.0),
            metadata={"help": "Peak learning rate (the scheduler scales it during warmup and decay)."},
        )
        weight_decay: float = attrs.field(
            default=0.0,
            validator=attrs.validators.ge(0.0),
            metadata={"help": "Weight-decay coefficient applied to decayed parameters; 0 disables it."},
        )
        no_decay_bias: bool = attrs.field(
            default=True,
            metadata={"help": "Exempt bias parameters from weight decay."},
        )
        no_decay_norm: bool = attrs.field(
            default=True,
            metadata={"help": "Exempt normalization-layer weights (RMSNorm, LayerNorm) from weight decay."},
        )
        no_decay_embedding: bool = attrs.field(
            default=False,
            metadata={"help": "Exempt token-embedding weights from weight decay."},
        )
        no_decay_names: tuple[str, ...] = attrs.field(
            default=(),
            validator=attrs.validators.deep_iterable(member_validator=attrs.validators.min_len(1)),
            metadata={"help": "Extra parameter-name substrings exempt from weight decay."},
        )

        def param_groups(self, model: Any) -> list[dict[str, Any]]:
            """The ``decay`` and ``no_decay`` parameter groups of ``model`` under these options."""
            from hyper_parallel.components.optimizer._runtime import param_groups

            return param_groups(self, model)


class AdamW(Optimizer):
    """Adam with decoupled weight decay, the default optimizer for large-model pretraining."""

    @config_class
    class Config(Optimizer.Config):
        """AdamW options; weight decay defaults to 0.1 here, as is usual for LLM pretraining."""

        weight_decay: float = attrs.field(
            default=0.1,
            validator=attrs.validators.ge(0.0),
            metadata={
                "help": "Decoupled weight-decay coefficient applied to decayed parameters; 0 disables it."
            },
        )
        betas: tuple[float, float] = attrs.field(
            default=(0.9, 0.95),
            validator=attrs.validators.deep_iterable(
                member_validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0))
            ),
            metadata={"help": "Decay rates of the first and second moment estimates, each in [0, 1)."},
        )
        eps: float = attrs.field(
            default=1e-8,
            validator=attrs.validators.gt(0.0),
            metadata={"help": "Term added to the denominator for numerical stability."},
        )
        amsgrad: bool = attrs.field(
            default=False,
            metadata={"help": "Use the AMSGrad variant (keeps the maximum of past second moments)."},
        )
        implementation: Literal["auto", "fused", "foreach", "for_loop"] = attrs.field(
            default="auto",
            metadata={
                "help": "Kernel strategy: 'fused' (one kernel), 'foreach' (batched tensors), 'for_loop' "
                "(per parameter) or 'auto' (let the backend choose)."
            },
        )

        def build(self, model: Any) -> "torch.optim.AdamW":
            """``torch.optim.AdamW`` with every option here; no_decay flags pick the exempt parameters."""
            from hyper_parallel.components.optimizer._runtime import build_adamw

            return build_adamw(self, model)


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum."""

    @config_class
    class Config(Optimizer.Config):
        """SGD options."""

        momentum: float = attrs.field(
            default=0.0,
            validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0)),
            metadata={"help": "Momentum factor in [0, 1); 0 disables momentum."},
        )
        dampening: float = attrs.field(
            default=0.0,
            validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0)),
            metadata={"help": "Dampening of the momentum update in [0, 1]; must be 0 with Nesterov."},
        )
        nesterov: bool = attrs.field(
            default=False,
            metadata={"help": "Use Nesterov momentum (needs momentum > 0 and dampening 0)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: Nesterov momentum needs momentum and no dampening."""
            yield from super().cross_check()
            if self.nesterov:
                if self.momentum <= 0.0:
                    yield "momentum", f"must be > 0 when nesterov is true, got {self.momentum!r}"
                if self.dampening != 0.0:
                    yield "dampening", f"must be 0 when nesterov is true, got {self.dampening!r}"

        def build(self, model: Any) -> "torch.optim.SGD":
            """``torch.optim.SGD`` with every option here (weight decay is applied as an L2 term)."""
            from hyper_parallel.components.optimizer._runtime import build_sgd

            return build_sgd(self, model)
