"""Runtime hooks of Qwen 3.5 referenced by its ``ModelSpec`` (final signatures, not yet implemented).

The config layer only stores these callables. Their bodies arrive with the runtime migration; until
then each raises ``NotImplementedError``. torch is never imported at module level.
"""

from typing import Any

from hyper_parallel.models.qwen3_5.args import Qwen3_5Args, Qwen3_5VLArgs
from hyper_parallel.trainer.config import ParallelismConfig

ModelArgsLike = Qwen3_5Args | Qwen3_5VLArgs

__all__ = [
    "Qwen3_5StateDictAdapter",
    "Qwen3_5VLStateDictAdapter",
    "build_model",
    "build_vl_model",
    "parallelize",
    "parallelize_vl",
]


def _unavailable(model: str, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"{model} runtime construction is not available in this release; the config layer only "
        f"describes the model (ModelSpec). {what} arrives with the trainer runtime migration."
    )


def build_model(args: Qwen3_5Args, *, device: str = "meta") -> Any:
    """Create the Qwen 3.5 language model for ``args`` on ``device`` (``"meta"`` defers allocation)."""
    raise _unavailable("Qwen 3.5", "build_model")


def parallelize(model: Any, parallelism: ParallelismConfig, device_mesh: Any) -> Any:
    """Apply tensor, data, context and pipeline parallelism from ``parallelism`` over ``device_mesh``."""
    raise _unavailable("Qwen 3.5", "parallelize")


def build_vl_model(args: Qwen3_5VLArgs, *, device: str = "meta") -> Any:
    """Create the Qwen 3.5 vision-language model for ``args`` on ``device``."""
    raise _unavailable("Qwen 3.5 VL", "build_vl_model")


def parallelize_vl(model: Any, parallelism: ParallelismConfig, device_mesh: Any) -> Any:
    """Apply the parallelism plan to the vision-language model (vision tower replicated or sharded)."""
    raise _unavailable("Qwen 3.5 VL", "parallelize_vl")


class Qwen3_5StateDictAdapter:
    """Converts between Hugging Face Qwen 3.5 checkpoints and this model's state dict."""

    model = "Qwen 3.5"

    def __init__(self, args: ModelArgsLike, weights_path: str | None = None) -> None:
        self.args = args
        self.weights_path = weights_path

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape a Hugging Face state dict into this model's layout."""
        raise _unavailable(self.model, f"{type(self).__name__}.from_hf")

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape this model's state dict into the Hugging Face layout."""
        raise _unavailable(self.model, f"{type(self).__name__}.to_hf")


class Qwen3_5VLStateDictAdapter(Qwen3_5StateDictAdapter):
    """Converts between Hugging Face Qwen 3.5 vision-language checkpoints and this model's state dict."""

    model = "Qwen 3.5 VL"
