"""The cattrs converter class of the config layer (the instance bound to the root is ``resolver.converter``).

``converter.structure(raw, TrainerConfig)`` is a supported public call, so the resolver lives in cattrs
hooks, found by cattrs' own dispatch: the table of type rules (:mod:`hyper_parallel.config.types`) gives a
strict hook for every kind of annotation (no coercion), cattrs' generator builds the hooks of attrs classes,
and a registered root class gets a hook that dispatches each root group on its ``_target_``.
``converter.get_structure_hook(T)`` returns those hooks; they raise cattrs' structured errors.
``converter.structure`` and ``converter.unstructure`` turn any such error into one :class:`ConfigError`
naming every problem at its path.
"""

import functools
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import cattrs

from hyper_parallel.config.options import current_options
from hyper_parallel.config.root import RootFacts, root_facts, structure_root, unstructure_root
from hyper_parallel.config.types import register_rules
from hyper_parallel.config.validation import problems_of, to_config_error
from hyper_parallel.errors import ConfigError

__all__ = ["ConfigConverter", "rules_converter"]

T = TypeVar("T")


class ConfigConverter(cattrs.Converter):
    """A cattrs ``Converter`` whose structuring is strict and reports every problem at once."""

    def __init__(self) -> None:
        super().__init__(forbid_extra_keys=True, detailed_validation=True)
        self._roots: dict[type, RootFacts] = {}
        #: Structure hooks of root groups' Config classes, whose mappings also hold the ``_target_``.
        self.group_hooks: dict[type, Any] = {}
        #: Unstructure functions of root groups' Config classes, which write the ``_target_`` first.
        self.group_writers: dict[type, Any] = {}
        #: Per-converter caches of the overrides machinery: (target, path) -> (type, text reader).
        self.override_fields: dict[tuple[object, tuple[str | int, ...]], tuple[Any, Any]] = {}
        register_rules(self)

    def register_root(
        self,
        root_cls: type,
        *,
        target_packages: Iterable[str] = (),
        foreign_names: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """Make ``root_cls`` a root: each of its fields is a group that a ``_target_`` builds.

        ``target_packages`` are the packages whose public modules hold the Config classes and factories
        its documents may name (trusted code may allow more per call; see :mod:`.options`);
        ``foreign_names`` maps other tools' keys to the field that replaces each and a note, for hints.
        """
        facts = self._roots[root_cls] = root_facts(root_cls, target_packages, foreign_names)
        self.register_structure_hook(root_cls, lambda raw, _tp: structure_root(self, facts, raw))
        self.register_unstructure_hook(root_cls, lambda value: unstructure_root(self, facts, value))

    def root_facts(self, root_cls: type) -> RootFacts:
        """The facts of a registered root class."""
        return self._roots[root_cls]

    def structure(self, obj: Any, cl: type[T]) -> T:
        """Structure ``obj`` as ``cl``; raises :class:`ConfigError` listing every problem, located when
        the enclosing :func:`~hyper_parallel.config.options.resolve_options` knows the source."""
        try:
            return self.get_structure_hook(cl)(obj, cl)  # type: ignore[no-any-return]
        except ConfigError:
            raise
        except Exception as exc:  # a Problems carries what was made, and what was not checked
            made = {k: getattr(exc, k) for k in ("config", "unmade", "unchecked") if hasattr(exc, k)}
            raise to_config_error(problems_of(exc), current_options().locate, **made) from None

    def unstructure(self, obj: Any, unstructure_as: Any = None) -> Any:
        """The raw form of ``obj`` (by its runtime class); :class:`ConfigError` for what cannot be written."""
        try:
            return self.get_unstructure_hook(obj.__class__ if unstructure_as is None else unstructure_as)(obj)
        except ConfigError:
            raise
        except Exception as exc:
            raise to_config_error(problems_of(exc), None) from None


@functools.cache
def rules_converter() -> ConfigConverter:
    """A converter of the type rules alone, bound to no root: for code that checks or writes values of
    fields (a model factory's overrides, help and schema text) and must not depend on any root class."""
    return ConfigConverter()
