"""The root ``TrainerConfig``: one field per root YAML group, and the packages a document may name.

``TrainerConfig`` has one field per root YAML group (17: RFC table 5.1's 16, then ``peft``). Component groups
are typed by their base ``Config`` (``Optimizer.Config`` ...) so any implementation fits; parameter
groups (``training``, ``parallelism`` ...) are the plain frozen sections of :mod:`hyper_parallel.sections`,
defined below the models and techniques that read them and re-exported here, where users name them
(``hyper_parallel.trainer.config.TrainingConfig``, in Python and as a ``_target_``; each class's
``__module__`` says so). Checks that span groups are the named rules of :mod:`hyper_parallel.trainer.rules`,
which ``TrainerConfig.cross_check`` runs. Importing this module imports attrs, ``hyper_parallel.config_base``
and the component, model-spec and section modules only: never torch or numpy.
"""

from collections.abc import Iterator

import attrs

from hyper_parallel.components.checkpoint import Checkpoint, DCPCheckpoint
from hyper_parallel.components.dataloader import DataLoader, TextDataLoader
from hyper_parallel.components.loss import CausalLMLoss, Loss
from hyper_parallel.components.lr_scheduler import LRScheduler, WarmupDecay
from hyper_parallel.components.metrics import Metrics, MetricsLogger
from hyper_parallel.components.optimizer import AdamW, Optimizer
from hyper_parallel.components.peft import PEFT, FullFineTuning
from hyper_parallel.components.profiler import Profiler, TorchProfiler
from hyper_parallel.components.tokenizer import HuggingFaceTokenizer, Tokenizer
from hyper_parallel.components.validator import LossValidator, Validator
from hyper_parallel.config_base import ConfigBase, config_class
from hyper_parallel.models import ModelSpec
from hyper_parallel.sections import (
    ActivationCheckpointConfig,
    CommConfig,
    CompileConfig,
    DebugConfig,
    ParallelismConfig,
    TrainingConfig,
)
from hyper_parallel.trainer import rules
from hyper_parallel.trainer.foreign_names import FOREIGN_NAMES

__all__ = [
    "FOREIGN_NAMES",
    "TARGET_PACKAGES",
    "ActivationCheckpointConfig",
    "CommConfig",
    "CompileConfig",
    "DebugConfig",
    "ParallelismConfig",
    "TrainerConfig",
    "TrainingConfig",
]

#: The packages whose public modules hold the Config classes and factories a ``TrainerConfig`` document
#: may name as ``_target_``. The torch runtimes are private modules inside them (or live outside them), so
#: a document can never make the resolver import one; trusted code may allow user packages beside these.
TARGET_PACKAGES = ("hyper_parallel.components", "hyper_parallel.models", "hyper_parallel.trainer")


@config_class
class TrainerConfig(ConfigBase):
    """The whole training configuration: one field per root YAML group (RFC table 5.1)."""

    model: ModelSpec = attrs.field(
        metadata={"help": "The model: a factory such as hyper_parallel.models.qwen3_5.create_model_spec."},
    )
    tokenizer: Tokenizer.Config = attrs.field(
        default=attrs.Factory(HuggingFaceTokenizer.Config),
        metadata={"help": "Tokenizer files and special-token options."},
    )
    dataloader: DataLoader.Config = attrs.field(
        default=attrs.Factory(TextDataLoader.Config),
        metadata={"help": "Training data and loading options."},
    )
    optimizer: Optimizer.Config = attrs.field(
        default=attrs.Factory(AdamW.Config),
        metadata={"help": "Optimizer and its hyperparameters (AdamW by default)."},
    )
    lr_scheduler: LRScheduler.Config = attrs.field(
        default=attrs.Factory(WarmupDecay.Config),
        metadata={"help": "Learning-rate schedule (linear warmup, cosine decay by default)."},
    )
    loss: Loss.Config = attrs.field(
        default=attrs.Factory(CausalLMLoss.Config),
        metadata={"help": "Training objective (next-token cross entropy by default)."},
    )
    training: TrainingConfig = attrs.field(
        default=attrs.Factory(TrainingConfig),
        metadata={"help": "Training loop: steps, batch sizes, sequence length, precision."},
    )
    parallelism: ParallelismConfig = attrs.field(
        default=attrs.Factory(ParallelismConfig),
        metadata={"help": "Parallel degrees (dp, tp, pp, cp, ep) and strategies."},
    )
    checkpoint: Checkpoint.Config = attrs.field(
        default=attrs.Factory(DCPCheckpoint.Config),
        metadata={"help": "Checkpoint saving and loading (off by default)."},
    )
    activation_checkpoint: ActivationCheckpointConfig = attrs.field(
        default=attrs.Factory(ActivationCheckpointConfig),
        metadata={"help": "Activation recomputation to save memory."},
    )
    metrics: Metrics.Config = attrs.field(
        default=attrs.Factory(MetricsLogger.Config),
        metadata={"help": "Metric logging frequency and sinks."},
    )
    profiler: Profiler.Config = attrs.field(
        default=attrs.Factory(TorchProfiler.Config),
        metadata={"help": "Performance profiling (off by default)."},
    )
    validator: Validator.Config = attrs.field(
        default=attrs.Factory(LossValidator.Config),
        metadata={"help": "Periodic validation on held-out data (off by default)."},
    )
    debug: DebugConfig = attrs.field(
        default=attrs.Factory(DebugConfig),
        metadata={"help": "Determinism and numerical debugging switches."},
    )
    compile: CompileConfig = attrs.field(
        default=attrs.Factory(CompileConfig),
        metadata={"help": "torch.compile settings (off by default)."},
    )
    comm: CommConfig = attrs.field(
        default=attrs.Factory(CommConfig),
        metadata={"help": "Communication backend and timeouts."},
    )
    peft: PEFT.Config = attrs.field(
        default=attrs.Factory(FullFineTuning.Config),
        metadata={
            "help": "Parameter-efficient fine-tuning: LoRA adapters on a frozen model, or (the default) "
            "every weight trains."
        },
    )

    def run_seed(self) -> int:
        """The seed every draw of the run starts from (weights, adapters, data): ``debug.seed`` when set,
        else ``training.seed``."""
        return self.debug.seed if self.debug.seed is not None else self.training.seed

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for conflicts between root groups (paths from the root): the
        resolver asks every root this; the rules are :func:`hyper_parallel.trainer.rules.cross_group_issues`.
        """
        return rules.cross_group_issues(self)

    def warnings(self) -> Iterator[tuple[str, str]]:
        """Yield ``(field path, message)`` for settings that make the run pointless but not wrong
        (:func:`hyper_parallel.trainer.rules.warnings`)."""
        return rules.warnings(self)

    def world_size_issues(self, world_size: int) -> list[tuple[str, str]]:
        """Root-relative ``(field path, message)`` pairs for running on ``world_size`` ranks
        (:func:`hyper_parallel.trainer.rules.world_size_issues`)."""
        return rules.world_size_issues(self, world_size)
