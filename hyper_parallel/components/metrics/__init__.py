"""Metrics configuration: the type of the root ``metrics`` field.

Holds how often training metrics (loss, throughput, memory) are logged and where they go. The logging
backends are created at run time; TensorBoard and friends are never imported here.
"""

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

import attrs

from hyper_parallel._checks import unread_while_off
from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    from hyper_parallel.components.metrics._runtime import MetricsProcessor

__all__ = ["Metrics", "MetricsLogger"]

_nonempty: Callable[[Any, Any, Any], Any] = attrs.validators.min_len(1)
#: Each sink's switch and the options it alone reads.
_SINK_OPTIONS: Mapping[str, tuple[str, ...]] = {
    "enable_tensorboard": ("tensorboard_folder",),
    "enable_jsonl": ("jsonl_path",),
    "enable_wandb": ("wandb_project", "wandb_folder"),
}


class Metrics:
    """Base of metric processors: holds ``Config`` for the root ``metrics`` field."""

    @config_class
    class Config(ConfigBase):
        """Options shared by every metrics processor."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        log_freq: int = attrs.field(
            default=10,
            validator=attrs.validators.gt(0),
            metadata={"help": "Log metrics every this many optimizer steps."},
        )
        rank0_only: bool = attrs.field(
            default=True,
            metadata={"help": "Only rank 0 writes metrics; false writes one stream per rank."},
        )


class MetricsLogger(Metrics):
    """Logs metrics to the console and, optionally, to TensorBoard, W&B and a JSON-lines file."""

    @config_class
    class Config(Metrics.Config):
        """Output sinks of the metrics logger."""

        enable_tensorboard: bool = attrs.field(
            default=False,
            metadata={"help": "Write TensorBoard event files."},
        )
        tensorboard_folder: str = attrs.field(
            default="tb",
            validator=_nonempty,
            metadata={"help": "Directory for TensorBoard event files (one sub-directory per run)."},
        )
        enable_jsonl: bool = attrs.field(
            default=False,
            metadata={
                "help": "Append one JSON object per logged step to jsonl_path, each naming this launch's "
                "run_id."
            },
        )
        jsonl_path: str = attrs.field(
            default="metrics.jsonl",
            validator=_nonempty,
            metadata={"help": "File receiving the JSON-lines metrics log."},
        )
        enable_wandb: bool = attrs.field(
            default=False,
            metadata={
                "help": "Also log to Weights & Biases (the wandb extra); WANDB_MODE=offline keeps the run "
                "on disk for a later wandb sync."
            },
        )
        wandb_project: str = attrs.field(
            default="hyper_parallel",
            validator=_nonempty,
            metadata={"help": "W&B project the runs are logged under."},
        )
        wandb_folder: str = attrs.field(
            default="runs",
            validator=_nonempty,
            metadata={"help": "Directory under which W&B keeps its files (a wandb/ sub-directory per run)."},
        )
        run_name: str | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(_nonempty),
            metadata={"help": "Name of the run in the logs; null derives one from the start time."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: the options of a sink that is off (its file or folder,
            W&B's project) are refused, as every sink's are (``_checks.unread_while_off``)."""
            yield from super().cross_check()
            for switch, fields in _SINK_OPTIONS.items():
                yield from unread_while_off(self, fields, switch=switch, on=getattr(self, switch))

        def build(
            self,
            rank: int = 0,
            *,
            stream: TextIO | None = None,
            max_steps: int | None = None,
            resumed_from: int | None = None,
            peak_flops: float | None = None,
        ) -> "MetricsProcessor":
            """A processor writing every ``log_freq`` steps to ``stream`` (stdout), JSONL and TensorBoard.

            Only rank 0 writes when ``rank0_only``; otherwise each rank writes its own streams (the JSONL
            file and TensorBoard folder get a ``rank<r>`` suffix). ``resumed_from``: the checkpoint step this
            launch resumed, marked in the JSON-lines file. ``peak_flops``: one device's dense peak FLOP/s,
            against which ``mfu`` is given (null without it).
            """
            from hyper_parallel.components.metrics._runtime import MetricsProcessor

            return MetricsProcessor(
                self,
                rank=rank,
                stream=stream,
                max_steps=max_steps,
                resumed_from=resumed_from,
                peak_flops=peak_flops,
            )
