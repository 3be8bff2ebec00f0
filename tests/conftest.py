"""Every test that starts processes carries the ``multiprocess`` marker and ends within a bound.

A test that starts processes (``subprocess``, ``torchrun``, an in-process ``spawn``, DataLoader workers) is
marked ``multiprocess``; select them with ``-m multiprocess`` or leave them out with
``-m "not multiprocess"``. Each such test without its own ``@pytest.mark.timeout(N)`` gets
``MULTIPROCESS_TIMEOUT`` (pytest-timeout, the ``test`` extra), so a hang fails that test instead of the run.
The runners of ``tests/support/processes.py`` stop the processes they started when that happens.
"""

from __future__ import annotations

import pytest

#: Seconds a multi-process test without its own ``timeout`` marker may take: the command-line runs take a
#: few seconds each on a loaded 2-core machine. Tests under torchrun or spawn carry their own, larger bound.
MULTIPROCESS_TIMEOUT = 120


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(MULTIPROCESS_TIMEOUT))
