"""A public factory that records its own call, so that what it returns dumps as that call.

Kept apart from :mod:`hyper_parallel.config.recipes`, and outside the config package, because the model
packages decorate their factories at import: importing a model must not load the config layer's machinery
(targets, validation, recipes), only this module. The recipe is made on the first call, by the module that
holds recipes.
"""

import functools
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["records_call", "undecorated"]

F = TypeVar("F", bound=Callable[..., Any])


def records_call(factory: F) -> F:
    """Decorate a public factory so that its result carries the call that made it, whoever calls it.

    ``TrainerConfig(model=create_model_spec(flavor="debugmodel"))`` built in Python then dumps as that
    call and loads back to an equal config, exactly as a config naming the factory in ``_target_`` does.
    The resolver calls the undecorated function (``__wrapped__``) and records the call itself, with where
    each argument was set. The signature is inspected on the first call, not at import.
    """
    signature: Any = None
    name = f"{factory.__module__}.{factory.__qualname__}"

    @functools.wraps(factory)
    def recording(*args: Any, **kwargs: Any) -> Any:
        nonlocal signature
        from hyper_parallel.config.recipes import Recipe, remember  # the config layer, on first use only

        result = factory(*args, **kwargs)
        if signature is None:
            import inspect  # the first call from Python pays for it, never a resolve

            signature = inspect.signature(factory)
        bound = signature.bind(*args, **kwargs)
        given: dict[str, str | None] = dict.fromkeys(bound.arguments)
        bound.apply_defaults()
        remember(result, Recipe(name, dict(bound.arguments), recording, given))
        return result

    recording.__records_call__ = True  # type: ignore[attr-defined]
    return typing.cast(F, recording)


def undecorated(factory: Callable[..., Any]) -> Callable[..., Any]:
    """The function :func:`records_call` wraps, or ``factory`` itself (what the resolver calls)."""
    wrapped = getattr(factory, "__wrapped__", None) if getattr(factory, "__records_call__", False) else None
    return wrapped if wrapped is not None else factory
