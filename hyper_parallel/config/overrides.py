"""Typed dotted overrides (``--optimizer.lr 1e-4``) patched into a resolved config's raw tree.

Overrides never mutate a config and never skip a check: the resolved config is written out as a fresh tree
(:meth:`OverridePatch.user_tree`), every override is patched into that tree, and the caller restructures the
tree once, which re-runs every type check, validator and cross-field check. A string value is read by the
type of the field it lands on (the table of type rules says how), so ``--metrics.run_name 2024`` stays a
string while ``--training.max_steps 2e2`` is refused.

A ``_target_`` switch keeps the values the user set and only those: every other field takes the new class's
(or factory's) default, and a value the user set that the new class lacks is an error naming where it was
set. ``~group.field`` (``--~group.field`` on the command line, Hydra's delete) removes a value the user set,
which then takes its default again; ``~group`` gives a whole group its default.

What "set by the user" means: the fields the file gave and those an override set, as the report of the
resolve holds them (its ``given`` paths and its locator, which :meth:`OverridePatch.given` carries on); a
factory-built group's own record travels with it (:mod:`hyper_parallel.config.recipes`). For a config
without its report (built in Python, ``resolve_root``'s, ``attrs.evolve``-d), a Config group's set values
are those that differ from the class default: attrs cannot tell a default from the same value passed
explicitly, so such a value is taken as the default and the new class's default replaces it.
"""

import functools
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from hyper_parallel.config.recipes import recipe_of
from hyper_parallel.config.root import (
    Resolved,
    RootFacts,
    elsewhere,
    foreign_hint,
    made_from_hint,
    unknown_root_field,
    unstructure_group,
)
from hyper_parallel.config.targets import (
    TARGET_KEY,
    Target,
    TargetError,
    load_target,
)
from hyper_parallel.config.types import (
    NO_CHILD,
    child_names,
    child_type,
    class_fields,
    describe_value,
    strip_optional,
    takes_text,
)
from hyper_parallel.config.validation import Locate, Path, Problem, field_default, problems_of, with_ancestors
from hyper_parallel.config.yaml_load import expand_env, parse_scalar
from hyper_parallel.errors import ConfigError, did_you_mean, echo, format_path, parse_path

if typing.TYPE_CHECKING:  # the converter module imports this one
    from hyper_parallel.config.conversion import ConfigConverter

__all__ = ["Override", "OverridePatch", "parse_path"]

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

    @property
    def delete(self) -> bool:
        """Whether this override removes the value at its path (``~group.field``, Hydra's delete)."""
        return self.key.startswith("~")


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
    return len(o.path) == 2 and o.path[1] == TARGET_KEY and not o.delete


def _differing(value: Any) -> list[str]:
    """The fields of a Config instance whose value is not their default (what a value built in Python
    counts as set: attrs cannot tell a default from the same value passed explicitly)."""
    return [
        f.name
        for f in attrs.fields(type(value))
        if f.init and ((default := field_default(f)) is attrs.NOTHING or getattr(value, f.name) != default)
    ]


def _group_fields(target: Target) -> dict[str, Any]:
    """The annotation of each field (Config class) or parameter (factory) a group's target takes."""
    return dict(target.params) if target.is_factory else class_fields(target.obj)


