"""Validation configuration: the type of the root ``validator`` field.

Off by default. When enabled, the model is evaluated every ``freq`` training steps on its own dataset,
described by the same nested ``DatasetConfig`` section the data loader uses.
"""

from collections.abc import Iterator

import attrs

from hyper_parallel._checks import minus_one_or_at_least
from hyper_parallel.components.dataloader import DatasetConfig

__all__ = ["LossValidator", "Validator"]


class Validator:
    """Base of validators: holds ``Config`` for the root ``validator`` field."""

    @attrs.frozen(kw_only=True)
    class Config:
        """When and how long to validate."""

        enable: bool = attrs.field(
            default=False,
            metadata={"help": "Run validation periodically during training."},
        )
        freq: int = attrs.field(
            default=10,
            validator=attrs.validators.gt(0),
            metadata={"help": "Validate every this many optimizer steps."},
        )
        steps: int = attrs.field(
            default=-1,
            validator=minus_one_or_at_least(1, "the whole set"),
            metadata={"help": "Validation batches per run; -1 uses the whole validation set."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)`` for inconsistent settings; the shared options have none."""
            yield from ()


class LossValidator(Validator):
    """Reports the training loss on a held-out dataset."""

    @attrs.frozen(kw_only=True)
    class Config(Validator.Config):
        """The validation dataset and batch size."""

        dataset: DatasetConfig = attrs.field(
            default=attrs.Factory(DatasetConfig),
            metadata={"help": "The held-out dataset (same section layout as dataloader.dataset)."},
        )
        micro_batch_size: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.gt(0)),
            metadata={"help": "Samples per rank per validation batch; null uses training.micro_batch_size."},
        )
