"""Validation configuration: the type of the root ``validator`` field.

Off by default. When enabled, the model is evaluated every ``freq`` training steps on its own dataset,
described by the same nested ``DatasetConfig`` section the data loader uses. The validation set is fixed
in samples (the first ``steps * micro_batch_size``, in file order), dealt over the data-parallel ranks, so
the set and the reported loss are the same for any data-parallel size.
"""

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from hyper_parallel._checks import minus_one_or_at_least
from hyper_parallel.components.dataloader import DatasetConfig, LoaderRequest, NoSource
from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from hyper_parallel.components.dataloader import ResumableLoader
    from hyper_parallel.components.validator._runtime import LossValidatorRuntime

__all__ = ["LossValidator", "Validator"]


class Validator:
    """Base of validators: holds ``Config`` for the root ``validator`` field."""

    @config_class
    class Config(ConfigBase):
        """When and how long to validate."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

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
            metadata={
                "help": "Validation batches of a single process per run (the first steps * micro_batch_size "
                "samples, shared among data-parallel ranks); -1 uses the whole validation set."
            },
        )


class LossValidator(Validator):
    """Reports the training loss on a held-out dataset."""

    @config_class
    class Config(Validator.Config):
        """The validation dataset and batch size."""

        dataset: DatasetConfig = attrs.field(
            default=attrs.Factory(NoSource),
            metadata={"help": "The held-out dataset (same section layout as dataloader.dataset)."},
        )
        micro_batch_size: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.gt(0)),
            metadata={"help": "Samples per rank per validation batch; null uses training.micro_batch_size."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: validation data is never shuffled, so a seed is unread."""
            yield from super().cross_check()
            for path, message in self.dataset.unread_seed(shuffle=False):
                yield f"dataset.{path}", message

        def build(
            self, dataloader: Iterable[Any], loss: Any, *, process_group: "ProcessGroup | None" = None
        ) -> "LossValidatorRuntime":
            """``validate(model, step, stop=None)`` → ``{"loss", "perplexity", ...}``, token-weighted.

            ``stop`` (the trainer's stop-signal check) is asked after each batch; a pass it cuts short
            returns None, so a SIGTERM during a long validation is answered within one batch.

            ``dataloader`` yields this rank's ``{input_ids, labels}`` batches (``build_dataloader`` makes
            one holding this rank's share of the validation set); at most ``steps`` of them are run.
            ``loss`` is a built loss (``Loss.Config.build()``). Sums of loss and tokens are all-reduced
            over ``process_group``, which must be the data-parallel group (not the whole world: ranks
            of a tensor-parallel group hold the same samples); None keeps them local.
            """
            from hyper_parallel.components.validator._runtime import LossValidatorRuntime

            return LossValidatorRuntime(self, dataloader, loss, process_group=process_group)

        def build_dataloader(self, request: LoaderRequest) -> "ResumableLoader":
            """Rank ``request.dp_rank``'s share of the validation set: one pass, in file order.

            The set is the first ``steps * micro_batch_size`` samples of ``dataset`` (all with ``steps``
            -1), where ``micro_batch_size`` is this section's, else the request's (training's). Its samples
            are dealt round-robin over the ``dp_world_size`` ranks; every rank gets the same number of
            batches (a short or filler batch whose labels are all ``ignore_index`` where its share runs
            out), so a sharded model's forward runs in step. The request's ``process_group`` shares the
            tokenizing as in ``DataLoader.Config.build``.
            """
            batch = self.micro_batch_size or request.micro_batch_size
            return self.dataset.loader(
                attrs.evolve(request, micro_batch_size=batch),
                shuffle=False,
                drop_last=False,
                infinite=False,
                max_samples=None if self.steps == -1 else self.steps * batch,
            )
