"""The common base of every Config class the resolver builds: what each Config may say about itself.

The resolver asks a Config three things and nothing else: whether it is an abstract base (the
``__abstract__`` marker in a class's own body), what its fields say together (``cross_check``), and, at run
time, to ``build`` what it configures. A base gives the defaults once, so a Config with nothing to check
writes no ``cross_check`` and a base that cannot build writes no ``build`` that only raises.
"""

from collections.abc import Iterator
from typing import Any, ClassVar

import attrs

from hyper_parallel.config.attrs_validators import fast_validators

__all__ = ["ConfigBase"]


@attrs.frozen(kw_only=True, slots=False, field_transformer=fast_validators)
class ConfigBase:
    """Base of Config classes: no fields; no cross-field findings; ``build`` names the missing subclass."""

    #: A base: a config names one of its subclasses as ``_target_``, never this class. The marker counts
    #: only in the body of the class that declares it, so each abstract base declares its own.
    __abstract__: ClassVar[bool] = True

    def cross_check(self) -> Iterator[tuple[str, str]]:
        """Yield ``(relative field path, message)`` for settings that conflict; a plain Config has none."""
        yield from ()

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """What this Config configures; a base cannot build, so this names the subclasses to use."""
        kind = type(self).__qualname__
        raise NotImplementedError(
            f"{kind} is a base and cannot build anything; name one of its implementations as _target_"
        )
