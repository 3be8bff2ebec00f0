"""Typed dotted overrides (``--optimizer.lr 1e-4``) applied to a resolved config's raw tree.

Overrides never mutate a config and never skip a check: the resolved config is unstructured, every override
is patched into that tree, and the caller restructures the tree once, which re-runs every type check,
validator and cross-field check. A string value is read by the type of the field it lands on, so
``--metrics.run_name 2024`` stays a string while ``--training.max_steps 2e2`` is refused.
"""

import functools
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from hyper_parallel.config.errors import did_you_mean, echo, format_path
from hyper_parallel.config.structure import (
    TARGET_KEY,
    Path,
    Problem,
    Structurer,
    describe_value,
    field_default,
    union_args,
)
from hyper_parallel.config.targets import Target, TargetError, load_target
from hyper_parallel.config.unstructure import unstructure_value
from hyper_parallel.config.yaml_load import parse_scalar

__all__ = ["Override", "check_overrides", "parse_path", "patch_tree"]

# ASCII digits only, at most 9 of them: ``\d`` would accept other scripts' digits, and an index of thousands
# of digits would make ``int()`` raise instead of the key being reported as malformed.
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[[0-9]{1,9}\])*)$")
_INDEX = re.compile(r"\[([0-9]{1,9})\]")


class Override(typing.NamedTuple):
    """One override: the dotted key as the user wrote it, its parsed path and its value."""

    #: The dotted key as written, e.g. ``"optimizer.lr"``.
    key: str
    #: The parsed path, e.g. ``("optimizer", "lr")``.
    path: Path
    #: The value; a string is read by the type of the field it lands on.
    value: object
    #: Where it was given, e.g. the command-line flag.
    origin: str


@functools.lru_cache(maxsize=4096)
def parse_path(key: str) -> Path | None:
    """``"parallelism.pp_layer_split[2]"`` -> ``("parallelism", "pp_layer_split", 2)``; None if malformed."""
    parts: list[str | int] = []
    for segment in key.split("."):
        match = _SEGMENT.match(segment)
        if not match:
            return None
        parts.append(match.group(1))
        parts.extend(int(i) for i in _INDEX.findall(match.group(2)))
    return tuple(parts)


@functools.lru_cache(maxsize=1024)
def _strip_optional(tp: Any) -> Any:
    rest = [a for a in union_args(tp) or () if a is not type(None)]
    return rest[0] if len(rest) == 1 else tp


