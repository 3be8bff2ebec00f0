"""How a factory-built root value was made, so that it can be written back as the same call.

A factory's result (a ``ModelSpec``) is a frozen, slotted value that cannot carry its recipe, so recipes are
kept beside results in an identity map whose entries go away with the result.
"""

import typing
from collections.abc import Callable, Mapping
from typing import Any

from hyper_parallel.config.identity import IdentityMap

__all__ = ["Recipe", "recipe_of", "remember"]


class Recipe(typing.NamedTuple):
    """How a factory-built root value was made: the factory, its dotted name and its checked arguments."""

    #: Canonical dotted name of the factory.
    target: str
    #: Every parameter's value, as structured.
    args: Mapping[str, Any]
    #: The factory function itself.
    factory: Callable[..., Any]


_RECIPES: IdentityMap[Recipe] = IdentityMap()


def remember(result: object, recipe: Recipe) -> None:
    """Record that ``recipe`` built ``result``."""
    _RECIPES.set(result, recipe)


def recipe_of(obj: object) -> Recipe | None:
    """The recipe of a value a factory built during a resolve, or None."""
    return _RECIPES.get(obj)
