"""``torch.compile`` per block, after activation checkpointing and before FSDP2 (TorchTitan's order).

Only each block's ``forward`` is compiled, not the module call, so the FSDP2 hooks added later run eagerly
around it and parameter names never change. The loss is compiled by the trainer, not here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # annotations only
    from hyper_parallel.sections import CompileConfig

__all__ = ["apply_compile"]


def apply_compile(blocks: Sequence[nn.Module], config: CompileConfig) -> None:
    """``torch.compile`` each block's ``forward`` with ``config``'s backend, mode and ``fullgraph``."""
    for block in blocks:
        block.forward = torch.compile(
            block.forward, backend=config.backend, mode=config.mode, fullgraph=config.fullgraph
        )
