"""The root class in both directions: one ``_target_`` per root group in, ``_target_`` back on each group out.

The root class (``TrainerConfig``) declares the groups; this module keeps no list of component names. Its
facts (group names, field types, default targets) are computed once, when the root is registered on the
converter. Structuring checks and imports each group's ``_target_``, checks the arguments against the
target's fields or signature, and only then constructs or calls it; every problem in every group is
collected. Nothing is called before its names are known: first every group's names are walked, at every
depth; a group with a name not known is then checked by names and types alone (no ``__init__``, no
validator, no factory call), no factory is called while another group lacks its ``_target_``, and no target
at all while the document has an unknown root field (validators and cross-group rules wait for it).
Unstructuring writes each group's runtime class (never the declared base, which would lose a subclass's
fields), or the factory and the arguments it was called with.
"""

import contextlib
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from hyper_parallel.config.options import current_options
from hyper_parallel.config.recipes import Recipe, carries_recipe, recipe_of, remember
from hyper_parallel.config.targets import (
    TARGET_KEY,
    Target,
    TargetError,
    load_target,
    qualified_name,
)
from hyper_parallel.config.types import (
    attrs_hook,
    attrs_unstructure,
    check_shape,
    class_fields,
    describe_value,
)
from hyper_parallel.config.validation import (
    CheckedGroup,
    Invalid,
    Path,
    Problem,
    Problems,
    construct,
    cross_check_errors,
    field_default,
    problems_of,
)
from hyper_parallel.errors import did_you_mean, echo
from hyper_parallel.factory_calls import undecorated

if typing.TYPE_CHECKING:  # the converter module imports this one
    from hyper_parallel.config.conversion import ConfigConverter

__all__ = [
    "Resolved",
    "RootFacts",
    "check_groups",
    "elsewhere",
    "foreign_hint",
    "group_hook",
    "group_writer",
    "made_from_hint",
    "root_facts",
    "structure_root",
    "unstructure_group",
    "unstructure_root",
]


class RootFacts(typing.NamedTuple):
    """What the resolver, the overrides and the dump need to know about a root class."""

    #: The root class.
    cls: type
    #: Each group's field type (what its ``_target_`` must build), in declaration order.
    types: Mapping[str, Any]
    #: The ``_target_`` of each group's default value (groups that have one).
    default_targets: Mapping[str, str]
    #: The packages whose public modules hold the Config classes and factories a document of this root
    #: may name (its binding says which: the generic machinery knows no package).
    packages: tuple[str, ...]
    #: Each group's keyword in the root class's ``__init__`` (its attrs alias).
    kwargs: Mapping[str, str]
    #: The groups without a default, which every document must give.
    required: tuple[str, ...]
    #: Other tools' keys -> (the field that replaces each, or ""; what to know, or ""): hints only.
    foreign_names: Mapping[str, tuple[str, str]]

    def allowed(self, extra: tuple[str, ...]) -> tuple[str, ...]:
        """What a ``_target_`` may be under: the root's packages, then ``extra`` (trusted code's)."""
        return _allowed(self.packages, extra) if self.packages else extra


