"""Text for people: ``--help`` over a resolved config, and the ``--dry-run`` summary.

Both read the same facts the resolver uses (each group's runtime Config class or factory, attrs field
types and their ``help`` metadata), so the help can never list a field the resolver would refuse. Values
are written by the converter the caller passes (the one its root is bound to), else by the type rules
alone: this module depends on no root class.
"""

import inspect
import re
import typing
from collections.abc import Collection, Iterator
from typing import Any

import attrs

from hyper_parallel.config.conversion import ConfigConverter, rules_converter
from hyper_parallel.config.recipes import recipe_of
from hyper_parallel.config.targets import TARGET_KEY, qualified_name
from hyper_parallel.config.types import describe_type
from hyper_parallel.config.yaml_load import is_plain_string
from hyper_parallel.errors import ConfigError

__all__ = ["FieldInfo", "config_help", "factory_param_help", "group_of_field", "iter_fields", "summary"]

_ARG_LINE = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?:\s*(.+)$")


class FieldInfo(typing.NamedTuple):
    """One overridable field: its dotted path, annotation, current value and help text."""

    #: Dotted path, as an override names it.
    path: str
    #: The annotation the value is checked against.
    type: Any
    #: The current (structured) value.
    value: Any
    #: One line of help.
    help: str
    #: What the value is when nothing sets it (a factory's override key: the flavor's value), where that
    #: is known and differs from the current value (then :attr:`has_default`).
    default: Any = None
    #: Whether :attr:`default` is set.
    has_default: bool = False


def factory_param_help(fn: Any) -> dict[str, str]:
    """Per-parameter help from a factory docstring's ``Args:`` section (``name: text`` lines)."""
    doc = inspect.getdoc(fn) or ""
    out: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip().lower() in ("args:", "arguments:", "parameters:"):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line if not line or line.startswith(" ") else "  " + line)
            if match:
                out[match.group(1)] = match.group(2).strip()
            elif line and not line.startswith(" "):
                in_args = False
    return out


def group_of_field(converter: ConfigConverter, root_cls: type, name: str) -> str | None:
    """The root group whose default target has a field or parameter ``name`` (``gc_freq`` -> ``training``),
    for a hint when a field is given without its group; None when no group has one. ``root_cls`` is a
    root registered on ``converter``."""
    from hyper_parallel.config.root import field_owners

    owners = field_owners(converter, converter.root_facts(root_cls), name, None)
    return owners[0] if owners else None


def _walk_attrs(obj: Any, prefix: str) -> Iterator[FieldInfo]:
    cls = type(obj)
    attrs.resolve_types(cls)
    for f in attrs.fields(cls):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        path = f"{prefix}.{f.name}"
        if attrs.has(type(value)):
            yield from _walk_attrs(value, path)
        else:
            yield FieldInfo(path, f.type, value, f.metadata.get("help", ""))


def _made_from(value: Any, recipe: Any, group: str) -> Iterator[FieldInfo]:
    """The keys of each factory parameter that a field of the factory's result is made from (``args``
    from ``overrides``: ``model.overrides.n_layers``), with the value the factory gives each when the
    parameter is left out (the flavor's), where the current value differs from it."""
    for f in attrs.fields(type(value)):
        made_from = f.metadata.get("made_from")
        if made_from not in recipe.args or not attrs.has(type(getattr(value, f.name))):
            continue
        try:  # the factory again, without the parameter: what each key is when not overridden
            plain: Any = getattr(recipe.factory(**{**recipe.args, made_from: None}), f.name)
        except Exception:
            plain = None
        for info in _walk_attrs(getattr(value, f.name), f"{group}.{made_from}"):
            default = _at(plain, info.path.split(".")[2:]) if plain is not None else _MISSING
            if default is not _MISSING and default != info.value:
                yield info._replace(default=default, has_default=True)
            else:
                yield info


_MISSING: Any = object()


