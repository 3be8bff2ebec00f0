"""The config layer: YAML with locations, the ``_target_`` resolver, typed overrides and dumps.

Everything a launch script or a test outside the project needs is exported here; the submodules hold the
machinery behind these names. The error types (:mod:`hyper_parallel.errors`), the Config base
(:mod:`hyper_parallel.config_base`) and the factory decorator (:mod:`hyper_parallel.factory_calls`) sit
below this package, since the components, the models and their runtimes import them: importing one of
those never runs this file, which imports the root config.
"""

from hyper_parallel.config.manager import (
    apply_overrides,
    dump_config,
    load_config,
    load_config_report,
    validate,
    write_config,
)
from hyper_parallel.config.resolver import converter, resolve_root
from hyper_parallel.errors import ConfigError, ConfigWarning, Issue

__all__ = [
    "ConfigError",
    "ConfigWarning",
    "Issue",
    "apply_overrides",
    "converter",
    "dump_config",
    "load_config",
    "load_config_report",
    "resolve_root",
    "validate",
    "write_config",
]
