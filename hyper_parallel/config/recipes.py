"""How a factory-built root group was made, and which values of a resolved config the user set.

Two facts are kept about a resolved config:

* A factory's result (a ``ModelSpec``) carries its :class:`Recipe`, the factory call that made it, so that
  it can be written back as that call and overridden by re-running it. The recipe is stored on the value
  itself, in an attrs field named :data:`RECIPE_FIELD` that the result's class declares with
  ``init=False, eq=False`` (``ModelSpec.recipe``): it survives ``copy.copy``, ``copy.deepcopy`` and
  ``pickle``, never takes part in equality, and is dropped by ``attrs.evolve`` (whose result the recipe no
  longer describes). A result whose class declares no such field keeps it in its instance ``__dict__``.
* Every root config the resolver builds is marked with what the user gave in each group (:class:`Given`):
  the fields present in the document or set by an override, each with where it was set. A ``_target_``
  switch keeps exactly those. A factory's own record (``Recipe.given``) is part of its recipe, so it
  travels with the value; the root's record is kept on the root, in its instance ``__dict__`` beside the
  fields (so copies and pickles keep it), and a root built in Python (``attrs.evolve`` included) has
  none: each of its Config groups then counts as set every field whose
  value differs from the class default (attrs cannot tell a default from the same value passed
  explicitly), and its factory groups what their recipes say.
"""

import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from hyper_parallel.config.validation import Locate, Problem

__all__ = [
    "RECIPE_FIELD",
    "Given",
    "GivenParts",
    "Recipe",
    "carries_recipe",
    "given_of",
    "recipe_of",
    "remember",
    "remember_given",
]

F = TypeVar("F", bound=Callable[..., Any])
V = TypeVar("V")

#: Name of the attrs field (``init=False, eq=False``) in which a factory's result carries its recipe.
RECIPE_FIELD = "recipe"


class Recipe(typing.NamedTuple):
    """How a factory-built root value was made: the factory, its dotted name and its checked arguments."""

    #: Canonical dotted name of the factory.
    target: str
    #: Every parameter's value, as structured.
    args: Mapping[str, Any]
    #: The factory function itself.
    factory: Callable[..., Any]
    #: The parameters the user gave (the others took the factory's defaults), each with where it was set
    #: (``configs/x.yaml:3:3``, ``--model.flavor``; None where that is not known).
    given: Mapping[str, str | None] = {}


class Given:
    """What the user set in each group of one resolved root config, and where each value was set.

    ``where(group, name)`` is looked up in ``origins`` first, then asked of ``locate`` (the locator of the
    resolve that made the config, over the source map of its document), so a resolve pays for a location
    only when a message needs one.
    """

    __slots__ = ("locate", "names", "origins", "unrecorded")

    def __init__(
        self,
        names: Mapping[str, frozenset[str]],
        origins: Mapping[tuple[str, str], str | None] | None = None,
        locate: Locate | None = None,
        unrecorded: frozenset[str] = frozenset(),
    ) -> None:
        #: The fields (or factory parameters) the user set, by group (``_target_`` may be among them); a
        #: group not named set nothing, unless it is ``unrecorded``.
        self.names = names
        #: Known locations, by ``(group, name)``.
        self.origins: Mapping[tuple[str, str], str | None] = origins or {}
        #: Finds the location of a value not in ``origins``.
        self.locate = locate
        #: Groups whose values were set in Python: each value other than its default counts as set.
        self.unrecorded = unrecorded

    def __getstate__(self) -> "GivenParts":
        """A pickle holds what was set; the locator (a closure over the source map of a resolve) stays
        behind, so a value known only to it has no location there."""
        return (self.names, self.origins, self.unrecorded)

    def __setstate__(self, state: "GivenParts") -> None:
        self.names, self.origins, self.unrecorded = state
        self.locate = None

    def where(self, group: str, name: str) -> str | None:
        """Where ``group.name`` was set (a file position or an override's origin), or None if not known."""
        key = (group, name)
        if key in self.origins:
            return self.origins[key]
        return self.locate(Problem(key, "", "key")) if self.locate is not None else None


#: What a :class:`Given` is made of: names by group, origins by ``(group, name)``, unrecorded groups.
GivenParts = tuple[Mapping[str, frozenset[str]], Mapping[tuple[str, str], str | None], frozenset[str]]


#: Name of the instance attribute holding the record of a resolved root (:class:`Given`), or the recipe of a
#: factory's result whose class declares no recipe field. Kept in the instance ``__dict__``, beside the
#: fields: attrs compares, hashes and prints only fields, and ``attrs.evolve`` (a new value) drops it.
_RECORD = "__hyper_parallel_record__"


#: Whether each class seen has a recipe field (classes live as long as the process; there are few).
_CARRIES: dict[type, bool] = {}


def _carries_recipe(cls: type) -> bool:
    """Whether instances of ``cls`` have a recipe field (attrs, ``init=False``) to hold their recipe."""
    found = _CARRIES.get(cls)
    if found is None:
        field = attrs.fields_dict(cls).get(RECIPE_FIELD) if attrs.has(cls) else None
        found = _CARRIES[cls] = field is not None and not field.init
    return found


def _note(obj: object, value: object) -> None:
    """Keep ``value`` on ``obj`` (a fresh value nobody has seen yet); an object without an instance
    ``__dict__`` (a slotted class) keeps no record, and is then treated as built in Python."""
    if hasattr(obj, "__dict__"):
        object.__setattr__(obj, _RECORD, value)


def _noted(obj: object, kind: type[V]) -> V | None:
    found = getattr(obj, "__dict__", {}).get(_RECORD)
    return found if isinstance(found, kind) else None


def remember(result: object, recipe: Recipe) -> None:
    """Record that ``recipe`` built ``result``: in its recipe field when its class has one."""
    if _carries_recipe(type(result)):
        object.__setattr__(result, RECIPE_FIELD, recipe)  # a fresh result: nobody has seen it yet
    else:
        _note(result, recipe)


def recipe_of(obj: object) -> Recipe | None:
    """The factory call that made ``obj`` during a resolve, or None (a Config instance, a hand-built spec)."""
    if _carries_recipe(type(obj)):
        recipe = getattr(obj, RECIPE_FIELD)
        return recipe if isinstance(recipe, Recipe) else None
    return _noted(obj, Recipe)


def carries_recipe(obj: object) -> bool:
    """Whether ``obj``'s class is made by factories (it declares a recipe field), built that way or not."""
    return _carries_recipe(type(obj))


def remember_given(root: object, given: Given) -> None:
    """Record on ``root``, a resolved root config, what the user set in its groups."""
    _note(root, given)


def given_of(root: object) -> Given | None:
    """What the user set in ``root``'s groups, or None when there is no record (built in Python, evolved)."""
    return _noted(root, Given)
