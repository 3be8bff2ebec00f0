"""One converter whose root is ``KindsRoot``, shared by the tests of every field kind.

The shipped converter's root is ``TrainerConfig``; the type-rule tests need a root holding the
``rule_targets`` classes, and sharing one instance lets them check that its hooks are built only once.
"""

from hyper_parallel.config.conversion import ConfigConverter
from tests.support.rule_targets import KindsRoot

__all__ = ["CONV"]

CONV = ConfigConverter()
CONV.register_root(KindsRoot)
