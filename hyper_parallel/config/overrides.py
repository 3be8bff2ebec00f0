"""Typed dotted overrides (``--optimizer.lr 1e-4``) patched into a resolved config's raw tree.

Overrides never mutate a config and never skip a check: the resolved config is unstructured into a fresh
tree, every override is patched into that tree, and the caller restructures the tree once, which re-runs
every type check, validator and cross-field check. A string value is read by the type of the field it lands
on (the table of type rules says how), so ``--metrics.run_name 2024`` stays a string while
``--training.max_steps 2e2`` is refused.
"""

import functools
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from hyper_parallel.config.errors import ConfigError, did_you_mean, echo, format_path
from hyper_parallel.config.root import RootFacts, field_owners, unknown_root_field
from hyper_parallel.config.targets import TARGET_KEY, Target, TargetError, load_target
from hyper_parallel.config.types import (
    NO_CHILD,
    child_names,
    child_type,
    class_fields,
    describe_value,
    strip_optional,
    takes_text,
)
from hyper_parallel.config.validation import Path, Problem, field_default, problems_of
from hyper_parallel.config.yaml_load import expand_env, parse_scalar

if typing.TYPE_CHECKING:  # the converter module imports this one
    from hyper_parallel.config.conversion import ConfigConverter

__all__ = ["Override", "OverridePatch", "parse_path"]

# ASCII digits only, at most 9 of them: ``\d`` would accept other scripts' digits, and an index of thousands
# of digits would make ``int()`` raise instead of the key being reported as malformed.
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[[0-9]{1,9}\])*)$")
_INDEX = re.compile(r"\[([0-9]{1,9})\]")
_NULLS = ("null", "~")


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


def _reader(tp: Any, conv: "ConfigConverter") -> Callable[[str], Any]:
    """A function reading command-line text as a value of ``tp``; the type is inspected once, here."""
    bare, nullable = strip_optional(tp)
    as_is, may_stay_text = takes_text(bare)
    if as_is:
        return (lambda text: None if text in _NULLS else text) if nullable else (lambda text: text)
    if may_stay_text:
        hook = conv.get_structure_hook(tp)

        def read_text_or_value(text: str) -> Any:
            if nullable and text in _NULLS:
                return None
            try:
                parsed = parse_scalar(text)
                hook(parsed, tp)
            except Exception:
                return text
            return parsed

        return read_text_or_value
    return parse_scalar


def _is_switch(o: Override) -> bool:
    """Whether ``o`` switches a group's implementation (``--group._target_ NAME``)."""
    return len(o.path) == 2 and o.path[1] == TARGET_KEY


def _group_fields(target: Target) -> dict[str, Any]:
    """The annotation of each field (Config class) or parameter (factory) a group's target takes."""
    return dict(target.params) if target.is_factory else class_fields(target.obj)


_NO_DEFAULT: Any = object()


