"""What cattrs' structured errors do not say, added on top of them: every failure, at its path, for a user.

cattrs' hooks raise ``ClassValidationError`` / ``IterableValidationError`` (exception groups whose members
carry notes naming the attribute or index) and ``ForbiddenExtraKeysError``; our own hooks raise
:class:`Invalid` with a message written for the user. This module turns such an exception tree into
:class:`Problem` records (a path, a message, which source position locates it), re-runs every attrs
validator of a class when attrs stopped at the first one, and collects ``cross_check`` findings. The
converter turns problems into one :class:`~hyper_parallel.errors.ConfigError`.

Messages are built from data, never read back from text: a validator failure is worded from the
structured :class:`~hyper_parallel._checks.RuleViolation` our validators raise, or from what
:mod:`hyper_parallel.config.attrs_validators` (the one adapter to attrs' validator classes) reads; a
``cross_check`` message that quotes another field (a :class:`~hyper_parallel._checks.Said`) has its quotes
rebased to root paths here, so the manager can cite the override that set each quoted value.
"""

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import attrs
from cattrs.errors import (
    AttributeValidationNote,
    BaseValidationError,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationNote,
)

from hyper_parallel._checks import RuleViolation, Said, rebased
from hyper_parallel.config.attrs_validators import shape_of, violation
from hyper_parallel.config.targets import TARGET_KEY
from hyper_parallel.errors import (
    ConfigError,
    Issue,
    PathPart,
    did_you_mean,
    echo,
    format_path,
    split_path,
)

__all__ = [
    "NO_CHILD",
    "CheckedGroup",
    "Invalid",
    "Locate",
    "Path",
    "Problem",
    "Problems",
    "at_attribute",
    "at_index",
    "class_error",
    "construct",
    "cross_check_errors",
    "field_default",
    "nested_target",
    "problems_of",
    "rebase",
    "to_config_error",
    "unknown_key",
    "validator_message",
    "with_ancestors",
]

Path = tuple[PathPart, ...]
Anchor = Literal["value", "key", "parent"]
#: :func:`~hyper_parallel.config.types.child_type`'s answer when an annotation has no such child.
NO_CHILD: Any = object()
Structure = Callable[[Any, Any], Any]  # (value, annotation) -> value
Child = Callable[[Any, str | int], Any]  # (annotation, segment) -> annotation, or NO_CHILD


class Problem(typing.NamedTuple):
    """A problem found while converting, before it is given a source location.

    ``anchor`` says which source position locates it: the value at ``path`` (a wrong value), the key at
    ``path`` (an unknown key), or the mapping holding ``path`` (a missing key).
    """

    path: Path
    message: str
    anchor: Anchor = "value"


Locate = Callable[[Problem], str | None]


def with_ancestors(paths: Iterable[Path]) -> frozenset[Path]:
    """``paths`` and every path above each (``("optimizer", "lr")``: ``("optimizer",)`` too)."""
    return frozenset(path[:end] for path in paths for end in range(1, len(path) + 1))


class Invalid(ValueError):
    """A value a hook refuses; ``message`` is for the user, ``path`` is relative to where it is raised."""

    def __init__(self, message: str, anchor: Anchor = "value", path: Path = ()) -> None:
        super().__init__(message)
        self.message = message
        self.anchor: Anchor = anchor
        self.path = path


class Problems(ValueError):
    """Several problems at once, with paths relative to where it is raised (a factory's own checks);
    ``config`` and ``unmade`` as :class:`.ConfigError` has them; ``unchecked``: the root groups whose values
    were checked by type alone, a name in them not being known (their own checks wait for it)."""

    def __init__(
        self,
        summary: str,
        problems: Iterable[Problem],
        config: Any = None,
        unmade: frozenset[str] = frozenset(),
        unchecked: frozenset[str] = frozenset(),
    ) -> None:
        self.problems = tuple(problems)
        self.config, self.unmade, self.unchecked = config, unmade, unchecked
        detail = "; ".join(f"{format_path(p.path)}: {p.message}" for p in self.problems)
        super().__init__(f"{summary}: {detail}")


def at_attribute(exc: Exception, cls: type, name: str, tp: object) -> Exception:
    """``exc`` with the note cattrs puts on a failure of attribute ``name``."""
    note = AttributeValidationNote(f"Structuring class {cls.__qualname__} @ attribute {name}", name, tp)
    return _noted(exc, note)


