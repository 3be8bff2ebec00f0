"""The common base of every Config class the resolver builds: what each Config may say about itself.

The resolver asks a Config three things and nothing else: whether it is an abstract base (the
``__abstract__`` marker in a class's own body), what its fields say together (``cross_check``), and, at run
time, to ``build`` what it configures. A base gives the defaults once, so a Config with nothing to check
writes no ``cross_check`` and a base that cannot build writes no ``build`` that only raises.

Every Config class is made by one decorator, :func:`config_class`: attrs' ``frozen`` (keyword-only, the
fields in an instance ``__dict__``), with ``repr=False, eq=False`` so that attrs writes no repr, equality or
hash per class and each class inherits this base's, which give attrs' own format and semantics (the fields
attrs shows and compares, their ``eq_key``). Writing and compiling those three methods for each of the
forty classes a ``--dry-run`` imports was a tenth of its start-up. ``__init__`` and validators are attrs'
own.
"""

from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

import attrs
from typing_extensions import dataclass_transform

T = TypeVar("T")

__all__ = ["ConfigBase", "config_class", "config_eq", "config_hash", "config_repr"]


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(attrs.field,))
def config_class(cls: type[T]) -> type[T]:
    """Make ``cls`` a Config class: frozen and keyword-only, its repr, equality and hash :class:`ConfigBase`'s
    (a class that writes its own keeps it)."""
    return attrs.frozen(kw_only=True, slots=False, repr=False, eq=False)(cls)


def config_repr(self: object) -> str:
    """``AdamW.Config(lr=0.0003, ...)``: attrs' repr (the fields it shows, their own ``repr=`` if any),
    one function for every Config class."""
    shown = []
    for f in attrs.fields(type(self)):  # type: ignore[arg-type]
        if f.repr:
            value = getattr(self, f.name)
            shown.append(f"{f.name}={f.repr(value) if callable(f.repr) else repr(value)}")
    return f"{type(self).__qualname__.rsplit('>.', 1)[-1]}({', '.join(shown)})"


def _compared(obj: object, hashed: bool = False) -> tuple[object, ...]:
    """The values of the fields attrs compares (``eq=``), or hashes (``hash=``, else ``eq=``), each through
    its ``eq_key`` if any."""
    return tuple(
        f.eq_key(getattr(obj, f.name)) if f.eq_key is not None else getattr(obj, f.name)
        for f in attrs.fields(type(obj))  # type: ignore[arg-type]
        if (f.hash if hashed and f.hash is not None else f.eq)
    )


def config_hash(self: object) -> int:
    """attrs' hash of a frozen class: its type and the fields it hashes, so that equal Configs hash alike;
    one function for every Config class."""
    return hash((type(self), *_compared(self, hashed=True)))


def config_eq(self: object, other: object) -> bool:
    """attrs' equality: ``NotImplemented`` for another class, else the tuples of the fields it compares
    (``eq=``, through their ``eq_key`` if any), one function for every Config class."""
    if other.__class__ is not self.__class__:
        return NotImplemented  # type: ignore[no-any-return]  # typeshed: Any outside a class body
    return _compared(self) == _compared(other)


# config_class's settings, spelled out here so that mypy's attrs plugin sees every Config class as attrs'
@attrs.frozen(kw_only=True, slots=False, repr=False, eq=False)
class ConfigBase:
    """Base of Config classes: no fields; no cross-field findings; ``build`` names the missing subclass."""

    #: A base: a config names one of its subclasses as ``_target_``, never this class. The marker counts
    #: only in the body of the class that declares it, so each abstract base declares its own.
    __abstract__: ClassVar[bool] = True

    __repr__ = config_repr
    __eq__ = config_eq
    __hash__ = config_hash

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(relative field path, message)`` for settings that conflict; a plain Config has none."""
        yield from ()

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """What this Config configures; a base cannot build, so this names the subclasses to use."""
        kind = type(self).__qualname__
        raise NotImplementedError(
            f"{kind} is a base and cannot build anything; name one of its implementations as _target_"
        )