@functools.lru_cache(maxsize=1024)
def _children(tp: Any) -> tuple[Callable[[str | int], Any], list[str]] | None:
    """How to step into ``tp``: a function from a path segment to its type, and the names to suggest."""
    tp = _strip_optional(tp)
    if isinstance(tp, type) and attrs.has(tp):
        fields = _class_fields(tp)
        return (lambda seg: fields.get(seg) if isinstance(seg, str) else None), list(fields)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (dict, Mapping):
        value_tp = args[1] if args else Any
        return (lambda seg: value_tp if isinstance(seg, str) else None), []
    if origin in (list, tuple, Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return (lambda seg: args[seg] if isinstance(seg, int) and seg < len(args) else None), []
        item = args[0] if args else Any
        return (lambda seg: item if isinstance(seg, int) else None), []
    return None


def _group_fields(target: Target) -> dict[str, Any]:
    """The annotation of each field (Config class) or parameter (factory) a group's target takes."""
    if target.is_factory:
        return dict(target.params)
    return _class_fields(target.obj)


@functools.lru_cache(maxsize=1024)
def _class_fields(cls: type) -> dict[str, Any]:
    attrs.resolve_types(cls)
    return {f.name: f.type for f in attrs.fields(cls) if f.init}


@functools.lru_cache(maxsize=1024)
def _accepts_str(tp: Any) -> bool:
    if tp is str or tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        return all(isinstance(c, str) for c in typing.get_args(tp))
    return str in (union_args(tp) or ())


def _reader(tp: Any, structurer: Structurer) -> Callable[[str], Any]:
    """A function reading command-line text as a value of ``tp``; the type is inspected once, here."""
    bare = _strip_optional(tp)
    nullable = bare is not tp
    if _accepts_str(bare):
        if bare is str or typing.get_origin(bare) is Literal:
            return (lambda text: None if text in ("null", "~") else text) if nullable else (lambda text: text)
        check = structurer.for_type(tp)

        def read_text_or_value(text: str) -> Any:
            if nullable and text in ("null", "~"):
                return None
            parsed = parse_scalar(text)
            scratch: list[Problem] = []
            check(parsed, (), scratch)
            return text if scratch else parsed

        return read_text_or_value
    return parse_scalar


def _field_type(fields: dict[str, Any], rest: Path, path_so_far: Path, problems: list[Problem]) -> Any:
    """The annotation at ``rest`` below a group with ``fields``, or None after recording a problem."""
    tp: Any = None
    names = list(fields)
    step: Callable[[str | int], Any] | None = fields.get  # type: ignore[assignment]
    here = path_so_far
    for seg in rest:
        here = (*here, seg)
        child = step(seg) if step is not None else None
        if child is None:
            hint = did_you_mean(seg, names) if isinstance(seg, str) else ""
            where = ".".join(str(p) for p in here[:-1])
            problems.append(Problem(here, f"no field {echo(seg)} under {where!r}{hint}", "key"))
            return None
        tp = child
        nxt = _children(tp)
        step, names = nxt if nxt is not None else (None, [])
    return tp


def _is_switch(o: Override) -> bool:
    """Whether ``o`` switches a group's implementation (``--group._target_ NAME``)."""
    return len(o.path) == 2 and o.path[1] == TARGET_KEY


#: (group target, path below the group) -> the field's type, and a reader of command-line text for it.
_FIELDS: dict[tuple[object, Path], tuple[Any, Callable[[str], Any]]] = {}


def _group_of(o: Override, root_fields: Mapping[str, Any], problems: list[Problem]) -> str | None:
    """The root group an override names, or None after recording that there is no such group."""
    group = o.path[0]
    if isinstance(group, str) and group in root_fields:
        return group
    hint = did_you_mean(group, root_fields) if isinstance(group, str) else ""
    problems.append(Problem(o.path[:1], f"unknown root field {echo(group)}{hint}", "key"))
    return None


def _read(
    o: Override, target: Target, structurer: Structurer, problems: list[Problem]
) -> tuple[Any, Any] | None:
    """The type of the field an override lands on under ``target``, and its value read by that type;
    None after recording a problem (no field named, or no such field)."""
    if len(o.path) == 1:
        group = o.path[0]
        problems.append(Problem(o.path, f"name a field of {group!r}, e.g. {group}.<field>", "key"))
        return None
    key = (target.obj, o.path[1:])
    found = _FIELDS.get(key)
    if found is None:
        tp = _field_type(_group_fields(target), o.path[1:], o.path[:1], problems)
        if tp is None:
            return None
        if len(_FIELDS) > 4096:  # keys can name entries of open mappings: keep the cache bounded
            _FIELDS.clear()
        found = _FIELDS[key] = (tp, _reader(tp, structurer))
    tp, reader = found
    return tp, reader(o.value) if isinstance(o.value, str) else o.value


def patch_tree(
    tree: dict[str, Any],
    overrides: list[Override],
    root_fields: Mapping[str, Any],
    allowed: tuple[str, ...],
    structurer: Structurer,
    set_by_user: Callable[[Path], str | None],
    problems: list[Problem],
) -> None:
    """Patch ``overrides`` into ``tree`` (the unstructured config) in place.

    ``_target_`` switches are applied first, so other overrides of that group are typed by the new target.
    ``set_by_user(path)`` says where a value was set (a file position, a flag) or None for a default; a
    value the user set that the new target does not accept is an error, a default is dropped.
    """
    # The tree is fresh but its group mappings are shared (see ``unstructure.shared_tree``), except those a
    # switch rebuilds: ``_set`` copies any other container before changing it.
    owned = {id(tree)}
    for o in overrides:
        switched = _is_switch(o) and _switch_target(
            tree, o, root_fields, allowed, structurer, set_by_user, overrides, problems
        )
        if switched:
            owned.add(id(tree[str(o.path[0])]))
    refused = {p.path for p in problems}  # fields a switch already reported are not reported twice
    targets: dict[str, Target | None] = {}
    for o in overrides:
        if _is_switch(o) or o.path[:2] in refused:
            continue
        group = _group_of(o, root_fields, problems)
        if group is None:
            continue
        if group not in targets:
            targets[group] = _target_of(tree, group, root_fields, allowed, problems)
        target = targets[group]
        read = _read(o, target, structurer, problems) if target is not None else None
        if read is not None:
            _set(tree, o.path, read[1], problems, owned)


def check_overrides(
    raw: object,
    overrides: list[Override],
    root_fields: Mapping[str, Any],
    default_targets: Mapping[str, str],
    allowed: tuple[str, ...],
    structurer: Structurer,
    problems: list[Problem],
) -> None:
    """Check overrides against a document that did not resolve: their paths and value types only.

    The document's own problems keep the overrides from being applied, but a mistyped path or a value of
    the wrong type is wrong whatever the document says, so it belongs in the same report. Each group is
    typed by the ``_target_`` an override switches to, else the document's, else the root default's.
    """
    switches = {o.path[0]: o.value for o in overrides if _is_switch(o)}
    for o in overrides:
        group = _group_of(o, root_fields, problems)
        if group is None:
            continue
        node = raw.get(group) if isinstance(raw, Mapping) else None
        name = switches.get(group)
        if name is None:
            given = isinstance(node, Mapping) and TARGET_KEY in node
            name = node[TARGET_KEY] if given else default_targets.get(group)  # type: ignore[index]
        try:
            target = load_target(name, root_fields[group], allowed)
        except TargetError as exc:
            if _is_switch(o):
                problems.append(Problem(o.path, str(exc)))
            continue  # a bad '_target_' in the document is reported by the resolve itself
        read = None if _is_switch(o) else _read(o, target, structurer, problems)
        if read is not None:
            structurer.for_type(read[0])(read[1], o.path, problems)


def _target_of(
    tree: dict[str, Any],
    group: str,
    root_fields: Mapping[str, Any],
    allowed: tuple[str, ...],
    problems: list[Problem],
) -> Target | None:
    try:
        return load_target(tree[group].get(TARGET_KEY), root_fields[group], allowed)
    except TargetError as exc:
        problems.append(Problem((group, TARGET_KEY), str(exc)))
        return None


def _switch_target(
    tree: dict[str, Any],
    o: Override,
    root_fields: Mapping[str, Any],
    allowed: tuple[str, ...],
    structurer: Structurer,
    set_by_user: Callable[[Path], str | None],
    overrides: list[Override],
    problems: list[Problem],
) -> bool:
    """Replace the group's body for the new target; False (with a problem recorded) if it cannot."""
    group = _group_of(o, root_fields, problems)
    if group is None:
        return False
    old_body = tree[group]
    old = _target_of(tree, group, root_fields, allowed, [])
    try:
        new = load_target(o.value, root_fields[group], allowed)
    except TargetError as exc:
        problems.append(Problem(o.path, str(exc)))
        return False
    accepted = _group_fields(new)
    defaults = _defaults(old) if old is not None else {}
    overridden = {x.path[1] for x in overrides if len(x.path) >= 2 and x.path[0] == group}
    body: dict[str, Any] = {TARGET_KEY: new.name}
    for name, value in old_body.items():
        if name == TARGET_KEY:
            continue
        where = set_by_user((group, name))
        if where is None and name in overridden:
            where = "on the command line"
        if where is None and (name not in defaults or defaults[name] != value):
            where = "to a value other than the default"
        if name in accepted:
            # A shared field keeps its value, unless that value was only the old target's default and the
            # new target cannot take it (a factory's default flavor, say): then the new default applies.
            if where is None and defaults.get(name, _NO_DEFAULT) == value:
                scratch: list[Problem] = []
                structurer.for_type(accepted[name])(value, (group, name), scratch)
                if scratch:
                    continue
            body[name] = value
            continue
        if where is not None:
            short = new.name.rpartition(".")[2] if new.is_factory else new.obj.__qualname__
            problems.append(
                Problem(
                    (group, name),
                    f"{name!r} was set {where}, but the new target {short} has no such field",
                    "key",
                )
            )
    tree[group] = body
    return True


_NO_DEFAULT: Any = object()


def _defaults(target: Target) -> dict[str, Any]:
    """The unstructured default of each field of a Config class or parameter of a factory."""
    if target.is_factory:
        return {name: unstructure_value(value, (), []) for name, value in target.defaults.items()}
    defaults = ((f.name, field_default(f)) for f in attrs.fields(target.obj))
    return {name: unstructure_value(value, (), []) for name, value in defaults if value is not attrs.NOTHING}


def _set(tree: dict[str, Any], path: Path, value: Any, problems: list[Problem], owned: set[int]) -> None:
    """Set ``value`` at ``path``; containers on the way that this patch does not own yet are copied first
    (the tree's group mappings are shared with other calls), and ``owned`` records the copies."""
    node: Any = tree
    for i, seg in enumerate(path[:-1]):
        nxt_seg = path[i + 1]
        child = node[seg] if _has(node, seg) else None
        if child is None:
            child = [] if isinstance(nxt_seg, int) else {}
            if isinstance(node, list):
                problems.append(Problem(path[: i + 1], f"index {seg} is past the end of the list"))
                return
            node[seg] = child
            owned.add(id(child))
        elif type(child) in (dict, list) and id(child) not in owned:
            child = child.copy()
            node[seg] = child
            owned.add(id(child))
        if not isinstance(child, (dict, list)):  # e.g. '--a.b 1 --a.b[0] 2': another override set a scalar
            where = format_path(path[: i + 1])
            problems.append(
                Problem(path, f"cannot set a value inside {where!r}, which is {describe_value(child)}")
            )
            return
        node = child
    last = path[-1]
    if isinstance(node, list) and (not isinstance(last, int) or last >= len(node)):
        problems.append(Problem(path, f"index {last} is past the end of the list ({len(node)} items)"))
        return
    node[last] = value


def _has(node: Any, seg: str | int) -> bool:
    if isinstance(node, list):
        return isinstance(seg, int) and seg < len(node)
    return isinstance(node, dict) and seg in node
