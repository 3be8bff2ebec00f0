"""How a root group's value was made, and which of its fields the user set.

Two facts travel with a resolved group value:

* A factory's result (a ``ModelSpec``) carries its :class:`Recipe`, the factory call that made it, so that
  it can be written back as that call and overridden by re-running it. The recipe is stored on the value
  itself, in an attrs field named :data:`RECIPE_FIELD` that the result's class declares with
  ``init=False, eq=False`` (``ModelSpec.recipe``): it survives ``copy.copy``, ``copy.deepcopy`` and
  ``pickle``, never takes part in equality, and is dropped by ``attrs.evolve`` (whose result the recipe no
  longer describes). A result whose class declares no such field keeps its recipe by identity, beside it.
* Every group value the resolver builds is marked with what the user gave (:class:`Given`): the fields (or
  factory parameters) present in the document or set by an override, each with where it was set. A
  ``_target_`` switch keeps exactly those. A factory's ``Given`` is part of its recipe, so it travels too;
  a Config class instance (frozen, slotted, declared by components) cannot carry it, so it is kept by
  identity and a copy forgets it. A value with no record (built in Python, or a copy) counts as given in
  every field whose value differs from the class default.
"""

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from hyper_parallel.config.identity import IdentityMap

__all__ = [
    "RECIPE_FIELD",
    "Given",
    "Recipe",
    "carries_recipe",
    "given_of",
    "recipe_of",
    "remember",
    "remember_given",
]

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
    """The fields of one group value the user set, and where each was set.

    ``where(name)`` is looked up in ``origins`` first, then asked of ``locate`` (a closure over the source
    map of the document the value came from), so a resolve pays for a location only when a message needs
    one.
    """

    __slots__ = ("locate", "names", "origins")

    def __init__(
        self,
        names: Iterable[str],
        origins: Mapping[str, str | None] | None = None,
        locate: Callable[[str], str | None] | None = None,
    ) -> None:
        #: The names the user set.
        self.names = frozenset(names)
        #: Known locations, by name.
        self.origins: Mapping[str, str | None] = origins or {}
        #: Finds the location of a name not in ``origins``.
        self.locate = locate

    def where(self, name: str) -> str | None:
        """Where ``name`` was set (a file position or an override's origin), or None if not known."""
        if name in self.origins:
            return self.origins[name]
        return self.locate(name) if self.locate is not None else None


_RECIPES: IdentityMap[Recipe] = IdentityMap()
_GIVEN: IdentityMap[Given] = IdentityMap()


#: Whether each class seen has a recipe field (classes live as long as the process; there are few).
_CARRIES: dict[type, bool] = {}


def _carries_recipe(cls: type) -> bool:
    """Whether instances of ``cls`` have a recipe field (attrs, ``init=False``) to hold their recipe."""
    found = _CARRIES.get(cls)
    if found is None:
        field = attrs.fields_dict(cls).get(RECIPE_FIELD) if attrs.has(cls) else None
        found = _CARRIES[cls] = field is not None and not field.init
    return found


def remember(result: object, recipe: Recipe) -> None:
    """Record that ``recipe`` built ``result``: on the value when its class has a recipe field."""
    if _carries_recipe(type(result)):
        object.__setattr__(result, RECIPE_FIELD, recipe)  # a fresh result: nobody has seen it yet
    else:
        _RECIPES.set(result, recipe)


def recipe_of(obj: object) -> Recipe | None:
    """The factory call that made ``obj`` during a resolve, or None (a Config instance, a hand-built spec)."""
    if _carries_recipe(type(obj)):
        recipe = getattr(obj, RECIPE_FIELD)
        return recipe if isinstance(recipe, Recipe) else None
    return _RECIPES.get(obj)


def carries_recipe(obj: object) -> bool:
    """Whether ``obj``'s class is made by factories (it declares a recipe field), built that way or not."""
    return _carries_recipe(type(obj))


def remember_given(value: object, given: Given) -> None:
    """Record what the user set in ``value`` (a factory's result: in its recipe, with every location)."""
    recipe = recipe_of(value)
    if recipe is not None:
        remember(value, recipe._replace(given={name: given.where(name) for name in sorted(given.names)}))
    else:
        _GIVEN.set(value, given)


def given_of(value: object) -> Given | None:
    """What the user set in ``value``, or None when there is no record (built in Python, or a copy)."""
    recipe = recipe_of(value)
    if recipe is not None:
        return Given(recipe.given, recipe.given)
    return _GIVEN.get(value)
