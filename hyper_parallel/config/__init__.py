"""The config layer: YAML with locations, the ``_target_`` resolver, typed overrides and dumps.

Everything a launch script or a test outside the project needs is exported here; the submodules hold the
machinery behind these names.

The names bound to ``TrainerConfig`` (the manager's and the resolver's) load on first use: a component's
Config module and the runtimes import :mod:`hyper_parallel.config.errors`, which runs this file first, and the
root config imports the components, so importing the manager here would make every component import the whole
root config (and a circular import when a component is imported first). The Config base and the factory
decorator, which every Config and model module imports, sit outside this package
(:mod:`hyper_parallel.config_base`, :mod:`hyper_parallel.factory_calls`).
"""

import importlib
from typing import TYPE_CHECKING, Any

from hyper_parallel.config.errors import ConfigError, ConfigWarning, Issue

if TYPE_CHECKING:
    from hyper_parallel.config.manager import (
        apply_overrides,
        dump_config,
        load_config,
        validate,
        write_config,
    )
    from hyper_parallel.config.resolver import converter, resolve_root

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "Issue",
    "apply_overrides",
    "converter",
    "dump_config",
    "load_config",
    "resolve_root",
    "validate",
    "write_config",
]

_LAZY = {
    "apply_overrides": "manager",
    "dump_config": "manager",
    "load_config": "manager",
    "validate": "manager",
    "write_config": "manager",
    "converter": "resolver",
    "resolve_root": "resolver",
}


def __getattr__(name: str) -> Any:
    """The manager's and resolver's exports, imported when first asked for (a submodule is an attribute
    once imported, as in any package)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
