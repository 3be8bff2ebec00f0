"""Resolving a root document: one ``_target_`` per root group, dispatched by the root class's field types.

The root class (``TrainerConfig``) declares the groups; this module keeps no list of component names. For
each group given in the document it checks and imports the ``_target_``, checks the arguments against the
target's fields or signature, and only then constructs or calls it. Every problem in every group is
collected; nothing is called while the document still has an unknown root field.
"""

import contextlib
import contextvars
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

from hyper_parallel.config.errors import ConfigError, Issue, did_you_mean, echo, format_path
from hyper_parallel.config.identity import IdentityMap
from hyper_parallel.config.structure import (
    INVALID,
    TARGET_KEY,
    Path,
    Problem,
    Structurer,
    build_attrs,
    describe_value,
    run_cross_check,
)
from hyper_parallel.config.targets import Target, TargetError, allowed_prefixes, load_target

__all__ = ["Recipe", "ResolveOptions", "recipe_of", "resolve_options", "structure_root", "to_config_error"]

Locate = Callable[[Problem], str | None]


class ResolveOptions(typing.NamedTuple):
    """Per-call settings of a resolve, passed down through a context variable (safe across threads)."""

    #: Allowed module prefixes for targets.
    allowed: tuple[str, ...]
    #: Maps a problem to its source location.
    locate: Locate | None = None


_OPTIONS: contextvars.ContextVar[ResolveOptions | None] = contextvars.ContextVar(
    "resolve_options", default=None
)


@contextlib.contextmanager
def resolve_options(
    *, allowed_targets: Iterable[str] | None = None, locate: Locate | None = None
) -> Iterator[ResolveOptions]:
    """Set the allowed target prefixes and the source locator for resolves in this context.

    What is not given is inherited from an enclosing context, so a nested call never loses its caller's
    allowlist or locations.
    """
    outer = _OPTIONS.get()
    if allowed_targets is None and outer is not None:
        allowed = outer.allowed
    else:
        allowed = allowed_prefixes(allowed_targets)
    options = ResolveOptions(allowed, locate or (outer.locate if outer else None))
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


def current_options() -> ResolveOptions:
    """The options of the enclosing :func:`resolve_options`, or the defaults."""
    return _OPTIONS.get() or ResolveOptions(allowed_prefixes())


def to_config_error(problems: Iterable[Problem], locate: Locate | None) -> ConfigError:
    """Turn problems into one :class:`ConfigError`, each issue located by ``locate``."""
    seen: dict[tuple[Path, str], Issue] = {}
    for p in problems:
        seen.setdefault(
            (p.path, p.message), Issue(format_path(p.path), p.message, locate(p) if locate else None)
        )
    return ConfigError(seen.values())


class Recipe(typing.NamedTuple):
    """How a factory-built root value was made: the factory, its dotted name and its checked arguments."""

    #: Canonical dotted name of the factory.
    target: str
    #: Every parameter's value, as structured.
    args: Mapping[str, Any]
    #: The factory function itself.
    factory: Callable[..., Any]


# Factory results cannot hold their own recipe (frozen, slotted), so recipes are kept beside them.
_RECIPES: IdentityMap[Recipe] = IdentityMap()


def recipe_of(obj: object) -> Recipe | None:
    """The recipe of a value a factory built during a resolve, or None."""
    return _RECIPES.get(obj)


_ROOT_FIELDS: dict[type, dict[str, "attrs.Attribute[Any]"]] = {}


def _root_fields(root_cls: type) -> dict[str, "attrs.Attribute[Any]"]:
    """The root class's init fields by name, with their types resolved (computed once per class)."""
    fields = _ROOT_FIELDS.get(root_cls)
    if fields is None:
        attrs.resolve_types(root_cls)
        fields = _ROOT_FIELDS[root_cls] = {f.name: f for f in attrs.fields(root_cls) if f.init}
    return fields


