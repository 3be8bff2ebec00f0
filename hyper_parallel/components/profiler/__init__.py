"""Profiler configuration: the type of the root ``profiler`` field.

Off by default. When enabled, a trace is captured periodically: every ``profile_freq`` steps the
profiler waits, warms up and records ``active`` steps. The profiler itself is created at run time.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

import attrs

from hyper_parallel._checks import quote, said, unread_while_off
from hyper_parallel.config_base import ConfigBase, config_class

if TYPE_CHECKING:
    from hyper_parallel.components.profiler._runtime import NullProfiler, TorchProfilerContext

__all__ = ["Profiler", "TorchProfiler"]


class Profiler:
    """Base of profilers: holds ``Config`` for the root ``profiler`` field."""

    @config_class
    class Config(ConfigBase):
        """Options shared by every profiler."""

        #: A base: a config names one of its subclasses as ``_target_``, never this class.
        __abstract__: ClassVar[bool] = True

        enable: bool = attrs.field(
            default=False,
            metadata={"help": "Capture performance traces during training."},
        )
        profile_freq: int = attrs.field(
            default=10,
            validator=attrs.validators.gt(0),
            metadata={"help": "Length in steps of one profiling cycle; one trace is saved per cycle."},
        )
        save_traces_folder: str = attrs.field(
            default="profile_traces",
            validator=attrs.validators.min_len(1),
            metadata={"help": "Directory receiving the trace files."},
        )


class TorchProfiler(Profiler):
    """The PyTorch profiler, scheduled as wait, warmup, active within each ``profile_freq`` cycle."""

    @config_class
    class Config(Profiler.Config):
        """Schedule and recording options of the PyTorch profiler."""

        wait: int | None = attrs.field(
            default=None,
            validator=attrs.validators.optional(attrs.validators.ge(0)),
            metadata={
                "help": "Idle steps at the start of each cycle; null uses profile_freq - warmup - active."
            },
        )
        warmup: int = attrs.field(
            default=3,
            validator=attrs.validators.ge(0),
            metadata={"help": "Steps traced but discarded before recording, to skip warmup overhead."},
        )
        active: int = attrs.field(
            default=1,
            validator=attrs.validators.gt(0),
            metadata={"help": "Steps recorded into each saved trace."},
        )
        record_memory: bool = attrs.field(
            default=False,
            metadata={"help": "Also record a device-memory snapshot next to each trace."},
        )
        record_shapes: bool = attrs.field(
            default=False,
            metadata={"help": "Record operator input shapes (larger traces)."},
        )
        with_stack: bool = attrs.field(
            default=False,
            metadata={"help": "Record Python stacks for each operator (larger, slower traces)."},
        )

        def cross_check(self) -> Iterator[tuple[str, str]]:
            """Yield ``(field path, message)``: the schedule must fit into one ``profile_freq`` cycle."""
            yield from super().cross_check()
            yield from unread_while_off(
                self,
                (
                    "profile_freq",
                    "save_traces_folder",
                    "wait",
                    "warmup",
                    "active",
                    "record_memory",
                    "record_shapes",
                    "with_stack",
                ),
                switch="enable",
                on=self.enable,
            )
            busy = self.warmup + self.active
            if busy > self.profile_freq:
                yield (
                    "profile_freq",
                    f"must be >= warmup + active ({self.warmup} + {self.active} = {busy}), "
                    f"got {self.profile_freq}",
                )
            elif self.wait is not None and self.wait + busy != self.profile_freq:
                yield (
                    "wait",
                    said(
                        "wait + warmup + active must equal ",
                        quote("profile_freq", self.profile_freq),
                        f", got {self.wait} + {self.warmup} + {self.active} = {self.wait + busy}; "
                        "or set wait to null to derive it",
                    ),
                )

        def build(self, rank: int = 0) -> "TorchProfilerContext | NullProfiler":
            """``with profiler: ... profiler.step()``; a no-op object (torch not imported) when disabled."""
            from hyper_parallel.components.profiler._runtime import NullProfiler, TorchProfilerContext

            if not self.enable:
                return NullProfiler()
            return TorchProfilerContext(self, rank=rank)