def at_index(exc: Exception, index: PathPart, tp: object) -> Exception:
    """``exc`` with the note cattrs puts on a failure of an item (list index or mapping key)."""
    return _noted(exc, IterableValidationNote(f"Structuring {tp} @ index {index!r}", index, tp))


def _noted(exc: Exception, note: str) -> Exception:
    # ``BaseException.add_note`` is Python 3.11+; cattrs sets ``__notes__`` the same way on 3.10.
    exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    return exc


def _segment(exc: BaseException) -> tuple[bool, PathPart]:
    """The path segment cattrs' last note on ``exc`` names: ``(True, name or index)``, or ``(False, "")``."""
    for note in reversed(getattr(exc, "__notes__", ())):
        if isinstance(note, AttributeValidationNote):
            return True, note.name
        if isinstance(note, IterableValidationNote):
            index = note.index
            return True, index if isinstance(index, (str, int)) else echo(index)
    return False, ""


def problems_of(exc: BaseException, path: Path = ()) -> list[Problem]:
    """Every problem an exception raised by a structure hook describes, with paths below ``path``."""
    if isinstance(exc, Invalid):
        return [Problem((*path, *exc.path), rebase(exc.message, path), exc.anchor)]
    if isinstance(exc, Problems):
        return [Problem((*path, *p.path), rebase(p.message, path), p.anchor) for p in exc.problems]
    if isinstance(exc, ForbiddenExtraKeysError):
        return [unknown_key(path, key, exc.cl) for key in sorted(exc.extra_fields, key=repr)]
    if isinstance(exc, BaseValidationError):
        out: list[Problem] = []
        for sub in exc.exceptions:
            named, seg = _segment(sub)
            here = (*path, seg) if named else path
            if named and type(sub) is KeyError:  # cattrs reading a required key that is not there
                out.append(Problem(here, f"missing required field {seg!r}", "parent"))
            else:
                out.extend(problems_of(sub, here))
        return out
    return [Problem(path, f"{type(exc).__name__}: {exc}")]


def rebase(message: str, path: Path) -> str:
    """``message`` seen from ``path``'s parent: the fields a :class:`~hyper_parallel._checks.Said` message
    quotes, relative to the object at ``path``, get ``path`` in front (a plain message is unchanged)."""
    return rebased(message, format_path(path)) if path and isinstance(message, Said) else message


def unknown_key(path: Path, key: object, cls: type) -> Problem:
    """The problem of key ``key`` that attrs class ``cls`` (at ``path``) has no field for."""
    if key == TARGET_KEY:
        return nested_target((*path, key))
    if not isinstance(key, str):
        return Problem((*path, echo(key)), f"field names must be strings, got {echo(key)}", "key")
    names = [f.name for f in attrs.fields(cls) if f.init] if attrs.has(cls) else []
    message = f"unknown field {echo(key)} for {cls.__qualname__}{did_you_mean(key, names)}"
    return Problem((*path, key), message, "key")


def nested_target(path: Path) -> Problem:
    """The problem of a ``_target_`` below a root group."""
    return Problem(
        path,
        "'_target_' is only allowed at the top of a root group; nested sections are configured by their "
        "fields, and the owning Config decides what they build",
        "key",
    )


class CheckedGroup(ClassValidationError):
    """A Config its own ``cross_check`` refused: it was made all the same (``made``), so the rules that span
    groups can still run on it in the same report."""

    made: Any = None


def to_config_error(
    problems: Iterable[Problem],
    locate: Locate | None,
    config: Any = None,
    unmade: frozenset[str] = frozenset(),
    unchecked: frozenset[str] = frozenset(),
) -> ConfigError:
    """Turn problems into one :class:`ConfigError`, each issue located by ``locate``; the groups in
    ``unchecked`` are named in its ``skipped`` (their own checks wait until every name in them is known)."""
    seen: dict[tuple[Path, str], Issue] = {}
    for p in problems:
        seen.setdefault(
            (p.path, p.message),
            Issue(format_path(p.path), p.message, locate(p) if locate else None, parts=p.path),
        )
    groups = sorted(unchecked)
    each, them = ("it", "it") if len(groups) == 1 else ("each", "them")
    why = f"a name in {each} is not known, and nothing of {them} runs before all are"
    skipped = [(f"the value checks of {', '.join(groups)}", why)] if groups else []
    return ConfigError(seen.values(), config=config, unmade=unmade, skipped=skipped)