def _at(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            break
    return obj


def iter_fields(root: Any) -> Iterator[FieldInfo]:
    """Every overridable field of a resolved root config, ``_target_`` of each group first."""
    for f in attrs.fields(type(root)):
        value = getattr(root, f.name)
        recipe = recipe_of(value)
        if recipe is not None:
            yield FieldInfo(
                f"{f.name}.{TARGET_KEY}", str, recipe.target, "The factory that builds this group."
            )
            hints = typing.get_type_hints(recipe.factory)
            helps = factory_param_help(recipe.factory)
            for name, current in recipe.args.items():
                yield FieldInfo(f"{f.name}.{name}", hints[name], current, helps.get(name, ""))
            yield from _made_from(value, recipe, f.name)
            continue
        yield FieldInfo(
            f"{f.name}.{TARGET_KEY}",
            str,
            qualified_name(type(value)),
            f.metadata.get("help", "The Config class of this group."),
        )
        yield from _walk_attrs(value, f.name)


def _inline(value: Any, converter: ConfigConverter) -> str:
    """A value on one line, in YAML flow style, cut at 200 characters."""
    try:
        raw = converter.unstructure(value)
    except ConfigError:
        raw = repr(value)
    text = _flow(raw)
    return text if len(text) < 200 else text[:197] + "..."


_FLOW_SPECIAL = frozenset(",[]{}:#&*!|>'\"%@`")


def _flow(raw: Any) -> str:
    """YAML flow text of an unstructured value; strings are quoted only where a reader would misread them."""
    if raw is None:
        return "null"
    if raw is True or raw is False:
        return "true" if raw else "false"
    if isinstance(raw, (int, float)):
        return repr(raw)
    if isinstance(raw, str):
        plain = raw == raw.strip() and raw and not _FLOW_SPECIAL.intersection(raw) and is_plain_string(raw)
        if plain:
            return raw
        import json  # only a string a reader would misread pays for it

        return json.dumps(raw, ensure_ascii=False)
    if isinstance(raw, list):
        return "[" + ", ".join(_flow(v) for v in raw) + "]"
    return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in raw.items()) + "}"


def config_help(root: Any, *, converter: ConfigConverter | None = None) -> str:
    """Every overridable dotted path with its type, current value and help text (values written by
    ``converter``, else by the type rules alone)."""
    conv = converter if converter is not None else rules_converter()
    lines = ["overridable fields of this config (--PATH VALUE):", ""]
    for info in iter_fields(root):
        kind = "str" if info.path.endswith(TARGET_KEY) else describe_type(info.type)
        default = f", default: {_inline(info.default, conv)}" if info.has_default else ""
        lines.append(f"  --{info.path}  ({kind}; current: {_inline(info.value, conv)}{default})")
        if info.help:
            lines.append(f"      {info.help}")
    return "\n".join(lines) + "\n"


def summary(
    root: Any,
    *,
    source: str | None = None,
    world_size: int | None = None,
    given: Collection[tuple[str | int, ...]] = (),
    converter: ConfigConverter | None = None,
) -> str:
    """A readable summary of a resolved config: each group's target and its fields that differ from the
    class default or that ``given`` names (paths the file or an override set, such as ``("optimizer",
    "lr")``); a factory-built group shows the factory's full dotted name and every argument. Values are
    written by ``converter``, else by the type rules alone."""
    conv = converter if converter is not None else rules_converter()
    head = f"resolved {source}" if source else "resolved config"
    lines = [f"{head}: {len(attrs.fields(type(root)))} groups, all checks passed"]
    if world_size is not None:
        lines[0] += f" (world size {world_size})"
    for f in attrs.fields(type(root)):
        value = getattr(root, f.name)
        recipe = recipe_of(value)
        if recipe is not None:
            args = ", ".join(f"{k}={_inline(v, conv)}" for k, v in recipe.args.items())
            lines.append(f"  {f.name:<22} {recipe.target}({args})")
            continue
        cls = type(value)
        changed = []
        try:
            default = cls()
        except Exception:
            default = None
        for a in attrs.fields(cls):
            current = getattr(value, a.name)
            if default is None or getattr(default, a.name) != current or (f.name, a.name) in given:
                changed.append(f"{a.name}={_inline(current, conv)}")
        shown = ", ".join(changed) if changed else "defaults"
        lines.append(f"  {f.name:<22} {cls.__qualname__}: {shown}")
    return "\n".join(lines) + "\n"
