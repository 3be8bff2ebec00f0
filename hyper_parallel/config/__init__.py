"""The config layer: YAML with locations, the ``_target_`` resolver, typed overrides and dumps.

Everything a launch script or a test outside the project needs is exported here; the submodules hold the
machinery behind these names.
"""

from hyper_parallel.config.errors import ConfigError, ConfigWarning, Issue
from hyper_parallel.config.manager import apply_overrides, dump_config, load_config, write_config
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
    "write_config",
]
