"""Checkpoint configuration: the type of the root ``checkpoint`` field.

Holds when and where checkpoints are saved and what is loaded at startup. The checkpoint manager is
created at run time; resolving the config never reads or lists the checkpoint folder.

Resume rule: every save is a full checkpoint (model, optimizer, scheduler position, data position, RNG
states, the trainer's state and the step) that resumes the run exactly, except the final save with
``last_save_model_only``, a weights-only export in ``export_dtype``. An export is never resumed: a run
whose newest checkpoint is an export at step N is finished (the manager's ``load()`` returns N); if
``training.max_steps`` was raised past N, the newest full checkpoint before N is resumed, and with none
``load()`` raises ``CheckpointNotResumableError``. Keep ``last_save_model_only: false`` for runs that may
be extended. Half-written checkpoints are never loaded.

Checkpoints are data: each step folder holds a ``checksums.json`` (size and SHA-256 of every file), checked
before a load; a step that fails it, or whose ``.metadata`` or shards are missing, empty or truncated, is
skipped with a warning for the newest intact one, and with none intact ``load()`` raises
``CheckpointNotResumableError``. Nothing in a folder is unpickled but DCP's metadata classes (by a
restricted unpickler) and tensors and plain values (by torch's ``weights_only`` loader). The layout and
protocol are documented in this package's private modules (``_layout``: the folder; ``_manifest``: the
checksums; ``_safe_read``: reading without running code; ``_state``: what is saved; ``_manager``: the save
and load protocol).
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    from hyper_parallel.components.checkpoint._manager import CheckpointManager

from hyper_parallel._checks import minus_one_or_at_least, unread_while_off

__all__ = ["Checkpoint", "CheckpointNotResumableError", "DCPCheckpoint"]

_optional_nonempty = attrs.validators.optional(attrs.validators.min_len(1))
#: Options only a run that saves reads (``enable``); ``initial_load_path`` and its options are read without.
_SAVE_OPTIONS = ("folder", "interval", "keep_latest_k", "load_step", "last_save_model_only", "export_dtype")


class CheckpointNotResumableError(ValueError):
    """This run cannot continue the checkpoint it resumes from.

    Raised by the checkpoint manager's ``load()`` when the checkpoint is a weights-only export (or holds
    only weights) and the run is not over, when its data position cannot be continued by this run
    (other data, or a data-parallel layout that would read other batches), or when no checkpoint to load
    is intact or one holds content that is refused; the message says what to change.
    """


class Checkpoint:
    """Base of checkpointers: holds ``Config`` for the root ``checkpoint`` field."""

    @config_class
    class Config(ConfigBase):
        """Save and load options shared by every checkpoint format."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        enable: bool = attrs.field(
            default=False,
            metadata={
                "help": "Save checkpoints during training and resume from the newest full one in folder."
            },
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
            metadata={
                "help": "DCP checkpoint to start from when folder holds none yet (read even without enable); "
                "null starts fresh."
            },
        )
        initial_load_model_only: bool = attrs.field(
            default=True,
            metadata={
                "help": "Load only model weights from initial_load_path (start at step 0); false restores "
                "its full state and step (it must not be a weights-only export)."
            },
        )
        load_step: int = attrs.field(
            default=-1,
            validator=minus_one_or_at_least(0, "latest"),
            metadata={
                "help": "Step to resume from; -1 picks the newest checkpoint in folder (a weights-only "
                "export is never resumed)."
            },
        )
        exclude_from_loading: tuple[
            Literal["model", "optimizer", "lr_scheduler", "dataloader", "rng", "train_state"], ...
        ] = attrs.field(
            default=(),
            metadata={
                "help": "Parts of the saved state not restored on resume (they start fresh): optimizer, "
                "lr_scheduler, dataloader, rng, train_state."
            },
        )
        last_save_model_only: bool = attrs.field(
            default=True,
            metadata={
                "help": "Make the final save a weights-only export; it is never resumed, so a run extended "
                "past it needs an earlier full checkpoint (set false to keep the final one resumable)."
            },
        )
        export_dtype: Literal["float16", "bfloat16", "float32"] = attrs.field(
            default="float32",
            metadata={"help": "Weight dtype of the final model-only save (needs last_save_model_only)."},
        )
        accept_changed_base: bool = attrs.field(
            default=False,
            metadata={
                "help": "Resume (or load initial_load_path) a LoRA/QLoRA checkpoint whose frozen base "
                "differs from the one its base.json records (model.weights_path changed); false refuses."
            },
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)`` for contradictory save/load options, and options of a sink
            that is off (saving without ``enable``, the initial load without ``initial_load_path``)."""
            yield from unread_while_off(self, _SAVE_OPTIONS, switch="enable", on=self.enable)
            yield from unread_while_off(
                self,
                ("initial_load_model_only",),
                switch="initial_load_path",
                on=self.initial_load_path is not None,
                when="initial_load_path is set",
            )
            yield from unread_while_off(
                self,
                ("accept_changed_base",),
                switch="enable",
                on=self.enable or self.initial_load_path is not None,
                when="enable is true or initial_load_path is set",
            )
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


class DCPCheckpoint(Checkpoint):
    """Sharded checkpoints in the torch.distributed.checkpoint (DCP) format."""

    @config_class
    class Config(Checkpoint.Config):
        """DCP options."""

        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = attrs.field(
            default="disabled",
            metadata={
                "help": "Save synchronously ('disabled'), in a background thread ('async'), or staged "
                "through pinned host memory ('async_with_pinned_mem'; plain 'async' without CUDA)."
            },
        )
        enable_first_step_checkpoint: bool = attrs.field(
            default=False,
            metadata={"help": "Also save right after the first step (catches save failures early)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``; an asynchronous save needs a second checkpoint to keep."""
            yield from super().cross_check()
            yield from unread_while_off(
                self, ("async_mode", "enable_first_step_checkpoint"), switch="enable", on=self.enable
            )
            if self.async_mode != "disabled" and self.keep_latest_k == 1:
                yield (
                    "keep_latest_k",
                    "must be 0 or >= 2 with an async save: the newest checkpoint may still be in flight "
                    "when the previous one is deleted",
                )

        def build(
            self,
            model: Any,
            optimizer: Any = None,
            lr_scheduler: Any = None,
            dataloader: Any = None,
            *,
            train_state: Any = None,
            max_steps: int | None = None,
            run_config_yaml: str | None = None,
            save_frozen: bool = True,
            base_record: dict[str, Any] | None = None,
        ) -> "CheckpointManager":
            """A manager saving and restoring these objects with torch.distributed.checkpoint.

            ``train_state`` is the trainer's own stateful (``state_dict() -> dict``, JSON-serialisable and
            rank-local, and ``load_state_dict(dict)``); ``max_steps`` is ``training.max_steps``, which tells
            a finished run from one extended past its weights-only export; ``run_config_yaml`` (the run's
            resolved config as YAML, which the trainer dumps) is written as ``config.yaml`` into every
            checkpoint, for ``hyper_parallel.export``; ``save_frozen`` False leaves the parameters that do
            not train out of every checkpoint (a LoRA run that builds its base again at every start, see
            ``PEFT.Config.checkpoint_holds_base``); ``base_record`` (``_base_record.base_identity`` of the
            base the run built) is written as ``base.json`` into every checkpoint, and a checkpoint without
            its base is loaded only on the base its record names (``accept_changed_base``). Call it on
            every rank (with torch.distributed it creates the manager's process group). ``load()``
            resumes, ``maybe_save(step, last_step=...)`` saves every ``interval`` steps, ``close()``
            finishes an asynchronous save; the layout and publish protocol are documented in the private
            modules of this package.
            """
            from hyper_parallel.components.checkpoint._manager import CheckpointManager

            return CheckpointManager(
                self,
                model=model,
                optimizer=optimizer,
                lr_scheduler=lr_scheduler,
                dataloader=dataloader,
                train_state=train_state,
                max_steps=max_steps,
                run_config_yaml=run_config_yaml,
                save_frozen=save_frozen,
                base_record=base_record,
            )
