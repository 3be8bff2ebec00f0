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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from hyper_parallel.config.help import factory_param_help
from hyper_parallel.config.structure import INT_LIMIT, TARGET_KEY, field_default, union_args
from hyper_parallel.config.targets import qualified_name
from hyper_parallel.config.unstructure import unstructure_value

__all__ = ["discover_targets", "json_schema", "type_schema"]

Schema = dict[str, Any]


def type_schema(tp: Any) -> Schema:
    """The JSON Schema of one annotation, as strict as the resolver (no coercion)."""
    if tp is Any or tp is object:
        return {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "minimum": -INT_LIMIT - 1, "maximum": INT_LIMIT}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is type(None):
        return {"type": "null"}
    members = union_args(tp)
    if members is not None:
        return {"anyOf": [type_schema(a) for a in members]}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [type_schema(a) for a in args]
        return {"type": "array", "prefixItems": items, "items": False, "minItems": len(items)}
    if origin in (list, tuple, Sequence):
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin in (dict, Mapping):
        return {"type": "object", "additionalProperties": type_schema(args[1]) if args else {}}
    if isinstance(tp, type) and attrs.has(tp):
        return _class_schema(tp, None)
    return {"not": {}, "description": f"{tp!r} cannot be given in a config file"}


def _default(value: Any) -> Any:
    problems: list[Any] = []
    out = unstructure_value(value, (), problems)
    if problems or (isinstance(out, float) and not math.isfinite(out)):
        return None
    return out


def _class_schema(cls: type, target: str | None) -> Schema:
    attrs.resolve_types(cls)
    props: Schema = {}
    required: list[str] = []
    if target is not None:
        props[TARGET_KEY] = {"const": target}
        required.append(TARGET_KEY)
    for f in attrs.fields(cls):
        if not f.init:
            continue
        prop = type_schema(f.type)
        if f.metadata.get("help"):
            prop["description"] = f.metadata["help"]
        default = field_default(f)
        if default is attrs.NOTHING:
            required.append(f.name)
        elif (d := _default(default)) is not None or default is None:
            prop["default"] = d
        props[f.name] = prop
    schema: Schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    if cls.__doc__:
        schema["description"] = inspect.cleandoc(cls.__doc__).split("\n\n")[0]
    return schema


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
#: imports torch). Config classes and factories live in the config modules; private modules are skipped too.
_NOT_CONFIG = frozenset({"train_lm", "train_vl", "runtime"})


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