def validator_message(
    exc: BaseException, field: "attrs.Attribute[Any] | None" = None, value: object = None
) -> str:
    """The words for ``exc``, raised while building a Config: with the ``field`` whose validator refused
    ``value``, that validator's rule (``must be > 0, got -8``); else a
    :class:`~hyper_parallel._checks.RuleViolation` says its rule at its field (``'tp': must be >= 1, or -1
    for auto, got 0``), and any other exception its own text."""
    if field is not None and field.validator is not None:
        try:
            found = _check_value(field.validator, None, field, _converted(field, value, None))
        except Exception:  # a validator that reads the instance: its own words below
            found = []
        if found:
            where, message = found[0].path, found[0].message
            return f"{format_path(where)}: {message}" if where else message
    if isinstance(exc, RuleViolation):
        return f"'{exc.field}': {exc.message}"
    return exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)


def _check_value(
    validator: Any, instance: object, field: "attrs.Attribute[Any]", value: Any
) -> list[Problem]:
    """Run ``validator`` on ``value`` the way attrs would, but report every failure in the project's words:
    ``and_`` stops at its first failing member as attrs does, ``optional`` skips None, and
    ``deep_iterable`` checks every member, each at its index (attrs stops at the first, without one)."""
    shape = shape_of(validator)
    if shape.kind == "all":
        for member in shape.members:
            found = _check_value(member, instance, field, value)
            if found:
                return found
        return []
    if shape.kind == "optional":
        return [] if value is None else _check_value(shape.members[0], instance, field, value)
    if shape.kind == "items":
        found = _check_value(shape.outer, instance, field, value) if shape.outer is not None else []
        if found or isinstance(value, (str, bytes)):
            return found
        try:
            items = list(value)
        except TypeError:
            return _call(validator, instance, field, value)
        for index, item in enumerate(items):
            for p in _check_value(shape.member, instance, field, item):
                found.append(Problem((index, *p.path), p.message))
        return found
    return _call(validator, instance, field, value)


def _call(validator: Any, instance: object, field: "attrs.Attribute[Any]", value: Any) -> list[Problem]:
    try:
        validator(instance, field, value)
    except (ValueError, TypeError) as exc:
        return [Problem((), violation(validator, field.name, value, exc).message)]
    return []


def field_default(field: "attrs.Attribute[Any]", instance: object = None) -> Any:
    """The default of an attrs field, calling a ``Factory`` (with ``instance`` if it takes self);
    ``attrs.NOTHING`` when there is none (or it needs an instance that was not given)."""
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return attrs.NOTHING if instance is None else default.factory(instance)
        return default.factory()
    return default


def cross_check_errors(obj: object) -> list[Exception]:
    """What ``obj.cross_check()`` yields (``(relative dotted path, message)`` pairs), as :class:`Invalid`."""
    check = getattr(obj, "cross_check", None)
    if check is None:
        return []
    out: list[Exception] = []
    try:
        for relative, message in check():
            out.append(Invalid(message, path=split_path(relative) if relative else ()))
    except Exception as exc:  # a broken check is reported where it belongs, never as a traceback
        return [Invalid(f"{type(obj).__qualname__}.cross_check failed: {exc!r}")]
    return out


def _converted(field: "attrs.Attribute[Any]", value: Any, instance: object) -> Any:
    """``value`` as attrs' ``__init__`` hands it to ``field``'s validators: through the field's converter
    (a plain callable, or an ``attrs.Converter`` that may take the instance and the field)."""
    convert = field.converter
    if convert is None:
        return value
    if isinstance(convert, attrs.Converter):
        return convert(value, instance, field)  # type: ignore[operator]  # attrs sets __call__ per instance
    return convert(value)


def _validator_errors(
    cls: type, kwargs: Mapping[str, Any], skip: set[str], items: Mapping[str, list[tuple[int, Any]]] = {}
) -> list[Exception]:
    """Run every validator of ``cls`` on an unvalidated instance holding ``kwargs`` (defaults elsewhere),
    each value through its field's converter first, as attrs' ``__init__`` does.

    ``items`` holds the sound items of list fields that failed as a whole (a type error in another item):
    their member validators run too, so one bad item hides no other.
    """
    shell: Any = object.__new__(cls)
    fields = attrs.fields(cls)
    out: list[Exception] = []
    for f in fields:
        alias = f.alias or f.name
        value = kwargs[alias] if alias in kwargs else field_default(f, shell)
        if value is attrs.NOTHING:
            continue
        try:
            value = _converted(f, value, shell)
        except Exception:  # attrs' __init__ raises it too: the construction's error says it
            continue
        object.__setattr__(shell, f.name, value)
    for f in fields:
        if f.validator is None:
            continue
        found: list[Problem] = []
        try:
            if f.name in items:
                member = _member_validator(f.validator)
                for index, item in items[f.name]:
                    checked = _check_value(member, shell, f, item)
                    found += [Problem((index, *p.path), p.message) for p in checked]
            elif f.name not in skip and hasattr(shell, f.name):
                found = _check_value(f.validator, shell, f, getattr(shell, f.name))
        except AttributeError:  # a validator reading a field that is itself invalid: reported there
            continue
        except Exception as exc:
            found = [Problem((), f"validator failed: {exc!r}")]
        out.extend(at_attribute(Invalid(p.message, path=p.path), cls, f.name, f.type) for p in found)
    return out


