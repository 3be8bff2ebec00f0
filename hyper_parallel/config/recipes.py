"""How a factory-built root group was made: the factory call its result carries.

A factory's result (a ``ModelSpec``) carries its :class:`Recipe`, the factory call that made it, so that it
can be written back as that call and overridden by re-running it. The recipe is stored on the value itself,
in an attrs field named :data:`RECIPE_FIELD` that the result's class declares with ``init=False,
eq=False`` (``ModelSpec.recipe``): it survives ``copy.copy``, ``copy.deepcopy`` and ``pickle``, never takes
part in equality, and is dropped by ``attrs.evolve`` (whose result the recipe no longer describes). A result
whose class declares no such field keeps no recipe: it is a value built in Python. What the user set in a
resolved config, and where, is not kept on the config: the report of the resolve holds it
(:class:`~hyper_parallel.config.manager.ConfigReport`: the paths given and the locator over the source map
and the overrides), and a recipe holds its own arguments' (``Recipe.given``).
"""

import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["RECIPE_FIELD", "Recipe", "carries_recipe", "recipe_of", "remember"]

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


#: Whether each class seen has a recipe field (classes live as long as the process; there are few).
_CARRIES: dict[type, bool] = {}


def carries_recipe(obj: object) -> bool:
    """Whether ``obj``'s class is made by factories: it declares a recipe field (attrs, ``init=False``) to
    hold the recipe, whether this instance was built that way or not."""
    cls = type(obj)
    found = _CARRIES.get(cls)
    if found is None:
        field = attrs.fields_dict(cls).get(RECIPE_FIELD) if attrs.has(cls) else None
        found = _CARRIES[cls] = field is not None and not field.init
    return found


def remember(result: object, recipe: Recipe) -> None:
    """Record that ``recipe`` built ``result``, in its recipe field (a class without one keeps none)."""
    if carries_recipe(result):
        object.__setattr__(result, RECIPE_FIELD, recipe)  # a fresh result: nobody has seen it yet


def recipe_of(obj: object) -> Recipe | None:
    """The factory call that made ``obj`` during a resolve, or None (a Config instance, a hand-built spec)."""
    recipe = getattr(obj, RECIPE_FIELD) if carries_recipe(obj) else None
    return recipe if isinstance(recipe, Recipe) else None