def structure_root(structurer: Structurer, root_cls: type, raw: object, problems: list[Problem]) -> Any:
    """Resolve ``raw`` into ``root_cls``, appending every problem; returns INVALID if there were any."""
    if not isinstance(raw, Mapping):
        problems.append(Problem((), f"expected a mapping of root groups, got {describe_value(raw)}"))
        return INVALID
    fields = _root_fields(root_cls)
    unknown = [k for k in raw if k not in fields]
    for key in unknown:
        if isinstance(key, str):
            message = f"unknown root field {echo(key)}{did_you_mean(key, fields)}"
        else:
            message = f"root field names must be strings, got {describe_value(key)}"
        problems.append(Problem((key if isinstance(key, str) else echo(key),), message, "key"))
    if problems:  # nothing is imported or called while the document names a group that does not exist
        return INVALID

    allowed = current_options().allowed
    groups: dict[str, Any] = {}
    for name, node in raw.items():
        if not _check_group_shape(name, node, problems):
            continue
        field = fields[name]
        value = _resolve_group(structurer, (name,), field.type, node, allowed, problems)
        if value is not INVALID:
            groups[field.alias or name] = value
    missing = [n for n, f in fields.items() if f.default is attrs.NOTHING and n not in raw]
    for name in missing:
        problems.append(Problem((name,), f"missing required root group {name!r}", "parent"))
    if problems:
        return INVALID
    return build_attrs(root_cls, groups, (), problems)


def _check_group_shape(name: str, node: object, problems: list[Problem]) -> bool:
    """Whether ``node`` is a mapping with a ``_target_``; records a problem if not."""
    if type(node) is not dict and not isinstance(node, Mapping):
        problems.append(Problem((name,), f"expected a mapping with '_target_', got {describe_value(node)}"))
    elif TARGET_KEY not in node:
        problems.append(
            Problem(
                (name, TARGET_KEY),
                "missing '_target_': a root group given in the file names "
                "the Config class or factory that builds it",
                "parent",
            )
        )
    else:
        return True
    return False


def _resolve_group(
    structurer: Structurer,
    path: Path,
    field_type: Any,
    node: Mapping[str, Any],
    allowed: tuple[str, ...],
    problems: list[Problem],
) -> Any:
    try:
        target = load_target(node[TARGET_KEY], field_type, allowed)
    except TargetError as exc:
        problems.append(Problem((*path, TARGET_KEY), str(exc)))
        return INVALID
    if not target.is_factory:
        return structurer.for_group(target.obj)(node, path, problems)
    args = {k: v for k, v in node.items() if k != TARGET_KEY}
    return _call_factory(structurer, path, field_type, target, args, problems)


def _call_factory(
    structurer: Structurer,
    path: Path,
    field_type: type,
    target: Target,
    args: Mapping[str, Any],
    problems: list[Problem],
) -> Any:
    before = len(problems)
    short = target.name.rpartition(".")[2]
    for key in args:
        if key not in target.params:
            shown = key if isinstance(key, str) and key != TARGET_KEY else echo(key)
            hint = did_you_mean(key, target.params) if isinstance(key, str) else ""
            problems.append(
                Problem((*path, shown), f"unknown parameter {echo(key)} of {short}(){hint}", "key")
            )
    for name in sorted(target.required - set(args)):
        problems.append(Problem((*path, name), f"missing required parameter {name!r} of {short}()", "parent"))
    kwargs = {
        name: structurer.structure(value, target.params[name], (*path, name), problems)
        for name, value in args.items()
        if name in target.params
    }
    if len(problems) > before:
        return INVALID
    try:
        result = target.obj(**kwargs)
    except Exception as exc:
        detail = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        problems.append(Problem(path, f"{short}() rejected its arguments: {detail}"))
        return INVALID
    if not isinstance(result, field_type):
        got = "null" if result is None else f"a {type(result).__qualname__}"
        problems.append(
            Problem(path, f"{short}() returned {got}, not the {field_type.__qualname__} it declares")
        )
        return INVALID
    run_cross_check(result, path, problems)
    if len(problems) > before:
        return INVALID
    # Every parameter explicit, in signature order, so a dump shows what the factory really received.
    args = {n: kwargs.get(n, target.defaults.get(n)) for n in target.params}
    _RECIPES.set(result, Recipe(target.name, args, target.obj))
    return result
