"""Targets that only tests may name (allowed with ``allowed_targets=("tests.support.fake_targets",)``).

They record being called, lie about what they return, or are the wrong kind of object, so tests can prove
what the resolver does before and instead of calling a target.
"""

import abc
import os
from typing import Any

import attrs

from hyper_parallel.components.optimizer import Optimizer
from hyper_parallel.models import ModelSpec
from hyper_parallel.models.qwen3_5 import create_model_spec

CALLS: list[str] = []


def recording_model_spec(flavor: str = "debugmodel") -> ModelSpec:
    """A model factory that records each call."""
    CALLS.append("recording_model_spec")
    return create_model_spec(flavor=flavor)  # type: ignore[arg-type]


def lying_model_spec() -> ModelSpec:
    """Declares ModelSpec but returns something else."""
    return "not a spec"  # type: ignore[return-value]


def wrong_annotation() -> int:
    """Declares a return type that is not a ModelSpec; must never be called."""
    CALLS.append("wrong_annotation")
    return 1


def unannotated(flavor="debugmodel"):  # type: ignore[no-untyped-def]
    """No annotations: refused before the call."""
    CALLS.append("unannotated")
    return create_model_spec()


def failing_model_spec(flavor: str) -> ModelSpec:
    """Raises from inside: reported as the group's problem, not a traceback."""
    raise ValueError(f"no such checkpoint layout for {flavor!r}")


@attrs.frozen(kw_only=True)
class RecordingOptimizerConfig(Optimizer.Config):
    """An optimizer Config that records construction."""

    def __attrs_post_init__(self) -> None:
        CALLS.append("RecordingOptimizerConfig")


class NotAConfig:
    """A plain class: not an attrs Config."""


INSTANCE = NotAConfig()
reexported_system = os.system


def make_optimizer(lr: float, extra: Any = None) -> Optimizer.Config:  # pragma: no cover - never allowed
    return Optimizer.Config(lr=lr)


@attrs.frozen(kw_only=True)
class AbstractOptimizerConfig(Optimizer.Config, abc.ABC):
    """An ``abc`` base with an abstract method: not a target, though it does not declare ``__abstract__``."""

    @abc.abstractmethod
    def schedule_name(self) -> str:
        """Implemented by subclasses."""


def _percent(value: float) -> float:
    return value / 100


@attrs.frozen(kw_only=True)
class PercentOptimizerConfig(Optimizer.Config):
    """An optimizer Config whose ``lr`` is given in percent and stored as a fraction (an attrs converter)."""

    lr: float = attrs.field(
        default=1.0,
        converter=_percent,
        validator=[attrs.validators.gt(0.0), attrs.validators.le(1.0)],  # the fraction: 0 < lr <= 1
        metadata={"help": "learning rate, in percent"},
    )


def _recorded(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    """A validator that records each call (and accepts every value)."""
    CALLS.append(f"validate {type(instance).__name__}.{attribute.name}")


@attrs.frozen(kw_only=True)
class RecordingSection:
    """A nested section whose construction and validator record their calls."""

    size: int = attrs.field(default=1, validator=_recorded, metadata={"help": "any size"})

    def __attrs_post_init__(self) -> None:
        CALLS.append("RecordingSection")


@attrs.frozen(kw_only=True)
class SectionsOptimizerConfig(Optimizer.Config):
    """An optimizer Config with nested sections; it, they and their validators record their calls."""

    section: RecordingSection = attrs.field(
        factory=RecordingSection, validator=_recorded, metadata={"help": "one section"}
    )
    sections: list[RecordingSection] = attrs.field(
        factory=list, validator=_recorded, metadata={"help": "a list of sections"}
    )

    def __attrs_post_init__(self) -> None:
        CALLS.append("SectionsOptimizerConfig")