@functools.lru_cache(maxsize=64)
def _allowed(packages: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    """:meth:`RootFacts.allowed`, made once per pair (and so the same tuple each time)."""
    return tuple(dict.fromkeys((*packages, *extra)))


def root_facts(
    root_cls: type, packages: Iterable[str] = (), foreign_names: Mapping[str, tuple[str, str]] | None = None
) -> RootFacts:
    """The facts of ``root_cls`` whose targets live in ``packages``, computed once (by the converter, when
    the root is registered); each package must be a dotted module name. ``foreign_names`` is the root's
    table of other tools' keys (see :func:`foreign_hint`)."""
    attrs.resolve_types(root_cls)
    fields = {f.name: f for f in attrs.fields(root_cls) if f.init}
    defaults = {
        n: qualified_name(type(d)) for n, f in fields.items() if (d := field_default(f)) is not attrs.NOTHING
    }
    names = tuple(packages)
    bad = [p for p in names if not (isinstance(p, str) and all(s.isidentifier() for s in p.split(".")))]
    if bad:
        raise ValueError(
            f"target packages must be dotted module names such as 'my_project.models', got {bad}"
        )
    return RootFacts(
        root_cls,
        {n: f.type for n, f in fields.items()},
        defaults,
        names,
        {n: f.alias or n for n, f in fields.items()},
        tuple(n for n, f in fields.items() if f.default is attrs.NOTHING),
        dict(foreign_names or {}),
    )


_INVALID: Any = object()

_TARGET_ONLY = frozenset({TARGET_KEY})


class Resolved(typing.NamedTuple):
    """A root group's value that is already resolved, taken as it is by :func:`structure_root`.

    Overrides put it in the tree they patch for a group that they leave alone and that cannot be written
    (a ``ModelSpec`` built in Python, without its factory), so such a group does not block overrides of the
    others. It never comes from a document: YAML has no way to spell it.
    """

    #: The group's value.
    value: Any


def structure_root(conv: "ConfigConverter", facts: RootFacts, raw: object) -> Any:
    """Resolve ``raw`` into the root class; raises :class:`Problems` naming every problem."""
    if not isinstance(raw, Mapping):
        raise Invalid(f"expected a mapping of root groups, got {describe_value(raw)}")
    types = facts.types
    problems: list[Problem] = []
    if not raw.keys() <= types.keys():  # some key is not a group (one test for all of them)
        for key in raw:
            if key not in types:
                if isinstance(key, str):
                    message = unknown_root_field(conv, facts, key, None)
                else:
                    message = f"root field names must be strings, got {describe_value(key)}"
                problems.append(Problem((key if isinstance(key, str) else echo(key),), message, "key"))
    options = current_options()
    allowed = facts.allowed(options.allowed)
    kwargs = facts.kwargs
    groups: dict[str, Any] = {}
    targets: dict[str, Target] = {}
    unknown: set[str] = set()  # the groups with a name not known, at any depth
    untargeted = False  # some group given without its '_target_' (or not as a mapping)
    root_known = not problems  # every root field is a group
    for name, node in raw.items():
        if name not in types:
            continue
        if isinstance(node, Resolved):
            if _check_resolved(facts, name, node.value, problems):
                groups[kwargs[name]] = node.value
            continue
        target = _group_target(conv, facts, name, node, allowed, problems)
        if target is None:
            unknown.add(name)
            untargeted = untargeted or not isinstance(node, Mapping) or TARGET_KEY not in node
        else:
            targets[name] = target
            if _unknown_keys(conv, (name,), target, node):
                unknown.add(name)
    # Nothing is called before its names are known: a group with a name not known at any depth is checked
    # by names and types alone (no Config class constructed, no validator run, no factory called); no
    # factory is called while another group lacks its '_target_' (what that group is, is not known); and
    # while the document has an unknown root field, no target at all (RFC 9.2). A factory does run beside
    # another group's unknown name or wrong target, so the rules that read its result report in the same run.
    for name, target in targets.items():
        call = root_known and name not in unknown and not (target.is_factory and untargeted)
        value = _build_group(conv, (name,), facts.types[name], target, raw[name], problems, call, root_known)
        if value is not _INVALID:
            groups[kwargs[name]] = value
    for name in facts.required:
        if name not in raw:
            problems.append(Problem((name,), f"missing required root group {name!r}", "parent"))
    if problems:
        made = None
        # the groups that were made (some refused by their own checks), the rest their defaults
        if root_known:
            with contextlib.suppress(Exception):
                made = facts.cls(**groups)
        unmade = frozenset(n for n in raw if kwargs[n] not in groups) if made is not None else frozenset()
        found = [_in_wrong_group(conv, facts, raw, p) for p in problems]
        unchecked = frozenset(n for n in unknown if n in targets and not targets[n].is_factory)
        raise Problems("invalid config", found, made, unmade, unchecked)
    return construct(facts.cls, groups, options.root_checks)


def check_groups(conv: "ConfigConverter", facts: RootFacts, root: object) -> list[Problem]:
    """What the resolver would find in each group of ``root``, a root built in Python: a value of the wrong
    type; for a Config group, every field's type, validator and its ``cross_check`` (the group is written
    out and structured again, its ``_target_`` not looked up: Python code may build any class); for a
    factory's value (a ``ModelSpec``), its own ``cross_check``. The root's cross-group rules are not run."""
    problems: list[Problem] = []
    if not isinstance(root, facts.cls):
        got = "null" if root is None else f"a {type(root).__qualname__}"
        return [Problem((), f"expected a {facts.cls.__qualname__}, got {got}")]
    for name in facts.types:
        value = getattr(root, name)
        if not _check_resolved(facts, name, value, problems):
            continue
        cls = type(value)
        if attrs.has(cls) and not carries_recipe(value):
            hook = group_hook(conv, cls)
            try:
                hook(conv.get_unstructure_hook(cls)(value), cls)
            except Exception as exc:
                problems.extend(problems_of(exc, (name,)))
        else:
            for found in cross_check_errors(value):
                problems.extend(problems_of(found, (name,)))
    return problems


def _in_wrong_group(
    conv: "ConfigConverter", facts: RootFacts, raw: Mapping[str, Any], problem: Problem
) -> Problem:
    """An unknown field of a group that another group has (``training.lr``) names that group."""
    path = problem.path
    if not (
        problem.anchor == "key"
        and len(path) == 2
        and isinstance(path[1], str)
        and problem.message.startswith("unknown ")
        and "; 'args' is made" not in problem.message
    ):
        return problem
    message = str(problem.message)
    foreign = foreign_hint(facts, path[1], str(path[0]))
    if foreign:  # the table knows better than a guess by spelling
        return problem._replace(message=message.partition("; did you mean")[0] + foreign)
    guess = message if "; did you mean" in message else ""  # the message ends with its guess
    found = elsewhere(conv, facts, path[1], raw, str(path[0]), guess)
    return problem._replace(message=found if guess else message + found) if found != guess else problem


def elsewhere(
    conv: "ConfigConverter",
    facts: RootFacts,
    name: str,
    tree: Mapping[str, Any] | None,
    group: str,
    hint: str,
) -> str:
    """``hint`` (a did-you-mean ending in ``?``, or empty) completed by where field ``name``, given in
    ``group`` which has none, belongs: ``; it is a field of 'optimizer' (optimizer.lr)``; after a guess, only
    when one other group has it exactly: ``, or lr_scheduler.warmup_steps?`` in place of the guess's ``?``."""
    owners = [g for g in field_owners(conv, facts, name, tree) if g != group]
    if hint:
        return f"{hint[:-1]}, or {owners[0]}.{name}?" if len(owners) == 1 else hint
    return f"; it is a field of {owners[0]!r} ({owners[0]}.{name})" if owners else ""


def foreign_hint(facts: RootFacts, name: str, group: str | None, *, flag: bool = False) -> str:
    """What another tool's key ``name``, given in ``group`` (None: at the root), is called here, from the
    root's table: ``; did you mean 'optimizer.lr'?`` (``'lr'`` in its own group, ``'--optimizer.lr'`` as an
    option) and what to know in parentheses, or ``; `` and what to know where no field replaces it; ``""``
    for a key the table lacks."""
    found = facts.foreign_names.get(name)
    if found is None:
        return ""
    path, note = found
    if not path:
        return f"; {note}"
    owner, _, field = path.partition(".")
    shown = f"--{path}" if flag else field if owner == group else path
    return f"; did you mean {shown!r}?" + (f" ({note})" if note else "")


#: Root keys of other tools, and what to do instead.
_FOREIGN_ROOT_KEYS = {
    "defaults": "composing a config from other files (Hydra's defaults list) is not supported; "
    "write every group in this file",
}


def unknown_root_field(
    conv: "ConfigConverter", facts: RootFacts, key: str, tree: Mapping[str, Any] | None
) -> str:
    """The message for root key ``key`` that is not a group: what it may have meant.

    A field of some group given at the root (``gc_freq``) names that group. The groups' targets are read
    from ``tree`` (a resolved config's, already imported) or else the root's defaults: a document with an
    unknown root field never gets a target of its own imported.
    """
    if key in _FOREIGN_ROOT_KEYS:
        return f"unknown root field {echo(key)}: {_FOREIGN_ROOT_KEYS[key]}"
    hint = foreign_hint(facts, key, None) or did_you_mean(key, facts.types)
    return f"unknown root field {echo(key)}{hint or elsewhere(conv, facts, key, tree, '', '')}"


def field_owners(
    conv: "ConfigConverter", facts: RootFacts, name: str, tree: Mapping[str, Any] | None
) -> list[str]:
    """The groups whose target (``tree``'s, else the default) has a field or parameter ``name``."""
    owners = []
    allowed = facts.allowed(current_options().allowed)
    for group, tp in facts.types.items():
        node = tree.get(group) if tree is not None else None
        target_name: object
        if isinstance(node, Resolved):  # a group overrides left as it was: its own target
            recipe = recipe_of(node.value)
            target_name = recipe.target if recipe is not None else qualified_name(type(node.value))
        elif isinstance(node, Mapping):
            target_name = node.get(TARGET_KEY)
        else:
            target_name = facts.default_targets.get(group)
        try:
            target = load_target(target_name, tp, allowed, packages=facts.packages)
        except TargetError:
            continue
        if name in (target.params if target.is_factory else class_fields(target.obj)):
            owners.append(group)
    return owners


def _check_resolved(facts: RootFacts, name: str, value: object, problems: list[Problem]) -> bool:
    """Whether an already resolved ``value`` is of group ``name``'s type; records a problem if not."""
    field_type = facts.types[name]
    if isinstance(field_type, type) and not isinstance(value, field_type):
        got = "null" if value is None else f"a {type(value).__qualname__}"
        problems.append(Problem((name,), f"expected an instance of {field_type.__qualname__}, got {got}"))
        return False
    return True


def group_hook(conv: "ConfigConverter", cls: type) -> Any:
    """The structure hook of root group class ``cls`` (a mapping that also holds its ``_target_``), made
    once per converter."""
    hooks = conv.group_hooks
    return hooks.get(cls) or hooks.setdefault(cls, attrs_hook(cls, conv, _TARGET_ONLY))


def _group_target(
    conv: "ConfigConverter",
    facts: RootFacts,
    name: str,
    node: object,
    allowed: tuple[str, ...],
    problems: list[Problem],
) -> Target | None:
    """The target group ``name``'s ``_target_`` names, or None after recording why there is none (a group
    whose ``_target_`` is a close misspelling is checked against the one it most likely meant)."""
    if type(node) is not dict and not isinstance(node, Mapping):
        problems.append(Problem((name,), f"expected a mapping with '_target_', got {describe_value(node)}"))
        return None
    if TARGET_KEY not in node:
        problems.append(
            Problem(
                (name, TARGET_KEY),
                "missing '_target_': a root group given in the file names "
                "the Config class or factory that builds it",
                "parent",
            )
        )
        return None
    field_type = facts.types[name]
    try:
        return load_target(node[TARGET_KEY], field_type, allowed, packages=facts.packages)
    except TargetError as exc:
        problems.append(Problem((name, TARGET_KEY), str(exc)))
        if exc.suggestion is not None:  # the values are checked against the target it most likely meant
            with contextlib.suppress(TargetError):
                meant = load_target(exc.suggestion, field_type, allowed, packages=facts.packages)
                _build_group(conv, (name,), field_type, meant, node, problems, call=False)
        return None


def _unknown_keys(conv: "ConfigConverter", path: Path, target: Target, node: Mapping[str, Any]) -> bool:
    """Whether group ``node`` holds a name ``target`` does not know, at any depth, or lacks a required one
    (names alone: the cheap walk that decides whether anything may be called)."""
    if not target.is_factory:
        return bool(check_shape(conv, target.obj, node, path, _TARGET_ONLY, leaves=False))
    params = target.params
    args = {k: v for k, v in node.items() if k != TARGET_KEY}
    if not args.keys() <= params.keys() or target.required - args.keys():
        return True
    return any(check_shape(conv, params[k], v, (k,), leaves=False) for k, v in args.items())


def _build_group(
    conv: "ConfigConverter",
    path: Path,
    field_type: type,
    target: Target,
    node: Mapping[str, Any],
    problems: list[Problem],
    call: bool = True,
    checks: bool = False,
) -> Any:
    """Group ``node`` built by ``target`` (if ``call``; else only checked by names and types, and, with
    ``checks``, by what a factory checks of its arguments without being called).

    A factory's arguments are checked against its signature, then (if ``call``) it is called and its
    result checked; when it is not called or its arguments are wrong, ``checks`` runs what it checks
    without a call."""
    if not target.is_factory:
        if not call:  # names and types only: no Config class is constructed, none of its code runs
            problems.extend(check_shape(conv, target.obj, node, path, _TARGET_ONLY))
            return _INVALID
        try:
            return group_hook(conv, target.obj)(node, target.obj)
        except Exception as exc:
            problems.extend(problems_of(exc, path))
            return exc.made if isinstance(exc, CheckedGroup) else _INVALID
    args = {k: v for k, v in node.items() if k != TARGET_KEY}
    before = len(problems)
    short = target.name.rpartition(".")[2]
    params = target.params
    for key in args:
        if key not in params:
            shown = key if isinstance(key, str) and key != TARGET_KEY else echo(key)
            hint = did_you_mean(key, target.params) if isinstance(key, str) else ""
            if not hint and isinstance(key, str):
                value = args[key]
                inner = next(iter(value), None) if isinstance(value, Mapping) else None
                hint = made_from_hint(field_type, key, path, inner if isinstance(inner, str) else None)
            problems.append(
                Problem((*path, shown), f"unknown parameter {echo(key)} of {short}(){hint}", "key")
            )
    for name in sorted(target.required - args.keys()):
        problems.append(Problem((*path, name), f"missing required parameter {name!r} of {short}()", "parent"))
    kwargs = {}
    for name, value in args.items():
        if name in params:
            tp = params[name]
            shape = [] if call else check_shape(conv, tp, value, (*path, name))  # constructs nothing
            problems.extend(shape)
            if shape:
                continue
            try:
                kwargs[name] = conv.get_structure_hook(tp)(value, tp)
            except Exception as exc:
                problems.extend(problems_of(exc, (*path, name)))
    if len(problems) > before or not call:
        check = getattr(target.obj, "check_arguments", None)  # what it can check without being called
        if checks and callable(check):
            try:
                check(**kwargs)
            except Problems as exc:
                problems.extend(problems_of(exc, path))
            except Exception:
                pass
        return _INVALID
    try:
        result = undecorated(target.obj)(**kwargs)  # the call is recorded below, with its locations
    except Problems as exc:  # the factory's own checks, each at its own argument
        problems.extend(problems_of(exc, path))
        return _INVALID
    except (Exception, SystemExit) as exc:  # a factory never ends the process; Ctrl-C still interrupts
        problems.append(Problem(path, f"{short}() raised {type(exc).__name__}: {exc}{_raised_at(exc)}"))
        return _INVALID
    if not isinstance(result, field_type):
        got = "null" if result is None else f"a {type(result).__qualname__}"
        problems.append(
            Problem(path, f"{short}() returned {got}, not the {field_type.__qualname__} it declares")
        )
        return _INVALID
    for found in cross_check_errors(result):
        problems.extend(problems_of(found, path))
    if len(problems) > before:
        return _INVALID
    # Every parameter explicit, in signature order, so a dump shows what the factory really received.
    explicit = {n: target.defaults.get(n) for n in params}
    explicit.update(kwargs)  # every key given is a parameter (else refused above): the order stays
    locate = current_options().locate
    if locate is None:
        given: dict[str, str | None] = dict.fromkeys(kwargs)
    else:
        given = {n: locate(Problem((*path, n), "", "key")) for n in kwargs}
    remember(result, Recipe(target.name, explicit, target.obj, given))
    return result


def made_from_hint(result_type: Any, name: str, path: Path, inner: str | None) -> str:
    """For a factory parameter ``name`` that is not one but a field of what the factory returns
    (``model.args``), the parameter the field is made from (its ``made_from`` metadata):
    ``; 'args' is made by the factory from 'overrides': set model.overrides.n_layers`` (``inner`` is the
    key below ``name`` the user gave, if any). Empty when the field has no such parameter."""
    field = attrs.fields_dict(result_type).get(name) if attrs.has(result_type) else None
    made_from = field.metadata.get("made_from") if field is not None else None
    if not isinstance(made_from, str):
        return ""
    where = ".".join(str(p) for p in (*path, made_from, inner or "<name>"))
    return f"; {name!r} is made by the factory from {made_from!r}: set {where}"


def _raised_at(exc: BaseException) -> str:
    """`` (at file:line)`` of the innermost frame that raised ``exc`` outside the config layer, or ``""``."""
    import os
    import traceback  # only a failing factory pays for it

    here = os.path.dirname(__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.dirname(f.filename) != here]
    if not frames:
        return ""
    name = frames[-1].filename
    try:
        shown = os.path.relpath(name)
    except ValueError:  # another drive (Windows)
        shown = name
    return f" (at {name if shown.startswith('..') else shown}:{frames[-1].lineno})"


def unstructure_root(conv: "ConfigConverter", facts: RootFacts, root: Any) -> dict[str, Any]:
    """Every root group with its ``_target_`` and every field explicit, in declaration order (a fresh tree).

    Raises :class:`Problems` naming each value that cannot be written.
    """
    problems: list[Problem] = []
    out = {name: unstructure_group(conv, name, getattr(root, name), problems) for name in facts.types}
    if problems:
        raise Problems("cannot write the config", problems)
    return out


def unstructure_group(conv: "ConfigConverter", name: str, value: Any, problems: list[Problem]) -> Any:
    """Root group ``name``'s value as a fresh mapping with its ``_target_`` first (a factory's result as
    the call that made it); what cannot be written is added to ``problems``."""
    recipe = recipe_of(value)
    if recipe is not None:
        body = {TARGET_KEY: recipe.target}
        for key, arg in recipe.args.items():
            try:
                body[key] = conv.get_unstructure_hook(arg.__class__)(arg)
            except Exception as exc:
                problems.extend(problems_of(exc, (name, key)))
        return body
    if carries_recipe(value):  # made by factories, but this one was built by hand: no call to write
        kind = type(value).__qualname__
        objects = [f.name for f in attrs.fields(type(value)) if f.init and callable(getattr(value, f.name))]
        named = ", ".join(objects[:-1]) + f" and {objects[-1]}" if len(objects) > 1 else "".join(objects)
        held = f": a file cannot hold its {named} (Python objects)" if objects else ""
        problems.append(
            Problem(
                (name,),
                f"this {kind} was built without a factory ({kind}(...) or attrs.evolve), so it cannot be "
                f"written to a config file or made again with overrides{held}; make it with a factory "
                f"declared to return {kind} (a config names it in '_target_'; called in Python, a factory "
                "decorated with hyper_parallel.factory_calls.records_call records the call)",
                "key",
            )
        )
        return {}
    try:
        return group_writer(conv, type(value))(value)
    except Exception as exc:
        problems.extend(problems_of(exc, (name,)))
        return {}


def group_writer(conv: "ConfigConverter", cls: Any) -> Callable[[Any], dict[str, Any]]:
    """The unstructure function of a root group's Config class: ``_target_`` first, then every field."""
    writers = conv.group_writers
    writer = writers.get(cls)
    if writer is None:
        target, why = _target_name(cls)
        if why is None:
            writer = attrs_unstructure(cls, conv, target)
        else:

            def writer(value: Any) -> dict[str, Any]:
                raise Invalid(why)

        writers[cls] = writer
    return writer


def _target_name(cls: Any) -> tuple[str, str | None]:
    """The ``_target_`` naming ``cls``, and why it cannot be written (None if it can)."""
    qualname = cls.__qualname__
    if not attrs.has(cls):
        return "", f"a {qualname} cannot be written to a config file"
    module = getattr(cls, "__module__", None)
    why = f"it is defined in {module or 'no module'!s}" if module in (None, "__main__") else None
    if why is None and "<" in qualname:
        why = f"{qualname!r} is a lambda or a local definition"
    if why is not None:
        return "", f"{qualname} cannot be named as a '_target_': {why}"
    return qualified_name(cls), None
