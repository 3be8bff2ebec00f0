"""A JSON Schema of a root config, so that an editor validates and completes YAML files.

Every root group is a choice over the targets that can build it (its concrete Config subclasses and the
factories declared to return it): ``_target_`` is an ``enum`` of them, and one ``if``/``then`` branch per
target applies that target's schema when ``_target_`` names it. A validator therefore reports a mistake at
the field that has it (``/optimizer/lr``), not "is not valid under any of the given schemas" at the group.
Types, bounds, lengths, choices, defaults and help text come from the same attrs fields, validators and
annotations the resolver checks against; descriptions are plain text (no reST markup).
"""

import inspect
import math
import typing
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from hyper_parallel.config import types as type_rules
from hyper_parallel.config.conversion import ConfigConverter, rules_converter
from hyper_parallel.config.help import factory_param_help
from hyper_parallel.config.targets import (
    TARGET_KEY,
    allowed_prefixes,
    discover_targets,
    import_config_modules,
    qualified_name,
)
from hyper_parallel.errors import ConfigError

__all__ = ["discover_targets", "json_schema", "type_schema"]

Schema = dict[str, Any]
Default = Callable[[Any], Any]


def type_schema(tp: Any, *, converter: ConfigConverter | None = None) -> Schema:
    """The JSON Schema of one annotation, as strict as the resolver (no coercion); defaults are written by
    ``converter``, else by the type rules alone."""
    return type_rules.type_schema(tp, _default_of(converter if converter is not None else rules_converter()))


def _default_of(conv: ConfigConverter) -> Default:
    def default(value: Any) -> Any:
        """A default value as a file writes it, or None when it cannot be written."""
        try:
            out = conv.unstructure(value)
        except ConfigError:
            return None
        return None if isinstance(out, float) and not math.isfinite(out) else out

    return default


def _factory_schema(fn: Any, default: Default) -> Schema:
    hints = typing.get_type_hints(fn)
    helps = factory_param_help(fn)
    props: Schema = {TARGET_KEY: {"const": qualified_name(fn)}}
    required = [TARGET_KEY]
    for name, param in inspect.signature(fn).parameters.items():
        prop = type_rules.type_schema(hints[name], default)
        if helps.get(name):
            prop["description"] = type_rules.plain_text(helps[name])
        if param.default is param.empty:
            required.append(name)
        else:
            prop["default"] = default(param.default)
        props[name] = prop
    schema: Schema = {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }
    if fn.__doc__:
        schema["description"] = type_rules.plain_text(inspect.cleandoc(fn.__doc__).split("\n\n")[0])
    return schema


def _group_schema(field: "attrs.Attribute[Any]", packages: tuple[str, ...], default: Default) -> Schema:
    """One root group: ``_target_`` is one of the targets, and the one it names decides the rest."""
    targets = discover_targets(field.type, packages, walk=False) if isinstance(field.type, type) else []
    if not targets:
        return {"type": "object"}
    names = [qualified_name(t) for t in targets]
    branches = [
        {
            "if": {"properties": {TARGET_KEY: {"const": name}}, "required": [TARGET_KEY]},
            "then": (
                type_rules.class_schema(t, name, default)
                if isinstance(t, type)
                else _factory_schema(t, default)
            ),
        }
        for name, t in zip(names, targets, strict=True)
    ]
    return {
        "type": "object",
        "properties": {
            TARGET_KEY: {"enum": names, "description": "The Config class or factory that builds it."}
        },
        "required": [TARGET_KEY],
        "allOf": branches,
    }


def json_schema(converter: ConfigConverter, root_cls: type, allowed: Iterable[str] = ()) -> Schema:
    """The JSON Schema (draft 2020-12) of documents that ``converter`` resolves into ``root_cls``.

    The schema offers the targets a document may name: those in the public modules of the packages the
    root is registered with, and under ``allowed``, the prefixes trusted code allows (``--allow-target``,
    and ``$HYPER_PARALLEL_ALLOWED_TARGETS``); each must be a dotted module name (``*``, ``.`` and empty
    prefixes are refused with a :class:`~hyper_parallel.errors.ConfigError`).
    """
    facts = converter.root_facts(root_cls)
    prefixes = facts.allowed(allowed_prefixes(tuple(allowed)))
    import_config_modules(prefixes)
    default = _default_of(converter)
    attrs.resolve_types(root_cls)
    props: Schema = {}
    required: list[str] = []
    for f in attrs.fields(root_cls):
        prop = _group_schema(f, prefixes, default)
        if f.metadata.get("help"):
            prop["description"] = type_rules.plain_text(f.metadata["help"])
        props[f.name] = prop
        if f.default is attrs.NOTHING:
            required.append(f.name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": root_cls.__qualname__,
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }
