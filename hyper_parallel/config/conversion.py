"""The cattrs converter class of the config layer (the instance lives in ``resolver``).

``converter.structure(raw, TrainerConfig)`` is a supported public call, so the resolver lives in cattrs
hooks: a strict hook for every type (no coercion, every problem with its path, one :class:`ConfigError`),
and, for a registered root class, a hook that dispatches each root group on its ``_target_``.
Unstructuring goes by each value's runtime class and puts ``_target_`` back on root groups.
"""

from typing import Any, TypeVar

import cattrs

from hyper_parallel.config.root import current_options, structure_root, to_config_error
from hyper_parallel.config.structure import INVALID, Problem, Structurer
from hyper_parallel.config.unstructure import unstructure_root, unstructure_value

__all__ = ["ConfigConverter"]

T = TypeVar("T")


class ConfigConverter(cattrs.Converter):
    """A cattrs ``Converter`` whose structuring is strict and reports every problem at once."""

    def __init__(self) -> None:
        super().__init__()
        self.structurer = Structurer()
        self._roots: set[type] = set()
        self.register_structure_hook_func(lambda _tp: True, self._structure_strict)
        self.register_unstructure_hook_func(lambda _tp: True, self._unstructure_any)

    def register_root(self, root_cls: type) -> None:
        """Make ``root_cls`` a root: each of its fields is a group that a ``_target_`` builds."""
        self._roots.add(root_cls)
        self.register_structure_hook(root_cls, self._structure_root)
        self.register_unstructure_hook(root_cls, unstructure_root)

    def _structure_root(self, raw: Any, root_cls: type[T]) -> T:
        problems: list[Problem] = []
        result = structure_root(self.structurer, root_cls, raw, problems)
        if problems or result is INVALID:
            raise to_config_error(problems, current_options().locate)
        return result  # type: ignore[no-any-return]

    def _structure_strict(self, raw: Any, tp: Any) -> Any:
        problems: list[Problem] = []
        result = self.structurer.structure(raw, tp, (), problems)
        if problems:
            raise to_config_error(problems, current_options().locate)
        return result

    def _unstructure_any(self, value: Any) -> Any:
        if type(value) in self._roots:
            return unstructure_root(value)
        problems: list[Problem] = []
        out = unstructure_value(value, (), problems)
        if problems:
            raise to_config_error(problems, None)
        return out
