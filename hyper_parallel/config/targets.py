"""Turning a ``_target_`` string into a checked Config class or factory, without trusting the string.

A config file is input from anyone, and a ``_target_`` is text that becomes an import and a call. So one
structural rule is checked on the dotted name *before* anything is imported: a target names a public module
(no segment starting with ``_``) inside the allowed packages. Those are the packages that hold the Config
classes and factories of the root being resolved (a fact of its binding, handed in as data: this module
names none), widened for user packages only by trusted code. The torch runtimes are private modules or live
outside those packages, so naming one is refused unimported, and a package's lazy ``__getattr__`` is never
run to find a name. The imported object's own module is checked again (a re-export cannot smuggle
``os.system`` in), and the object must be a Config class deriving from the field type or a fully annotated
function declared to return one. Nothing is called here.

A class that declares ``__abstract__ = True`` in its own body (the base ``Optimizer.Config``, ``ModelSpec``;
the marker is not inherited, as in SQLAlchemy's declarative classes) or that has abstract methods (``abc``)
is a base, not a target: naming one is refused with the list of its concrete targets, and the JSON schema
does not offer it. Python code still constructs a base where it wants one. A name that does not exist (and
is close to none that does) and another group's Config class are refused with the same list.
"""

import functools
import importlib
import inspect
import os
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from hyper_parallel.errors import ConfigError, Issue, closest, echo

__all__ = [
    "ABSTRACT_MARKER",
    "ALLOWED_TARGETS_ENV",
    "TARGET_KEY",
    "Target",
    "TargetError",
    "allowed_prefixes",
    "check_target_name",
    "discover_targets",
    "import_config_modules",
    "is_abstract",
    "is_public",
    "load_target",
    "qualified_name",
    "target_rule",
]

#: The key that names a Config class or factory; allowed on root groups only.
TARGET_KEY = "_target_"
#: Environment variable with extra allowed prefixes, comma-separated (set by trusted launch code).
ALLOWED_TARGETS_ENV = "HYPER_PARALLEL_ALLOWED_TARGETS"
#: Class attribute a base declares in its own body (``__abstract__: ClassVar[bool] = True``): not a target.
ABSTRACT_MARKER = "__abstract__"
#: Longest ``_target_`` string considered.
MAX_TARGET_LENGTH = 256


