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
    from hyper_parallel.trainer._llm import LLMTrainer
    from hyper_parallel.trainer._trainer import NonFiniteError, StepResult, Trainer, TrainingError
    from hyper_parallel.trainer._vl import VLTrainer
    from hyper_parallel.trainer.parallel_dims import ParallelDims

__all__ = [
    "LLMTrainer",
    "NonFiniteError",
    "ParallelDims",
    "StepResult",
    "Trainer",
    "TrainingError",
    "VLTrainer",
]

_HOMES = {
    "LLMTrainer": "_llm",
    "VLTrainer": "_vl",
    "Trainer": "_trainer",
    "StepResult": "_trainer",
    "TrainingError": "_trainer",
    "NonFiniteError": "_trainer",
    "ParallelDims": "parallel_dims",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
