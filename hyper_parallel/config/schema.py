"""A JSON Schema of a root config, so that an editor validates and completes YAML files.

Every root group is a choice over the targets that can build it (its Config subclasses and the factories
declared to return it), discriminated by ``_target_``. Types, defaults and help text come from the same
attrs fields and annotations the resolver checks against.
"""

import importlib
import inspect
import math
import pkgutil
import types
import typing
from collections.abc import Iterable
from typing import Any

import attrs

from hyper_parallel.config import types as type_rules
from hyper_parallel.config.errors import ConfigError
from hyper_parallel.config.help import factory_param_help
from hyper_parallel.config.resolver import converter
from hyper_parallel.config.targets import TARGET_KEY, qualified_name

__all__ = ["discover_targets", "json_schema", "type_schema"]

Schema = dict[str, Any]


def type_schema(tp: Any) -> Schema:
    """The JSON Schema of one annotation, as strict as the resolver (no coercion)."""
    return type_rules.type_schema(tp, _default)


def _default(value: Any) -> Any:
    """A default value as a file writes it, or None when it cannot be written."""
    try:
        out = converter.unstructure(value)
    except ConfigError:
        return None
    return None if isinstance(out, float) and not math.isfinite(out) else out


def _class_schema(cls: type, target: str | None) -> Schema:
    return type_rules.class_schema(cls, target, _default)


def _factory_schema(fn: Any) -> Schema:
    hints = typing.get_type_hints(fn)
    helps = factory_param_help(fn)
    props: Schema = {TARGET_KEY: {"const": qualified_name(fn)}}
    required = [TARGET_KEY]
    for name, param in inspect.signature(fn).parameters.items():
        prop = type_schema(hints[name])
        if helps.get(name):
            prop["description"] = helps[name]
        if param.default is param.empty:
            required.append(name)
        else:
            prop["default"] = _default(param.default)
        props[name] = prop
    schema: Schema = {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }
    if fn.__doc__:
        schema["description"] = inspect.cleandoc(fn.__doc__).split("\n\n")[0]
    return schema


#: Module name segments never imported while discovering targets: launch scripts, and runtime code (which
#: imports torch: component runtimes, the trainers and their process-group start-up). Config classes and
#: factories live in the config modules; private modules are skipped too.
_NOT_CONFIG = frozenset({"train_lm", "train_vl", "runtime", "base", "llm", "vl", "distributed"})


def _import_all(packages: Iterable[str]) -> list[types.ModuleType]:
    modules = []
    for name in packages:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(getattr(package, "__path__", []), prefix=f"{name}."):
            segments = info.name.split(".")
            if any(s.startswith("_") or s in _NOT_CONFIG for s in segments):
                continue
            modules.append(importlib.import_module(info.name))
    return modules


def _subclasses(cls: type) -> list[type]:
    out: list[type] = [cls]
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


def discover_targets(field_type: type, packages: Iterable[str] = ("hyper_parallel",)) -> list[Any]:
    """Every Config class and factory under ``packages`` that can build ``field_type``, sorted by name."""
    modules = _import_all(packages)
    prefixes = tuple(packages)
    found: dict[str, Any] = {}
    for cls in _subclasses(field_type):
        if attrs.has(cls) and "<" not in cls.__qualname__ and cls.__module__.startswith(prefixes):
            found[qualified_name(cls)] = cls
    for module in modules:
        for value in vars(module).values():
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                try:
                    returns = typing.get_type_hints(value).get("return")
                except Exception:
                    continue
                if isinstance(returns, type) and issubclass(returns, field_type):
                    found[qualified_name(value)] = value
    return [found[name] for name in sorted(found)]


def json_schema(root_cls: type, packages: Iterable[str] = ("hyper_parallel",)) -> Schema:
    """The JSON Schema (draft 2020-12) of documents that resolve into ``root_cls``."""
    attrs.resolve_types(root_cls)
    props: Schema = {}
    required: list[str] = []
    for f in attrs.fields(root_cls):
        choices = [
            _class_schema(t, qualified_name(t)) if isinstance(t, type) else _factory_schema(t)
            for t in discover_targets(f.type, packages)
        ]
        prop: Schema = {"oneOf": choices} if choices else {"type": "object"}
        if f.metadata.get("help"):
            prop["description"] = f.metadata["help"]
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
