"""Per-call settings of a resolve: which target prefixes are trusted and how problems are located.

``converter.structure(raw, TrainerConfig)`` takes no extra arguments (it is cattrs' signature), so callers
that know more (``load_config`` knows the file, ``--allow-target`` widens the allowlist) set these options
in a context variable for the duration of the call; threads and nested calls each see their own.
"""

import contextlib
import contextvars
import typing
from collections.abc import Iterable, Iterator

from hyper_parallel.config.targets import allowed_prefixes
from hyper_parallel.config.validation import Locate

__all__ = ["ResolveOptions", "current_options", "resolve_options"]


class ResolveOptions(typing.NamedTuple):
    """Per-call settings of a resolve."""

    #: Module prefixes trusted code allows targets under, beyond the root's own packages.
    allowed: tuple[str, ...]
    #: Maps a problem to its source location.
    locate: Locate | None = None
    #: Whether the root's own ``cross_check`` runs when the root is built; a caller that runs the root's
    #: rules itself afterwards, with more of them (the world size, the trainer), turns it off so that every
    #: rule reports in one pass.
    root_checks: bool = True


_OPTIONS: contextvars.ContextVar[ResolveOptions | None] = contextvars.ContextVar(
    "resolve_options", default=None
)


@contextlib.contextmanager
def resolve_options(
    *,
    allowed_targets: Iterable[str] | None = None,
    locate: Locate | None = None,
    root_checks: bool | None = None,
) -> Iterator[ResolveOptions]:
    """Set the allowed target prefixes and the source locator for resolves in this context.

    What is not given is inherited from an enclosing context, so a nested call never loses its caller's
    allowlist or locations.
    """
    outer = _OPTIONS.get()
    allowed = (
        outer.allowed if allowed_targets is None and outer is not None else allowed_prefixes(allowed_targets)
    )
    if root_checks is None:
        root_checks = outer.root_checks if outer is not None else True
    options = ResolveOptions(allowed, locate or (outer.locate if outer else None), root_checks)
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


def current_options() -> ResolveOptions:
    """The options of the enclosing :func:`resolve_options`, or the defaults."""
    return _OPTIONS.get() or ResolveOptions(allowed_prefixes())
