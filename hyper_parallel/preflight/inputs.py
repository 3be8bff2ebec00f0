"""What the preflight reads of a run's config: the groups it prices, named as a structural type.

The preflight is read by the trainer's rules (``trainer.rules`` refuses sizes and NF4 shapes with it), so
naming the trainer's ``TrainerConfig`` here would tie the two layers into one import circle. It takes any
object with these groups instead: a ``TrainerConfig`` is one, as mypy checks wherever the trainer passes
it. Each group's type comes from the layer below that defines it (:mod:`hyper_parallel.sections`, the
components, the model spec). Types only: nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from hyper_parallel.components.dataloader import DataLoader
    from hyper_parallel.components.optimizer import Optimizer
    from hyper_parallel.components.peft import PEFT
    from hyper_parallel.models.spec import ModelSpec
    from hyper_parallel.sections import (
        ActivationCheckpointConfig,
        CompileConfig,
        ParallelismConfig,
        TrainingConfig,
    )

__all__ = ["RunConfig"]


class RunConfig(Protocol):
    """The root groups the preflight reads (read-only, as the frozen root config holds them)."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def training(self) -> TrainingConfig: ...
    @property
    def parallelism(self) -> ParallelismConfig: ...
    @property
    def activation_checkpoint(self) -> ActivationCheckpointConfig: ...
    @property
    def compile(self) -> CompileConfig: ...
    @property
    def optimizer(self) -> Optimizer.Config: ...
    @property
    def dataloader(self) -> DataLoader.Config: ...
    @property
    def peft(self) -> PEFT.Config: ...