class OverridePatch:
    """One application of overrides to a root config: what every step needs, and the problems found.

    :meth:`user_tree` writes a resolved config out whole, :meth:`patch` applies every override to that tree
    (removals first, then ``_target_`` switches, then values), the caller restructures the tree under
    :meth:`locator` through the root's structure hook, and :meth:`given` says what the user set in the
    result, for the next switch. ``given`` and ``locate`` are the report of the config the overrides apply
    to (the paths the user set, and where each was set), when there is one.
    """

    def __init__(
        self,
        conv: "ConfigConverter",
        facts: RootFacts,
        overrides: list[Override],
        allowed: tuple[str, ...],
        given: frozenset[Path] | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.conv = conv
        self.facts = facts
        self.overrides = overrides
        #: The overrides by kind: removals (``~group.field``), ``_target_`` switches, and values.
        self._removals = [o for o in overrides if o.delete]
        self._switches = [o for o in overrides if _is_switch(o)]
        self._values = [o for o in overrides if not o.delete and not _is_switch(o)]
        #: What a target may be under: the root's packages, then what trusted code allows (``allowed``).
        self.allowed = facts.allowed(allowed)
        #: Every problem found so far, in the order found.
        self.problems: list[Problem] = []
        #: The tree being patched (its groups' targets say which group has a field), if any.
        self._tree: Mapping[str, Any] | None = None
        #: The names the report says the user set in each group (None: no report), and where it set them.
        self._given = None if given is None else _names_by_group(given)
        self._old_locate = locate
        #: The names set in each group of that config (None: every value other than the default counts).
        self._set_names: dict[str, frozenset[str] | None] = {}
        #: Groups :meth:`user_tree` cut down to the values set.
        self._reshaped: set[str] = set()
        #: Known locations of the values set in the factory groups.
        self._origins: dict[tuple[str, str], str | None] = {}
        #: Groups of that config with no record, whose non-default values count as set.
        self._unrecorded: set[str] = set()
        #: Groups carried over as they are (they cannot be written); overrides of them were refused.
        self._kept: set[str] = set()

    def user_tree(self, cfg: Any) -> dict[str, Any]:
        """``cfg`` written out whole: every group's ``_target_`` and fields, so that restructuring the tree
        runs every check of every group again.

        The groups that a switch or a removal reshapes, and factory groups (whose unset parameters the
        factory fills in), are cut down to the values the user set. A group that cannot be written (a
        ``ModelSpec`` built in Python) is carried over as it is (its type is checked again) while no
        override names it; an override of it is reported.
        """
        # An override inside a value ('optimizer.betas[0]') patches the whole current value.
        inside = {o.path[:2] for o in self._values if len(o.path) > 2}
        reshaped = {o.path[0] for o in (*self._removals, *self._switches)}
        tree: dict[str, Any] = {}
        for group in self.facts.types:
            value = getattr(cfg, group)
            body = self._group_body(group, value)
            if body is None:
                tree[group] = Resolved(value)
                self._kept.add(group)
                continue
            recipe = recipe_of(value)
            names: frozenset[str] | None
            if recipe is not None:
                self._origins.update(((group, n), where) for n, where in recipe.given.items())
                names = frozenset(recipe.given)
                reshaped.add(group)
            elif self._given is not None:
                names = self._given.get(group, frozenset())
            else:  # built in Python: every value other than the default counts as set
                self._unrecorded.add(group)
                names = frozenset(_differing(value)) if group in reshaped else None
            self._set_names[group] = names
            if group in reshaped and names is not None:
                self._reshaped.add(group)
                keep = names.union([TARGET_KEY], (k for g, k in inside if g == group))
                body = {k: v for k, v in body.items() if k in keep}
            tree[group] = body
        return tree

    def _group_body(self, group: str, value: Any) -> dict[str, Any] | None:
        """``value`` written as root group ``group``, or None if it cannot be (reported if overridden)."""
        problems: list[Problem] = []
        body = unstructure_group(self.conv, group, value, problems)
        if problems:
            if any(o.path[0] == group for o in self.overrides):
                self.problems.extend(problems)
            return None
        return body  # type: ignore[no-any-return]

    def patch(self, tree: dict[str, Any]) -> None:
        """Patch every override into ``tree`` (a fresh unstructured config) in place.

        Removals (``~group.field``) are applied first and ``_target_`` switches next, so a value the new
        target lacks can be removed in the same call, and other overrides of that group are typed by the
        new target.
        """
        self._tree = tree
        for o in self._removals:
            self._delete(tree, o)
        for o in self._switches:
            self._switch(tree, o)
        refused = {p.path for p in self.problems}  # fields a switch already reported are not reported twice
        target_of = functools.cache(functools.partial(self._target_of, tree))  # each group's, looked up once
        for o in self._values:
            group = None if o.path[:2] in refused else self._group_of(o)
            target = None if group is None else target_of(group)
            read = None if target is None else self._read(o, target)
            if read is not None:
                self._set(tree, o.path, read[1])

    def where(self, path: Path) -> str | None:
        """Where the value at ``path`` of the config :meth:`user_tree` wrote was set, if known."""
        if len(path) < 2 or not isinstance(path[0], str) or not isinstance(path[1], str):
            return None
        key = (path[0], path[1])
        if key in self._origins:
            return self._origins[key]
        names = self._set_names.get(path[0])
        if self._old_locate is None or path[0] in self._unrecorded or path[1] not in (names or ()):
            return None
        return self._old_locate(Problem(key, "", "key"))

    def locator(self, locate: Locate) -> Locate:
        """``locate`` (the overrides', then the file's), falling back to where the config :meth:`user_tree`
        wrote had each value set (so a problem of a value set in a file is located there even when the file
        is no longer at hand, and a factory's argument where its record says it was set)."""
        return lambda problem: locate(problem) or self.where(problem.path)

    def given(self, before: frozenset[Path]) -> frozenset[Path]:
        """The paths the user set in the config restructured from the patched tree, ``before`` being those
        of the config :meth:`user_tree` wrote: what was set before and is still there (a group cut down to
        the values set keeps only those), and what the overrides set, with their ancestors."""
        tree = self._tree or {}
        paths = with_ancestors([*before, *(o.path for o in self._values)])
        kept = {p for p in paths if len(p) == 1 or p[0] not in self._reshaped or p[1] in tree[str(p[0])]}
        return frozenset(kept.union((g, n) for g in self._reshaped for n in tree[g]))

    def check(self, raw: object) -> None:
        """Check the overrides against a document that did not resolve: their paths and value types only.

        The document's own problems keep the overrides from being applied, but a mistyped path or a value
        of the wrong type is wrong whatever the document says, so it belongs in the same report. Each group
        is typed by the ``_target_`` an override switches to, else the document's, else the root default's.
        """
        switches = {o.path[0]: o.value for o in self._switches}
        for o in self.overrides:
            group = self._group_of(o)
            if group is None or (o.delete and not self._removable(o)):
                continue
            node = raw.get(group) if isinstance(raw, Mapping) else None
            name = None if o.delete else switches.get(group)  # removals come before switches
            if name is None:
                given = isinstance(node, Mapping) and TARGET_KEY in node
                name = node[TARGET_KEY] if given else self.facts.default_targets.get(group)  # type: ignore[index]
            try:
                target = self._load(name, group)
            except TargetError as exc:
                if _is_switch(o):
                    self.problems.append(Problem(o.path, str(exc)))
                    continue
                # A bad '_target_' in the document is reported by the resolve itself; the override is
                # checked against the target it most likely meant, as the group's values are.
                try:
                    target = self._load(exc.suggestion, group)
                except TargetError:
                    continue
            if o.delete:
                if len(o.path) > 1:
                    self._field_type(_group_fields(target), o.path[1:], o.path[:1])
                continue
            read = None if _is_switch(o) else self._read(o, target)
            if read is not None:
                try:
                    self.conv.get_structure_hook(read[0])(read[1], read[0])
                except Exception as exc:
                    self.problems.extend(problems_of(exc, o.path))
                else:
                    self._check_arguments(target, o, read[1], node)

    def _check_arguments(self, target: Target, o: Override, value: object, node: object) -> None:
        """An override of a factory's argument, checked as the factory checks it without being called
        (its ``check_arguments``: ``--model.overrides.n_layer`` against the flavor's arguments), so the
        document's other problems hide no bad flag."""
        check = getattr(target.obj, "check_arguments", None) if target.is_factory else None
        if not callable(check) or len(o.path) < 2:
            return
        given = {str(k): v for k, v in node.items()} if isinstance(node, Mapping) else {}
        if len(o.path) > 2:  # a key of a mapping argument: ``overrides: {text.vocab_size: ...}``
            value = {".".join(str(part) for part in o.path[2:]): value}
        flavor = {"flavor": given["flavor"]} if isinstance(given.get("flavor"), str) else {}
        try:
            check(**flavor, **{str(o.path[1]): value})
        except Exception as exc:
            self.problems.extend(problems_of(exc, o.path[:1]))

    # -- steps ---------------------------------------------------------------------------------------------

    def _load(self, name: object, group: str) -> Target:
        return load_target(name, self.facts.types[group], self.allowed, packages=self.facts.packages)

    def _group_of(self, o: Override) -> str | None:
        """The root group an override names, or None after recording that there is no such group."""
        group = o.path[0]
        if group in self._kept:  # cannot be written: reported once, by user_tree
            return None
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
            return self._load(tree[group].get(TARGET_KEY), group)
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
                if isinstance(seg, str) and len(here) == 2 and isinstance(here[0], str):  # '--training.lr'
                    foreign = foreign_hint(self.facts, seg, here[0])
                    hint = foreign or elsewhere(self.conv, self.facts, seg, self._tree, here[0], hint)
                    if not hint:  # '--model.args.n_layers': model.overrides
                        inner = rest[1] if len(rest) > 1 and isinstance(rest[1], str) else None
                        hint = made_from_hint(self.facts.types[here[0]], seg, here[:1], inner)
                where = ".".join(str(p) for p in here[:-1])
                self.problems.append(Problem(here, f"no field {echo(seg)} under {where!r}{hint}", "key"))
                return NO_CHILD
            tp = child
            names = child_names(tp)
            step = functools.partial(child_type, tp)
        return tp

    def _delete(self, tree: dict[str, Any], o: Override) -> None:
        """Remove the value ``o`` names (``~group.field``), so that it takes its default again."""
        group = self._group_of(o)
        if group is None or not self._removable(o):
            return
        if len(o.path) == 1:  # '~optimizer': the whole group goes back to the root's default
            default = self.facts.default_targets.get(group)
            if default is None:
                self.problems.append(Problem(o.path, f"{group!r} has no default, so it cannot be removed"))
            else:
                tree[group] = {TARGET_KEY: default}
            return
        target = self._target_of(tree, group)
        if target is None or self._field_type(_group_fields(target), o.path[1:], o.path[:1]) is NO_CHILD:
            return
        node: Any = tree[group]
        for seg in o.path[1:-1]:
            node = node[seg] if _has(node, seg) else None
        last = o.path[-1]
        if isinstance(last, int):
            self.problems.append(Problem(o.path, "a list item cannot be removed; set the whole list instead"))
        elif isinstance(node, dict) and last in node:
            del node[last]
        else:
            others = [k for k in node if k != TARGET_KEY] if isinstance(node, dict) else []
            hint = did_you_mean(last, others)
            self.problems.append(
                Problem(o.path, f"{last!r} is not set (it has its default), so nothing is removed{hint}")
            )

    def _removable(self, o: Override) -> bool:
        """Whether removal ``o`` has the shape of one (no value, not a ``_target_``); records why not."""
        if o.value is not None:
            self.problems.append(
                Problem(o.path, f"a removal ('{o.key}') takes no value, got {echo(o.value)}")
            )
            return False
        if len(o.path) == 2 and o.path[1] == TARGET_KEY:
            self.problems.append(
                Problem(
                    o.path,
                    f"'_target_' cannot be removed; switch with {o.path[0]}._target_ NAME, "
                    f"or remove the whole group with ~{o.path[0]}",
                )
            )
            return False
        return True

    def _switch(self, tree: dict[str, Any], o: Override) -> None:
        """Replace the group's body for the new target (a problem is recorded if it cannot be).

        The body holds only what the user set: those values move to the new target, which gives every
        other field its own default; a value the new target has no field for is reported where it was set.
        """
        group = self._group_of(o)
        if group is None:
            return
        try:
            new = self._load(o.value, group)
        except TargetError as exc:
            self.problems.append(Problem(o.path, str(exc)))
            return
        accepted = _group_fields(new)
        short = new.name.rpartition(".")[2] if new.is_factory else new.obj.__qualname__
        overridden = {x.path[1]: x for x in self._values if len(x.path) >= 2 and x.path[0] == group}
        body: dict[str, Any] = {TARGET_KEY: new.name}
        for name in [*tree[group], *(n for n in overridden if n not in tree[group])]:
            if name == TARGET_KEY:
                continue
            if name in accepted:
                if name in tree[group]:
                    body[name] = tree[group][name]
                continue
            if name in overridden:
                where = _where_text(overridden[name].origin)
            elif group in self._unrecorded:
                where = " to a value other than the default"
            else:
                where = _where_text(self.where((group, name)))
            self.problems.append(
                Problem(
                    (group, name),
                    f"{name!r} was set{where}, but the new target {short} has no such field; "
                    f"remove it with {_removal(o.origin, f'{group}.{name}')}",
                    "key",
                )
            )
        tree[group] = body

    def _set(self, tree: dict[str, Any], path: Path, value: Any) -> None:
        """Set ``value`` at ``path`` in the fresh tree, creating mappings and lists on the way."""
        node: Any = tree
        group = tree.get(path[0]) if len(path) == 2 and isinstance(path[0], str) else None
        if type(group) is dict:  # a field of a group: most overrides
            group[path[1]] = value
            return
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


def _names_by_group(given: frozenset[Path]) -> dict[str, frozenset[str]]:
    """The names set in each root group, from the paths a report says the user set."""
    names: dict[str, set[str]] = {}
    for path in given:
        if len(path) > 1:
            names.setdefault(str(path[0]), set()).add(str(path[1]))
    return {group: frozenset(found) for group, found in names.items()}


def _has(node: Any, seg: str | int) -> bool:
    if isinstance(node, list):
        return isinstance(seg, int) and seg < len(node)
    return isinstance(node, dict) and seg in node


def _where_text(location: str | None) -> str:
    """`` at FILE:LINE:COL`` or `` by --flag`` / `` by overrides['key']`` for a recorded location; empty
    when it is not known."""
    if location is None:
        return ""
    return f" by {location}" if location.startswith(("--", "overrides[")) else f" at {location}"


def _removal(origin: str, key: str) -> str:
    """How to remove ``key`` in the words of the caller that asked for the switch: a flag or a key."""
    return f"--~{key}" if origin.startswith("--") else f"{{'~{key}': None}}"
