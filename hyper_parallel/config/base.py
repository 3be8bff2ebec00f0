"""The common base of every Config class the resolver builds: what each Config may say about itself.

The resolver asks a Config three things and nothing else: whether it is an abstract base (the
``__abstract__`` marker in a class's own body), what its fields say together (``cross_check``), and, at run
time, to ``build`` what it configures. A base gives the defaults once, so a Config with nothing to check
writes no ``cross_check`` and a base that cannot build writes no ``build`` that only raises.

How a Config class is made, once for all of them, because every command that reads a config pays for it
(a ``--dry-run`` makes some forty classes, a resolve constructs seventeen objects):

- ``@attrs.frozen(kw_only=True, slots=False, field_transformer=fast_validators)``: frozen, keyword-only;
  an instance keeps its fields in a ``__dict__``, which a frozen class writes directly where a slotted one
  goes through ``object.__setattr__`` per field (a third of constructing it); each field's attrs validator
  is checked by one plain function (:func:`~hyper_parallel.config.attrs_validators.fast_validators`).
- The repr, the equality and the hash are this base's :func:`config_repr`, :func:`config_eq` and
  :func:`config_hash` (attrs' own format, fields and ``eq_key``), given to each subclass as it is created,
  so that attrs, which writes no method a class has itself, compiles none: writing and compiling them per
  class was a fifth of a cold ``--dry-run``. Only ``__init__`` stays attrs' own, compiled per class (a warm
  resolve stores a sound mapping's fields as that ``__init__`` does, see
  :mod:`~hyper_parallel.config.attrs_init`); comparing two configs is rare and not worth a compile each.
"""

from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

import attrs
from typing_extensions import dataclass_transform

from hyper_parallel.config.attrs_validators import fast_validators

T = TypeVar("T")

__all__ = ["ConfigBase", "config_class", "config_eq", "config_hash", "config_repr"]


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(attrs.field,))
def config_class(cls: type[T]) -> type[T]:
    """Make ``cls`` a Config class: frozen and keyword-only, with the settings every Config class shares."""
    return attrs.frozen(kw_only=True, slots=False, field_transformer=fast_validators)(cls)


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


@attrs.frozen(kw_only=True, slots=False, field_transformer=fast_validators)
class ConfigBase:
    """Base of Config classes: no fields; no cross-field findings; ``build`` names the missing subclass."""

    #: A base: a config names one of its subclasses as ``_target_``, never this class. The marker counts
    #: only in the body of the class that declares it, so each abstract base declares its own.
    __abstract__: ClassVar[bool] = True

    __repr__ = config_repr
    __eq__ = config_eq
    __hash__ = config_hash

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # attrs then writes none of them (its auto-detection keeps a method the class has); a class that
        # writes its own keeps it
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = config_repr  # type: ignore[method-assign,assignment]
        if "__eq__" not in cls.__dict__ and "__ne__" not in cls.__dict__:
            cls.__eq__ = config_eq  # type: ignore[method-assign,assignment]
        if "__hash__" not in cls.__dict__:
            cls.__hash__ = config_hash  # type: ignore[method-assign,assignment]

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(relative field path, message)`` for settings that conflict; a plain Config has none."""
        yield from ()

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """What this Config configures; a base cannot build, so this names the subclasses to use."""
        kind = type(self).__qualname__
        raise NotImplementedError(
            f"{kind} is a base and cannot build anything; name one of its implementations as _target_"
        )
