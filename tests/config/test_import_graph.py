"""The layers stay layers: the models, the techniques, the sections and the preflight sit below the trainer,
and no import circle grows past ``LARGEST_IMPORT_CYCLE`` modules.

Read from the source (``tests.support.import_graph``): every import statement counts, lazy and
``if TYPE_CHECKING:`` ones included, since each still ties the two modules together for a reader, for mypy
and for the next change. A module that needs a parameter section imports it from
``hyper_parallel.sections``, never from the trainer that re-exports it.
"""

from functools import cache
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.import_graph import import_graph, largest_cycle, reaches

PACKAGE = ROOT / "hyper_parallel"

#: Most modules one import circle of ``hyper_parallel`` may hold (lazy and type-only imports included).
#: What is left: ``components.peft`` <-> ``models`` (the models' weight loading asks the PEFT runtime which
#: tensors are adapters, the PEFT runtime asks the models for the parameter seed), which drags in each
#: model's package and runtime; issue 42 moves both facts below them, after which this can shrink.
LARGEST_IMPORT_CYCLE = 12

#: What the parameter sections may import of the project: the validators and the Config base, nothing else.
SECTIONS_MAY_IMPORT = frozenset({"hyper_parallel._checks", "hyper_parallel.config_base"})


@cache
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE)


def _under(*prefixes: str) -> list[str]:
    return sorted(m for m in graph() if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("module", _under("hyper_parallel.models"))
def test_no_model_module_imports_the_trainer(module: str) -> None:
    assert reaches(graph(), module, "hyper_parallel.trainer") == []


@pytest.mark.parametrize("module", _under("hyper_parallel.parallel", "hyper_parallel.sections"))
def test_neither_the_techniques_nor_the_sections_import_the_trainer(module: str) -> None:
    assert reaches(graph(), module, "hyper_parallel.trainer") == []


@pytest.mark.parametrize("module", _under("hyper_parallel.preflight"))
def test_the_preflight_imports_no_trainer(module: str) -> None:
    assert reaches(graph(), module, "hyper_parallel.trainer") == []


def test_the_sections_import_only_the_validators_and_the_config_base() -> None:
    assert graph()["hyper_parallel.sections"] <= SECTIONS_MAY_IMPORT


def test_no_import_cycle_is_larger_than_the_bound() -> None:
    cycle = largest_cycle(graph())
    assert len(cycle) <= LARGEST_IMPORT_CYCLE, (
        f"an import cycle of {len(cycle)} modules (at most {LARGEST_IMPORT_CYCLE}): " + ", ".join(cycle)
    )


# -- the walker itself --------------------------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_walker_counts_lazy_type_only_relative_and_submodule_imports(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import Thing\n",
            "high.py": "def f():\n    from . import low\n",
            "sub/__init__.py": "import importlib\nimportlib.import_module('pkg.low')\n",
            "sub/leaf.py": "from pkg.sub import leaf2\nfrom ..high import f\n",
            "sub/leaf2.py": "import os\n",
        },
    )
    assert import_graph(root) == {
        "pkg": set(),
        "pkg.low": {"pkg.high"},
        "pkg.high": {"pkg.low"},
        "pkg.sub": {"pkg.low"},
        "pkg.sub.leaf": {"pkg.sub.leaf2", "pkg.high"},
        "pkg.sub.leaf2": set(),
    }
    assert largest_cycle(import_graph(root)) == ["pkg.high", "pkg.low"]


def test_the_largest_cycle_is_every_module_that_reaches_every_other() -> None:
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": set()}
    assert largest_cycle(ring) == ["a", "b", "c"]
    assert largest_cycle({"a": set(), "b": {"a"}}) in (["a"], ["b"])
