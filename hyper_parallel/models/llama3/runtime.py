"""Runtime hooks of Llama 3 referenced by its ``ModelSpec`` (final signatures, not yet implemented).

The config layer only stores these callables. Their bodies arrive with the runtime migration; until
then each raises ``NotImplementedError``. torch is never imported at module level.
"""

from typing import Any

from hyper_parallel.models.llama3.args import Llama3Args
from hyper_parallel.trainer.config import ParallelismConfig

__all__ = ["Llama3StateDictAdapter", "build_model", "parallelize"]

_UNAVAILABLE = (
    "Llama 3 runtime construction is not available in this release; the config layer only describes "
    "the model (ModelSpec). {what} arrives with the trainer runtime migration."
)


def build_model(args: Llama3Args, *, device: str = "meta") -> Any:
    """Create the Llama 3 module for ``args`` on ``device`` (``"meta"`` defers allocation)."""
    raise NotImplementedError(_UNAVAILABLE.format(what="build_model"))


def parallelize(model: Any, parallelism: ParallelismConfig, device_mesh: Any) -> Any:
    """Apply tensor, data, context and pipeline parallelism from ``parallelism`` over ``device_mesh``."""
    raise NotImplementedError(_UNAVAILABLE.format(what="parallelize"))


class Llama3StateDictAdapter:
    """Converts between Hugging Face Llama checkpoints and this model's state dict."""

    def __init__(self, args: Llama3Args, weights_path: str | None = None) -> None:
        self.args = args
        self.weights_path = weights_path

    def from_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape a Hugging Face state dict into this model's layout."""
        raise NotImplementedError(_UNAVAILABLE.format(what="Llama3StateDictAdapter.from_hf"))

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Rename and reshape this model's state dict into the Hugging Face layout."""
        raise NotImplementedError(_UNAVAILABLE.format(what="Llama3StateDictAdapter.to_hf"))