class TargetError(Exception):
    """A ``_target_`` that cannot be used; the message is for the user, ``suggestion`` the target it most
    likely meant (a misspelled name's closest), so the group's values can still be checked against it."""

    def __init__(self, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.suggestion = suggestion


class Target(typing.NamedTuple):
    """A checked target: a Config class, or a factory with its parameters' annotations.

    (Internal records are named tuples, not attrs classes: they are created once per process start, where
    every class definition costs.)
    """

    #: Canonical dotted name (module + qualified name).
    name: str
    #: The Config class or factory function.
    obj: typing.Any
    #: True for a factory function, False for a Config class.
    is_factory: bool
    #: Factory parameter annotations.
    params: Mapping[str, object]
    #: Factory parameters without a default.
    required: frozenset[str]
    #: Factory parameters' default values.
    defaults: Mapping[str, object]


def _normalise(prefix: str) -> str:
    return prefix.strip().rstrip(".")


def allowed_prefixes(extra: Iterable[str] | None = None) -> tuple[str, ...]:
    """What trusted code allows beyond a root's own packages: the prefixes of :data:`ALLOWED_TARGETS_ENV`
    and ``extra``, each once.

    Each prefix must be a dotted module name (``my_project.models``); ``*``, ``.`` or an empty prefix is
    refused with a :class:`~hyper_parallel.errors.ConfigError` rather than silently matching nothing.
    Empty entries of the environment variable (``a,b,``) are skipped.
    """
    return _prefixes(os.environ.get(ALLOWED_TARGETS_ENV, ""), tuple(extra or ()))


@functools.lru_cache(maxsize=256)
def _prefixes(env: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    given = [(p, f"${ALLOWED_TARGETS_ENV}") for p in env.split(",") if p.strip()]
    given += [(p, "an allowed target prefix (--allow-target, allowed_targets=)") for p in extra]
    bad = [
        Issue("", f"{what} {echo(p)} is not a dotted module name such as 'my_project.models'")
        for p, what in given
        if not isinstance(p, str) or not all(s.isidentifier() for s in _normalise(p).split("."))
    ]
    if bad:
        raise ConfigError(bad)
    return tuple(dict.fromkeys(_normalise(p) for p, _ in given))


def _is_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in allowed)


def is_public(name: str) -> bool:
    """Whether no segment of dotted ``name`` is private (``_x``) or a dunder: the other half of the rule."""
    return not any(segment.startswith("_") for segment in name.split("."))


def target_rule(allowed: tuple[str, ...]) -> str:
    """What a ``_target_`` may name under ``allowed``, as refusals say it."""
    where = ", ".join(allowed) if allowed else "the allowed packages (none are allowed here)"
    return f"targets are Config classes and factories in public modules of {where} (no '_private' segment)"


def qualified_name(obj: object) -> str:
    """``module.QualName`` of a class or function, as a ``_target_`` names it."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"


def _kind_of(obj: object) -> str:
    if inspect.ismodule(obj):
        return "a module"
    if inspect.isbuiltin(obj) or isinstance(obj, types.BuiltinFunctionType):
        return "a builtin function"
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    if inspect.isfunction(obj):
        return "a function"
    return f"an instance of {type(obj).__qualname__}"


def _import(name: str, allowed: tuple[str, ...]) -> object:
    """The object dotted ``name`` reaches, importing modules on the way but never running a module's
    ``__getattr__`` (a package's lazy exports import their runtime)."""
    parts = name.split(".")
    try:
        obj: object = importlib.import_module(parts[0])
    except ModuleNotFoundError as exc:
        if exc.name == parts[0]:
            raise TargetError(f"cannot import {echo(name)}: no module named {parts[0]!r}") from None
        raise TargetError(f"cannot import {echo(name)}: {exc}") from None
    except Exception as exc:
        raise TargetError(f"importing {parts[0]!r} failed: {type(exc).__name__}: {exc}") from None
    done = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        here = f"{done}.{part}"
        if inspect.ismodule(obj):
            found = vars(obj).get(part, _MISSING)
            obj = _submodule(name, obj, part, allowed) if found is _MISSING else found
        elif hasattr(obj, part):
            obj = getattr(obj, part)
        else:
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise _no_attribute(f"{done!r}", parts, i, public)
        done = here
    return obj


class _Missing(TargetError):
    """A name that does not exist: ``plain`` says so, the message adds the closest name that does, which
    :func:`load_target` replaces with the list of targets where it is none."""

    def __init__(self, plain: str, close: str | None, suggestion: str | None) -> None:
        super().__init__(f"{plain}; did you mean {close!r}?" if close else plain, suggestion)
        self.plain = plain


def _no_attribute(owner: str, parts: list[str], i: int, public: list[str]) -> TargetError:
    """``owner`` has no attribute ``parts[i]``: the error, with the dotted name the closest one makes."""
    close = closest(parts[i], public)
    guess = ".".join([*parts[:i], close, *parts[i + 1 :]]) if close else None
    return _Missing(f"{owner} has no attribute {parts[i]!r}", close, guess)


def _submodule(name: str, module: types.ModuleType, part: str, allowed: tuple[str, ...]) -> object:
    """Submodule ``part`` of ``module`` (which does not define ``part``), or why ``name`` is refused."""
    here = f"{module.__name__}.{part}"
    try:
        return importlib.import_module(here)
    except ModuleNotFoundError as exc:
        if exc.name != here:
            raise TargetError(f"importing {here!r} failed: {exc}") from None
    except Exception as exc:
        raise TargetError(f"importing {here!r} failed: {type(exc).__name__}: {exc}") from None
    if "__getattr__" in vars(module):  # a lazy export: finding it would import what it loads
        raise TargetError(
            f"{echo(name)} is not a config target ({module.__name__!r} loads {part!r} only when it is "
            f"used): {target_rule(allowed)}"
        )
    public = [n for n in vars(module) if not n.startswith("_")]
    depth = module.__name__.count(".") + 1  # where ``part`` stands in ``name``
    raise _no_attribute(f"module {module.__name__!r}", name.split("."), depth, public)


_MISSING = object()


def check_target_name(name: str, allowed: tuple[str, ...], packages: tuple[str, ...] = ()) -> None:
    """Refuse ``name`` unless it is a dotted name that :func:`target_rule` allows; nothing is imported.

    A name in the project of the root's ``packages`` (``hyper_parallel.launch.main``) is a module that
    holds no targets; a name elsewhere is outside what trusted code allowed, which it may widen.
    """
    if len(name) > MAX_TARGET_LENGTH:
        raise TargetError(f"'_target_' is too long ({len(name)} characters)")
    parts = name.split(".")
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise TargetError(f"'_target_' must be a dotted name such as 'package.module.Name', got {echo(name)}")
    private = next((p for p in parts if p.startswith("_")), None)
    if private is not None:
        raise TargetError(
            f"{echo(name)} names a private or dunder segment ({private!r}), which is never a target: "
            f"{target_rule(allowed)}"
        )
    if _is_allowed(name, allowed):
        return
    # A typo in an allowed package is the likelier fix than widening the allowlist: say it first.
    close = _misspelled_prefix(parts, allowed)
    if any(p.partition(".")[0] == parts[0] for p in packages):
        hint = f" (did you mean {close!r}?)" if close else ""
        raise TargetError(f"{echo(name)} is not a config target{hint}: {target_rule(allowed)}")
    hint = f"; did you mean {close!r}? Otherwise, trusted code" if close else "; trusted code"
    raise TargetError(
        f"{echo(name)} is outside the allowed target prefixes ({', '.join(allowed)}){hint} can "
        f"allow more with allowed_targets=, --allow-target or ${ALLOWED_TARGETS_ENV}"
    )


def load_target(
    name: object, field_type: type, allowed: tuple[str, ...], *, packages: tuple[str, ...] = ()
) -> Target:
    """Check, import and classify ``name`` for a root field of type ``field_type``; nothing is called.

    ``allowed`` are the packages a target may be in (the root's config packages, then what trusted code
    allows); ``packages`` are the root's own, walked to list the choices when ``name`` is a base. Raises
    :class:`TargetError` with a user-facing message for anything that is not an allowed Config class
    deriving from ``field_type`` or an allowed, fully annotated factory declared to return one; a name
    outside the rule (:func:`target_rule`) is refused before anything is imported.
    """
    expected = (
        f"expected a Config class deriving from {field_type.__qualname__}, "
        f"or a factory function declared to return one"
    )
    if not isinstance(name, str):
        raise TargetError(f"'_target_' must be a dotted name (a string), got {echo(name)}")
    check_target_name(name, allowed, packages)
    try:
        obj = _import(name, allowed)
    except _Missing as exc:
        if exc.suggestion is not None and _fits(exc.suggestion, field_type, allowed):
            raise  # a close name that is a target is the better answer
        raise TargetError(f"{exc.plain}{_choices(field_type, allowed, packages)}") from None
    module = getattr(obj, "__module__", None)
    if (isinstance(obj, type) or inspect.isroutine(obj)) and not (
        isinstance(module, str) and _is_allowed(module, allowed)
    ):
        raise TargetError(
            f"{echo(name)} is defined in module {module!r}, outside the allowed target prefixes "
            f"({', '.join(allowed)})"
        )
    if isinstance(obj, type) and attrs.has(obj) and issubclass(obj, field_type):
        if is_abstract(obj):
            listed = (
                _choices(obj, allowed, packages)
                or "; name one of: a Config class deriving from it, or a factory returning one"
            )
            raise TargetError(f"{echo(name)} is a base class, not a target{listed}")
        return Target(qualified_name(obj), obj, False, {}, frozenset(), {})
    if inspect.isfunction(obj):
        return _factory(name, obj, field_type, expected)
    nested = getattr(obj, "Config", None) if isinstance(obj, type) else None
    if isinstance(nested, type) and attrs.has(nested) and issubclass(nested, field_type):
        # ``...AdamW`` for ``...AdamW.Config``: the component class, not the Config that builds it.
        raise TargetError(
            f"{echo(name)} is {_kind_of(obj)}; did you mean {name + '.Config'!r}?", name + ".Config"
        )
    if isinstance(obj, type) and issubclass(obj, field_type):
        raise TargetError(f"{echo(name)} is {_kind_of(obj)}, which is not an attrs Config class; {expected}")
    # another group's Config class: the list of this group's (a name that does not exist gets it too)
    listed = _choices(field_type, allowed, packages) if isinstance(obj, type) and attrs.has(obj) else ""
    raise TargetError(f"{echo(name)} is {_kind_of(obj)}; {expected}{listed}")


def _fits(name: str, field_type: type, allowed: tuple[str, ...]) -> bool:
    """Whether ``name`` (a guess) is a target of ``field_type``: a guess that is not (``'Literal'``, which a
    model module imports) is not said."""
    try:
        load_target(name, field_type, allowed)
    except TargetError:
        return False
    return True


def _misspelled_prefix(parts: list[str], allowed: tuple[str, ...]) -> str | None:
    """``name`` with its leading segments replaced by the allowed prefix they misspell most closely, or
    None. Each segment must be close to the prefix's; one that extends it (``hyper_parallelx``) is another
    package, not a typo."""
    import difflib  # only a mistake pays for it

    best, best_ratio = None, 0.0
    for prefix in allowed:
        want = prefix.split(".")
        head = parts[: len(want)]
        if len(parts) <= len(want) or head == want:
            continue
        if any(h != w and h.startswith(w) for h, w in zip(head, want, strict=True)):
            continue
        ratios = [difflib.SequenceMatcher(None, h, w).ratio() for h, w in zip(head, want, strict=True)]
        if min(ratios) >= 0.8 and sum(ratios) / len(ratios) > best_ratio:
            best, best_ratio = ".".join([prefix, *parts[len(want) :]]), sum(ratios) / len(ratios)
    return best


def _factory(name: str, fn: types.FunctionType, field_type: type, expected: str) -> Target:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise TargetError(f"cannot read the annotations of {echo(name)}: {exc}") from None
    returns = hints.get("return")
    if returns is None:
        raise TargetError(f"factory {echo(name)} declares no return type; {expected}")
    if not (isinstance(returns, type) and issubclass(returns, field_type)):
        shown = getattr(returns, "__qualname__", repr(returns))
        raise TargetError(f"factory {echo(name)} is declared to return {shown}; {expected}")
    params: dict[str, object] = {}
    defaults: dict[str, object] = {}
    required = set()
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            raise TargetError(
                f"factory {echo(name)} takes {param}, which a config file cannot name; "
                f"a factory takes named, annotated parameters only"
            )
        if param.name not in hints:
            raise TargetError(f"factory {echo(name)} leaves parameter {param.name!r} unannotated")
        params[param.name] = hints[param.name]
        if param.default is param.empty:
            required.add(param.name)
        else:
            defaults[param.name] = param.default
    return Target(
        qualified_name(fn),
        fn,
        True,
        types.MappingProxyType(params),
        frozenset(required),
        types.MappingProxyType(defaults),
    )


def is_abstract(cls: type) -> bool:
    """Whether ``cls`` is a base that no ``_target_`` may name: it declares :data:`ABSTRACT_MARKER` in its own
    body (subclasses do not inherit the mark), or it has abstract methods."""
    return bool(vars(cls).get(ABSTRACT_MARKER, False)) or inspect.isabstract(cls)


def _choices(field_type: type, allowed: tuple[str, ...], packages: tuple[str, ...]) -> str:
    """``; name one of: ...``, the targets that build ``field_type``, or ``""`` when none is found. Listing
    them imports the root's config packages (never a user package): only a mistake pays for it."""
    import_config_modules(packages)
    choices = [qualified_name(t) for t in discover_targets(field_type, allowed, walk=False)]
    return f"; name one of: {', '.join(choices)}" if choices else ""


def import_config_modules(packages: Iterable[str]) -> None:
    """Import every public module of ``packages`` (never a private one, nor anything under it)."""
    for name in packages:
        package = importlib.import_module(name)
        _import_public(getattr(package, "__path__", None), name)


def _import_public(path: Iterable[str] | None, prefix: str) -> None:
    if path is None:
        return
    import pkgutil  # only listing the targets of a package pays for it

    for info in pkgutil.iter_modules(path, prefix=f"{prefix}."):
        if is_public(info.name):
            module = importlib.import_module(info.name)
            if info.ispkg:
                _import_public(getattr(module, "__path__", None), info.name)


def _subclasses(cls: type) -> list[type]:
    out: list[type] = [cls]
    for known in out:  # the list grows while it is walked
        subs: list[type] = known.__subclasses__()
        out += [sub for sub in subs if sub not in out]
    return out


def _public(obj: object) -> bool:
    module, qualname = getattr(obj, "__module__", ""), getattr(obj, "__qualname__", "<")
    return is_public(module) and "<" not in qualname and not qualname.startswith("_")


def discover_targets(field_type: type, packages: Iterable[str], *, walk: bool = True) -> list[Any]:
    """Every concrete Config class and factory under ``packages`` that can build ``field_type``, by name.

    Only what a ``_target_`` could name is found: public modules of ``packages``. With ``walk``, every
    such module is imported first; without, only the modules imported already are searched. Bases
    (:func:`is_abstract`) are left out; factories are kept whatever they return.
    """
    prefixes = tuple(_normalise(p) for p in packages)
    if walk:
        import_config_modules(prefixes)
    found: dict[str, Any] = {}
    for cls in _subclasses(field_type):
        if attrs.has(cls) and _public(cls) and _is_allowed(cls.__module__, prefixes) and not is_abstract(cls):
            found[qualified_name(cls)] = cls
    for module_name, module in list(sys.modules.items()):
        if not (_is_allowed(module_name, prefixes) and is_public(module_name)):
            continue
        for value in list(vars(module).values()):
            if inspect.isfunction(value) and value.__module__ == module_name and _public(value):
                try:
                    returns = typing.get_type_hints(value).get("return")
                except Exception:
                    continue
                if isinstance(returns, type) and issubclass(returns, field_type):
                    found[qualified_name(value)] = value
    return [found[name] for name in sorted(found)]