class OverridePatch:
    """One application of overrides to a root config: what every step needs, and the problems found.

    ``set_by_user(path)`` says where the document set a value (a file position) or None for a default; a
    value the user set that a switched-to target does not accept is an error, a default is dropped.
    """

    def __init__(
        self,
        conv: "ConfigConverter",
        facts: RootFacts,
        overrides: list[Override],
        allowed: tuple[str, ...],
        set_by_user: Callable[[Path], str | None] | None = None,
    ) -> None:
        self.conv = conv
        self.facts = facts
        self.overrides = overrides
        self.allowed = allowed
        self.set_by_user = set_by_user or (lambda _path: None)
        #: Every problem found so far, in the order found.
        self.problems: list[Problem] = []
        #: The tree being patched (its groups' targets say which group has a field), if any.
        self._tree: Mapping[str, Any] | None = None

    def patch(self, tree: dict[str, Any]) -> None:
        """Patch every override into ``tree`` (a fresh unstructured config) in place.

        ``_target_`` switches are applied first, so other overrides of that group are typed by the new
        target.
        """
        self._tree = tree
        for o in self.overrides:
            if _is_switch(o):
                self._switch(tree, o)
        refused = {p.path for p in self.problems}  # fields a switch already reported are not reported twice
        targets: dict[str, Target | None] = {}
        for o in self.overrides:
            if _is_switch(o) or o.path[:2] in refused:
                continue
            group = self._group_of(o)
            if group is None:
                continue
            if group not in targets:
                targets[group] = self._target_of(tree, group)
            target = targets[group]
            read = self._read(o, target) if target is not None else None
            if read is not None:
                self._set(tree, o.path, read[1])

    def check(self, raw: object) -> None:
        """Check the overrides against a document that did not resolve: their paths and value types only.

        The document's own problems keep the overrides from being applied, but a mistyped path or a value
        of the wrong type is wrong whatever the document says, so it belongs in the same report. Each group
        is typed by the ``_target_`` an override switches to, else the document's, else the root default's.
        """
        switches = {o.path[0]: o.value for o in self.overrides if _is_switch(o)}
        for o in self.overrides:
            group = self._group_of(o)
            if group is None:
                continue
            node = raw.get(group) if isinstance(raw, Mapping) else None
            name = switches.get(group)
            if name is None:
                given = isinstance(node, Mapping) and TARGET_KEY in node
                name = node[TARGET_KEY] if given else self.facts.default_targets.get(group)  # type: ignore[index]
            try:
                target = load_target(name, self.facts.types[group], self.allowed, self.conv.checked_targets)
            except TargetError as exc:
                if _is_switch(o):
                    self.problems.append(Problem(o.path, str(exc)))
                continue  # a bad '_target_' in the document is reported by the resolve itself
            read = None if _is_switch(o) else self._read(o, target)
            if read is not None:
                try:
                    self.conv.get_structure_hook(read[0])(read[1], read[0])
                except Exception as exc:
                    self.problems.extend(problems_of(exc, o.path))

    # -- steps ---------------------------------------------------------------------------------------------

    def _group_of(self, o: Override) -> str | None:
        """The root group an override names, or None after recording that there is no such group."""
        group = o.path[0]
        if isinstance(group, str) and group in self.facts.types:
            return group
        if isinstance(group, str):
            message = unknown_root_field(self.conv, self.facts, group, self._tree)
        else:
            message = f"unknown root field {echo(group)}"
        self.problems.append(Problem(o.path[:1], message, "key"))
        return None

    def _target_of(self, tree: dict[str, Any], group: str) -> Target | None:
        try:
            return load_target(
                tree[group].get(TARGET_KEY), self.facts.types[group], self.allowed, self.conv.checked_targets
            )
        except TargetError as exc:
            self.problems.append(Problem((group, TARGET_KEY), str(exc)))
            return None

    def _read(self, o: Override, target: Target) -> tuple[Any, Any] | None:
        """The type of the field an override lands on under ``target``, and its value read by that type;
        None after recording a problem (no field named, or no such field)."""
        if len(o.path) == 1:
            group = o.path[0]
            self.problems.append(Problem(o.path, f"name a field of {group!r}, e.g. {group}.<field>", "key"))
            return None
        key = (target.obj, o.path[1:])
        cache = self.conv.override_fields
        found = cache.get(key)
        if found is None:
            tp = self._field_type(_group_fields(target), o.path[1:], o.path[:1])
            if tp is NO_CHILD:
                return None
            if len(cache) > 4096:  # keys can name entries of open mappings: keep the cache bounded
                cache.clear()
            found = cache[key] = (tp, _reader(tp, self.conv))
        tp, reader = found
        if not isinstance(o.value, str):
            return tp, o.value
        try:
            return tp, reader(expand_env(o.value))  # ${env:NAME} as in a file; any other ${...} refused
        except ConfigError as exc:  # text that is not a value at all ('[1,'): reported at its override
            for issue in exc.issues:
                column = issue.location.rpartition(":")[2] if issue.location else ""
                where = f" (column {column})" if column.isdigit() and int(column) > 1 else ""
                self.problems.append(Problem(o.path, f"cannot read {echo(o.value)}: {issue.message}{where}"))
            return None

    def _field_type(self, fields: dict[str, Any], rest: Path, here: Path) -> Any:
        """The annotation at ``rest`` below a group with ``fields``, or NO_CHILD after recording a problem."""
        tp: Any = NO_CHILD
        names = list(fields)

        def step(seg: str | int) -> Any:
            return fields.get(seg, NO_CHILD) if isinstance(seg, str) else NO_CHILD

        for seg in rest:
            here = (*here, seg)
            child = step(seg)
            if child is NO_CHILD:
                hint = did_you_mean(seg, names) if isinstance(seg, str) else ""
                if not hint and isinstance(seg, str) and len(here) == 2:  # '--training.lr': lr is elsewhere
                    owners = field_owners(self.conv, self.facts, seg, self._tree)
                    hint = f"; it is a field of {owners[0]!r} ({owners[0]}.{seg})" if owners else ""
                where = ".".join(str(p) for p in here[:-1])
                self.problems.append(Problem(here, f"no field {echo(seg)} under {where!r}{hint}", "key"))
                return NO_CHILD
            tp = child
            names = child_names(tp)
            step = functools.partial(child_type, tp)
        return tp

    def _switch(self, tree: dict[str, Any], o: Override) -> None:
        """Replace the group's body for the new target (a problem is recorded if it cannot be)."""
        group = self._group_of(o)
        if group is None:
            return
        old_body = tree[group]
        try:
            old: Target | None = load_target(
                old_body.get(TARGET_KEY), self.facts.types[group], self.allowed, self.conv.checked_targets
            )
        except TargetError:
            old = None
        try:
            new = load_target(o.value, self.facts.types[group], self.allowed, self.conv.checked_targets)
        except TargetError as exc:
            self.problems.append(Problem(o.path, str(exc)))
            return
        accepted = _group_fields(new)
        defaults = self._defaults(old) if old is not None else {}
        overridden = {x.path[1] for x in self.overrides if len(x.path) >= 2 and x.path[0] == group}
        body: dict[str, Any] = {TARGET_KEY: new.name}
        for name, value in old_body.items():
            if name == TARGET_KEY:
                continue
            where = self.set_by_user((group, name))
            if where is None and name in overridden:
                where = "on the command line"
            if where is None and (name not in defaults or defaults[name] != value):
                where = "to a value other than the default"
            if name in accepted:
                # A shared field keeps its value, unless that value was only the old target's default
                # and the new target cannot take it (a factory's default flavor): the new default applies.
                if (
                    where is None
                    and defaults.get(name, _NO_DEFAULT) == value
                    and not self._fits(value, accepted[name])
                ):
                    continue
                body[name] = value
                continue
            if where is not None:
                short = new.name.rpartition(".")[2] if new.is_factory else new.obj.__qualname__
                self.problems.append(
                    Problem(
                        (group, name),
                        f"{name!r} was set {where}, but the new target {short} has no such field",
                        "key",
                    )
                )
        tree[group] = body

    def _fits(self, value: Any, tp: Any) -> bool:
        try:
            self.conv.get_structure_hook(tp)(value, tp)
        except Exception:
            return False
        return True

    def _defaults(self, target: Target) -> dict[str, Any]:
        """The unstructured default of each field of a Config class or parameter of a factory."""
        if target.is_factory:
            found = dict(target.defaults)
        else:
            found = {f.name: field_default(f) for f in attrs.fields(target.obj)}
        out = {}
        for name, value in found.items():
            if value is attrs.NOTHING:
                continue
            try:
                out[name] = self.conv.get_unstructure_hook(value.__class__)(value)
            except Exception:
                continue
        return out

    def _set(self, tree: dict[str, Any], path: Path, value: Any) -> None:
        """Set ``value`` at ``path`` in the fresh tree, creating mappings and lists on the way."""
        node: Any = tree
        for i, seg in enumerate(path[:-1]):
            nxt_seg = path[i + 1]
            child = node[seg] if _has(node, seg) else None
            if child is None:
                if isinstance(node, list):
                    self.problems.append(Problem(path[: i + 1], f"index {seg} is past the end of the list"))
                    return
                child = node[seg] = [] if isinstance(nxt_seg, int) else {}
            if not isinstance(child, (dict, list)):  # '--a.b 1 --a.b[0] 2': another override set a scalar
                where = format_path(path[: i + 1])
                self.problems.append(
                    Problem(path, f"cannot set a value inside {where!r}, which is {describe_value(child)}")
                )
                return
            node = child
        last = path[-1]
        if isinstance(node, list) and (not isinstance(last, int) or last >= len(node)):
            self.problems.append(
                Problem(path, f"index {last} is past the end of the list ({len(node)} items)")
            )
            return
        node[last] = value


def _has(node: Any, seg: str | int) -> bool:
    if isinstance(node, list):
        return isinstance(seg, int) and seg < len(node)
    return isinstance(node, dict) and seg in node
