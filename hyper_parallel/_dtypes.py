"""The one table from the dtype names a config or a command line writes to torch's dtypes.

Config fields spell dtypes as names (``mixed_precision_param: bfloat16``, ``export_dtype: float16``); the
runtime pieces that act on them (autocast, FSDP's mixed precision, the export cast, the checkpoint's
weights-only export) all read them here. torch is imported when a name is read, never by importing this.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_NAMES", "torch_dtype"]

#: Every dtype name a config or a command line may give, float32 first.
DTYPE_NAMES: tuple[str, ...] = ("float32", "bfloat16", "float16")


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype ``name`` (one of :data:`DTYPE_NAMES`) stands for; ``KeyError`` for any other name."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