def _member_validator(validator: Any) -> Any:
    """The per-item validator of a ``deep_iterable`` (under ``optional``), or None."""
    shape = shape_of(validator)
    if shape.kind == "optional":
        shape = shape_of(shape.members[0])
    return shape.member


def _sound_items(
    f: "attrs.Attribute[Any]", raw: object, failure: BaseException, structure: Structure, child: Child
) -> list[tuple[int, Any]] | None:
    """The items of list field ``f`` that structure on their own, when ``failure`` names only some items."""
    if (
        f.converter is not None
        or _member_validator(f.validator) is None
        or not isinstance(raw, (list, tuple))
    ):
        return None
    bad = {seg for named, seg in map(_segment, getattr(failure, "exceptions", ())) if named}
    if not bad:
        return None
    out = []
    for index, item in enumerate(raw):
        tp = child(f.type, index)
        if index in bad or tp is NO_CHILD:
            continue
        try:
            out.append((index, structure(item, tp)))
        except Exception:
            continue
    return out


def class_error(
    cls: type, raw: Mapping[str, Any], errors: list[Exception], structure: Structure, child: Child
) -> ClassValidationError:
    """cattrs' errors for ``cls``, completed: every validator failure, not only the first.

    ``errors`` are the members of cattrs' ``ClassValidationError``: field failures (noted with their
    attribute) or the one exception ``cls(...)`` raised (every name of ``raw`` is known: see
    :func:`~hyper_parallel.config.types.check_shape`). The fields that were sound are structured again with
    ``structure(value, type)`` and every validator runs on them (each value through its converter), so
    one bad field hides nothing else; ``child(type, index)`` is the type of a list field's item.
    """
    failures = {seg: e for e in errors for named, seg in [_segment(e)] if named}
    construction = [e for e in errors if not _segment(e)[0]]
    kept = [e for e in errors if e not in construction]
    kwargs: dict[str, Any] = {}
    items: dict[str, list[tuple[int, Any]]] = {}
    for f in attrs.fields(cls):
        if not f.init or f.name not in raw:
            continue
        if f.name in failures:
            sound = _sound_items(f, raw[f.name], failures[f.name], structure, child)
            if sound:
                items[f.name] = sound
            continue
        try:
            kwargs[f.alias or f.name] = structure(raw[f.name], f.type)
        except Exception:
            continue
    found = _validator_errors(cls, kwargs, {str(s) for s in failures}, items)
    if construction and not found and not kept:
        exc = construction[0]
        detail = validator_message(exc) if isinstance(exc, (ValueError, TypeError)) else repr(exc)
        found = [Invalid(f"{cls.__qualname__}: {detail}")]
    return ClassValidationError(f"While structuring {cls.__qualname__}", [*kept, *found], cls)


def construct(cls: type, kwargs: Mapping[str, Any], check: bool = True) -> Any:
    """``cls(**kwargs)`` from checked values, then (if ``check``) its ``cross_check``; every failure in one
    ``ClassValidationError`` (attrs stops at the first validator that fails, without a path)."""
    try:
        obj = cls(**kwargs)
    except Exception as exc:  # a Config's own code failing is the user's problem to see, not a traceback
        found = _validator_errors(cls, kwargs, set())
        if not found:
            detail = validator_message(exc) if isinstance(exc, (ValueError, TypeError)) else repr(exc)
            found = [Invalid(f"{cls.__qualname__}: {detail}")]
        raise ClassValidationError(f"While structuring {cls.__qualname__}", found, cls) from None
    found = cross_check_errors(obj) if check else []
    if found:
        raise ClassValidationError(f"While checking {cls.__qualname__}", found, cls)
    return obj
