"""A test-only target module that records being imported (module-level side effect).

Tests prove that a ``_target_`` naming this module while ``tests.`` is not allowed leaves it unimported:
importing it appends to :data:`MARK_ENV`, and it appears in ``sys.modules``.
"""

import os

import attrs

from hyper_parallel.components.optimizer import Optimizer

#: Environment variable this module appends ``imported;`` to when it is imported.
MARK_ENV = "HP_TEST_IMPORT_RECORDER"

os.environ[MARK_ENV] = os.environ.get(MARK_ENV, "") + "imported;"


@attrs.frozen(kw_only=True)
class RecorderOptimizerConfig(Optimizer.Config):
    """A valid optimizer Config, so that allowing ``tests.`` makes the same document resolve."""
