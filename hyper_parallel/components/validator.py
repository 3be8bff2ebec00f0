"""Validation configuration: the type of the root ``validator`` field.

Off by default. When enabled, the model is evaluated every ``freq`` training steps on its own dataset,
described by the same nested ``DatasetConfig`` section the data loader uses.
"""

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from hyper_parallel._checks import minus_one_or_at_least
from hyper_parallel.components.dataloader import DatasetConfig

if TYPE_CHECKING:
    from hyper_parallel.runtime.dataloader import ResumableLoader
    from hyper_parallel.runtime.validator import LossValidatorRuntime

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

        def build(self, dataloader: Iterable[Any], loss: Any) -> Any:
            """An object whose ``validate(model, step)`` evaluates ``loss`` on ``dataloader``.

            Implemented by subclasses.
            """
            raise NotImplementedError(f"{type(self).__qualname__} cannot build a validator; use a subclass")


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

        def build(self, dataloader: Iterable[Any], loss: Any) -> "LossValidatorRuntime":
            """``validate(model, step)`` → ``{"loss", "perplexity", ...}`` over ``steps`` batches, no grads.

            ``dataloader`` yields ``{input_ids, labels}`` batches (``build_dataloader`` makes one from
            ``dataset``); ``loss`` is a built loss (``Loss.Config.build()``).
            """
            from hyper_parallel.runtime.validator import LossValidatorRuntime

            return LossValidatorRuntime(self, dataloader, loss)

        def build_dataloader(
            self,
            tokenizer: Any,
            dp_rank: int,
            dp_world_size: int,
            *,
            seq_len: int,
            micro_batch_size: int,
            seed: int,
            ignore_index: int = -100,
        ) -> "ResumableLoader":
            """The validation batches of ``dataset``: one pass in file order, a short last batch kept.

            ``micro_batch_size`` (training's) is used when this section's ``micro_batch_size`` is null.
            """
            from hyper_parallel.runtime.dataloader import build_loader

            return build_loader(
                self.dataset,
                tokenizer,
                dp_rank=dp_rank,
                dp_world_size=dp_world_size,
                seq_len=seq_len,
                micro_batch_size=self.micro_batch_size or micro_batch_size,
                seed=seed,
                shuffle=False,
                drop_last=False,
                infinite=False,
                ignore_index=ignore_index,
            )
