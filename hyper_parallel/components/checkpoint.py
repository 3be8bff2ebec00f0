"""Checkpoint configuration: the type of the root ``checkpoint`` field.

Holds when and where checkpoints are saved and what is loaded at startup. The checkpoint manager is
created at run time; resolving the config never reads or lists the checkpoint folder.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import attrs

if TYPE_CHECKING:
    from hyper_parallel.runtime.checkpoint import CheckpointManager

from hyper_parallel._checks import minus_one_or_at_least

__all__ = ["Checkpoint", "DCPCheckpoint"]

_optional_nonempty = attrs.validators.optional(attrs.validators.min_len(1))


class Checkpoint:
    """Base of checkpointers: holds ``Config`` for the root ``checkpoint`` field."""

    @attrs.frozen(kw_only=True)
    class Config:
        """Save and load options shared by every checkpoint format."""

        enable: bool = attrs.field(
            default=False,
            metadata={"help": "Save checkpoints during training and resume from the latest one."},
        )
        folder: str = attrs.field(
            default="checkpoint",
            validator=attrs.validators.min_len(1),
            metadata={"help": "Directory that receives one sub-directory per saved step."},
        )
        interval: int = attrs.field(
            default=500,
            validator=attrs.validators.gt(0),
            metadata={"help": "Save a checkpoint every this many optimizer steps."},
        )
        keep_latest_k: int = attrs.field(
            default=10,
            validator=attrs.validators.ge(0),
            metadata={"help": "Keep only the newest k checkpoints, deleting older ones; 0 keeps all."},
        )
        initial_load_path: str | None = attrs.field(
            default=None,
            validator=_optional_nonempty,
            metadata={"help": "Checkpoint to start from when folder holds none yet; null starts fresh."},
        )
        initial_load_model_only: bool = attrs.field(
            default=True,
            metadata={"help": "Load only model weights from initial_load_path (no optimizer or step)."},
        )
        load_step: int = attrs.field(
            default=-1,
            validator=minus_one_or_at_least(0, "latest"),
            metadata={"help": "Step to resume from; -1 picks the latest checkpoint in folder."},
        )
        exclude_from_loading: tuple[
            Literal["model", "optimizer", "lr_scheduler", "dataloader", "train_state"], ...
        ] = attrs.field(
            default=(),
            metadata={"help": "Parts of the saved state not restored on resume (they start fresh)."},
        )
        last_save_model_only: bool = attrs.field(
            default=True,
            metadata={"help": "Save only the model weights at the final step (for export)."},
        )
        export_dtype: Literal["float16", "bfloat16", "float32"] = attrs.field(
            default="float32",
            metadata={"help": "Weight dtype of the final model-only save (needs last_save_model_only)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)`` for contradictory save/load options."""
            if "model" in self.exclude_from_loading:
                yield "exclude_from_loading", "cannot exclude 'model': a resume always restores the model"
            if len(set(self.exclude_from_loading)) != len(self.exclude_from_loading):
                yield "exclude_from_loading", "lists the same part more than once"
            if self.export_dtype != "float32" and not self.last_save_model_only:
                yield (
                    "export_dtype",
                    f"{self.export_dtype!r} only applies to the model-only final save; set "
                    "last_save_model_only to true or export_dtype to 'float32'",
                )

        def build(
            self, model: Any, optimizer: Any = None, lr_scheduler: Any = None, dataloader: Any = None
        ) -> Any:
            """The checkpoint manager of this training state (implemented by subclasses)."""
            raise NotImplementedError(
                f"{type(self).__qualname__} cannot build a checkpointer; use a subclass"
            )


class DCPCheckpoint(Checkpoint):
    """Sharded checkpoints in the torch.distributed.checkpoint (DCP) format."""

    @attrs.frozen(kw_only=True)
    class Config(Checkpoint.Config):
        """DCP options."""

        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = attrs.field(
            default="disabled",
            metadata={
                "help": "Save synchronously ('disabled'), in a background thread ('async'), or staged "
                "through pinned host memory ('async_with_pinned_mem')."
            },
        )
        enable_first_step_checkpoint: bool = attrs.field(
            default=False,
            metadata={"help": "Also save right after the first step (catches save failures early)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``; an asynchronous save needs a second checkpoint to keep."""
            yield from super().cross_check()
            if self.async_mode != "disabled" and self.keep_latest_k == 1:
                yield (
                    "keep_latest_k",
                    "must be 0 or >= 2 with an async save: the newest checkpoint may still be in flight "
                    "when the previous one is deleted",
                )

        def build(
            self, model: Any, optimizer: Any = None, lr_scheduler: Any = None, dataloader: Any = None
        ) -> "CheckpointManager":
            """A manager saving and restoring these objects with torch.distributed.checkpoint.

            ``maybe_save(step)`` saves every ``interval`` steps, ``load()`` resumes from the newest
            complete checkpoint; the layout and publish protocol are documented in
            ``hyper_parallel.runtime.checkpoint``.
            """
            from hyper_parallel.runtime.checkpoint import CheckpointManager

            return CheckpointManager(
                self, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler, dataloader=dataloader
            )
