"""Config classes with one field of every supported kind (tests allow ``tests.support.rule_targets``).

The shipped configs use scalars, literals, lists and mappings; these classes also hold an ``Enum``, an
``IntEnum``, ``pathlib.Path``, ``frozenset`` and bare ``dict``/``list``/``tuple`` fields, so tests can prove
that every rule of the type table loads, overrides, dumps and reloads.
"""

import enum
import pathlib
from typing import Any, Literal

import attrs

from hyper_parallel.models import ModelSpec


class Color(enum.Enum):
    """A string-valued choice."""

    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    """An integer-valued choice."""

    LOW = 1
    HIGH = 2


@attrs.frozen
class Inner:
    """A nested section."""

    weight: float = attrs.field(default=1.0, metadata={"help": "A number."})


class Kinds:
    """A component whose Config has one field of each kind."""

    @attrs.frozen(kw_only=True)
    class Config:
        """Every field kind the type table knows."""

        color: Color = attrs.field(default=Color.RED, metadata={"help": "An Enum."})
        level: Level = attrs.field(default=Level.LOW, metadata={"help": "An IntEnum."})
        path: pathlib.Path = attrs.field(
            default=pathlib.Path("data/train.jsonl"), metadata={"help": "A path."}
        )
        maybe_path: pathlib.Path | None = attrs.field(default=None, metadata={"help": "An optional path."})
        tags: frozenset[str] = attrs.field(default=frozenset(), metadata={"help": "A set of strings."})
        table: dict[str, int] = attrs.field(factory=dict, metadata={"help": "A typed mapping."})
        anything: dict = attrs.field(factory=dict, metadata={"help": "A bare mapping."})  # type: ignore[type-arg]
        items: list = attrs.field(factory=list, metadata={"help": "A bare list."})  # type: ignore[type-arg]
        pair: tuple = attrs.field(default=(), metadata={"help": "A bare tuple."})  # type: ignore[type-arg]
        mode: Literal["a", "b"] = attrs.field(default="a", metadata={"help": "A literal."})
        inner: Inner = attrs.field(factory=Inner, metadata={"help": "A section."})
        extra: Any = attrs.field(default=None, metadata={"help": "Anything."})


@attrs.frozen
class KindsRoot:
    """A root with one group."""

    kinds: Kinds.Config = attrs.field(factory=Kinds.Config, metadata={"help": "The group."})


def crashing_model_spec() -> ModelSpec:
    """A factory whose own code fails."""
    raise RuntimeError("boom")


def exiting_model_spec() -> ModelSpec:
    """A factory that tries to end the process."""
    raise SystemExit(3)


def interrupted_model_spec() -> ModelSpec:
    """A factory interrupted by the user (Ctrl-C)."""
    raise KeyboardInterrupt
