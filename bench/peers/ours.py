"""Our resolver behind the same surface as the peers (``resolve``, ``load``, ``python -m``)."""

import sys
from collections.abc import Mapping
from typing import Any

from hyper_parallel.config import load_config, resolve_root
from hyper_parallel.trainer.config import TrainerConfig


def resolve(raw: Mapping[str, Any]) -> TrainerConfig:
    """Resolve a parsed document (``resolve_root``)."""
    return resolve_root(raw)


def load(path: str) -> TrainerConfig:
    """Parse the file with locations and resolve it (``load_config``)."""
    return load_config(path)


if __name__ == "__main__":
    load(sys.argv[1])
