"""Trainers and the root config they take.

``hyper_parallel.trainer.config`` assembles the root ``TrainerConfig`` and ``hyper_parallel.trainer.rules``
holds the rules that span its groups; both stay torch-free: resolving a config imports them without
loading PyTorch. The trainers import torch, so they live in private modules (``_trainer``, ``_llm``,
``_vl``: a ``_target_`` can never name them) and are loaded on first access (``from hyper_parallel.trainer
import LLMTrainer``), never by importing the config.

```python
from hyper_parallel.config import load_config
from hyper_parallel.trainer import LLMTrainer

trainer = LLMTrainer(load_config("configs/llama3_debug.yaml"))
results = trainer.train()     # one StepResult per optimizer step
trainer.close()
```
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyper_parallel.parallel.parallel_dims import ParallelDims
    from hyper_parallel.trainer._llm import LLMTrainer
    from hyper_parallel.trainer._trainer import (
        CollectiveError,
        NonFiniteError,
        RanksDisagreeError,
        StepResult,
        Trainer,
        TrainingError,
    )
    from hyper_parallel.trainer._vl import VLTrainer

__all__ = [
    "CollectiveError",
    "LLMTrainer",
    "NonFiniteError",
    "ParallelDims",
    "RanksDisagreeError",
    "StepResult",
    "Trainer",
    "TrainingError",
    "VLTrainer",
]

_HOMES = {
    "LLMTrainer": f"{__name__}._llm",
    "VLTrainer": f"{__name__}._vl",
    "Trainer": f"{__name__}._trainer",
    "StepResult": f"{__name__}._trainer",
    "TrainingError": f"{__name__}._trainer",
    "NonFiniteError": f"{__name__}._trainer",
    "RanksDisagreeError": f"{__name__}._trainer",
    "CollectiveError": f"{__name__}._trainer",
    "ParallelDims": "hyper_parallel.parallel.parallel_dims",  # where a rank sits; kept here for old imports
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
