"""The RFC's entry point: ``resolve_root(raw) -> TrainerConfig``, and the converter bound to that root.

This module binds the generic machinery to :class:`~hyper_parallel.trainer.config.TrainerConfig` and to
the packages its targets live in (``TARGET_PACKAGES``, declared beside it); the machinery itself knows no
component and no package. ``resolve_root(raw)`` and ``converter.structure(raw, TrainerConfig)``
give the same result.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from hyper_parallel.config.conversion import ConfigConverter
from hyper_parallel.config.options import resolve_options
from hyper_parallel.trainer.config import FOREIGN_NAMES, TARGET_PACKAGES, TrainerConfig

__all__ = ["converter", "resolve_root"]

#: The project's converter: ``converter.structure(raw, TrainerConfig)`` resolves a whole document.
converter = ConfigConverter()
converter.register_root(TrainerConfig, target_packages=TARGET_PACKAGES, foreign_names=FOREIGN_NAMES)


def resolve_root(raw: Mapping[str, Any], *, allowed_targets: Iterable[str] | None = None) -> TrainerConfig:
    """Resolve a parsed YAML document into a validated :class:`TrainerConfig`.

    ``allowed_targets`` adds module prefixes (beyond the packages of
    :data:`~hyper_parallel.trainer.config.TARGET_PACKAGES`) whose Config classes and factories the document
    may name; only trusted code passes it, never the document. Raises
    :class:`~hyper_parallel.errors.ConfigError` listing every problem.
    """
    with resolve_options(allowed_targets=allowed_targets):
        return converter.structure(raw, TrainerConfig)
