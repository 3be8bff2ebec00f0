"""Every test that starts processes carries the ``multiprocess`` marker and ends within a bound.

A test that starts processes (``subprocess``, ``torchrun``, an in-process ``spawn``, DataLoader workers) is
marked ``multiprocess``; select them with ``-m multiprocess`` or leave them out with
``-m "not multiprocess"``. Each such test without its own ``@pytest.mark.timeout(N)`` gets
``MULTIPROCESS_TIMEOUT`` (pytest-timeout, the ``test`` extra), so a hang fails that test instead of the run.
The runners of ``tests/support/processes.py`` stop the processes they started when that happens.

A test marked ``cuda`` needs a CUDA device and skips without one; ``python -m bench gpu --check`` runs them
on a GPU.

The test process runs one intra-op thread, as the processes it starts do (``processes.clean_env``): the
models are tiny, so a second thread buys nothing and costs a synchronisation per operator, and on a loaded
2-core machine a thread that spins waiting for a busy core made a file of in-process training tests 5x
slower (149 s against 31 s for ``tests/trainer/test_trainer.py``). It is set before torch is imported; the
trainer reads it as any run's ``OMP_NUM_THREADS``.

``HF_HUB_OFFLINE`` is set for the test process and every process it starts: nothing asks the Hub.

Once every test module is imported, the objects alive (torch, transformers, the modules and their
classes: hundreds of thousands) are moved out of the garbage collector's sight (``gc.freeze``): the trainer
runs a full collection when training starts, which otherwise scanned the whole test process every time.
"""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The suite never contacts the Hugging Face Hub: a path of Hub id shape that is no folder (a shipped
# config's runs/qwen3_5_debug_hf) is looked up in the cache only; tests of the Hub write their cache
# (tests/support/hub.py) or stand in for the Hub's answers.
os.environ["HF_HUB_OFFLINE"] = "1"

#: Seconds a multi-process test without its own ``timeout`` marker may take: the command-line runs take a
#: few seconds each on a loaded 2-core machine. Tests under torchrun or spawn carry their own, larger bound.
MULTIPROCESS_TIMEOUT = 120


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


def _cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (imported only when a ``cuda`` test is collected)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    cuda = None
    for item in items:
        if item.get_closest_marker("cuda"):
            cuda = _cuda_available() if cuda is None else cuda
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        if item.get_closest_marker("multiprocess") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(MULTIPROCESS_TIMEOUT))
