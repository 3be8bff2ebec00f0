"""The test suite's own rules, read from its source: where tests live, what they share, which start processes.

- Test modules live in the folder of the area they exercise; ``tests/`` itself holds only this module.
- No test module imports another: what tests share lives in ``tests/support``.
- A test that starts processes (``subprocess``, the ``tests.support.processes`` runners, torch's spawn)
  carries the ``multiprocess`` marker, which gives it a timeout (``tests/conftest.py``). A test counts as
  starting processes when it, a fixture it takes or a function of its module that it reaches does.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
AREAS = ("cli", "components", "config", "models", "parallel", "preflight", "trainer")
_SUBPROCESS = ("run", "Popen", "call", "check_call", "check_output")
_RUNNERS = ("torchrun", "torchrun_nodes", "spawn", "start_processes")


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _starts_directly(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            if sub.value.id == "subprocess" and sub.attr in _SUBPROCESS:
                return True
            if sub.attr in _RUNNERS and "multiprocessing" in sub.value.id:
                return True
        if isinstance(sub, ast.Attribute) and sub.attr in _RUNNERS and "multiprocessing" in ast.unparse(sub):
            return True
        if isinstance(sub, ast.Name) and sub.id in _RUNNERS:
            return True
    return False


def _process_starting_functions(tree: ast.Module) -> set[str]:
    """Top-level functions that start processes, directly or through another one of the module."""
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    starting = {name for name, node in functions.items() if _starts_directly(node)}
    grew = True
    while grew:
        grew = False
        for name, node in functions.items():
            if name in starting:
                continue
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if isinstance(node, ast.FunctionDef):
                used |= {a.arg for a in node.args.args}  # fixtures it takes
            if used & starting:
                starting.add(name)
                grew = True
    return starting


def _marks(decorators: list[ast.expr]) -> str:
    return " ".join(ast.unparse(d) for d in decorators)


def _module_marks(tree: ast.Module) -> str:
    return " ".join(
        ast.unparse(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
    )


def _unmarked_process_tests() -> Iterator[str]:
    for path in _test_modules():
        tree = _tree(path)
        module_marked = "multiprocess" in _module_marks(tree)
        starting = _process_starting_functions(tree)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            if (
                node.name in starting
                and not module_marked
                and "multiprocess" not in _marks(node.decorator_list)
            ):
                yield f"{path.relative_to(TESTS)}::{node.name}"


def test_test_modules_live_in_their_area_folder() -> None:
    misplaced = [
        str(p.relative_to(TESTS))
        for p in _test_modules()
        if p != Path(__file__).resolve() and p.relative_to(TESTS).parts[0] not in AREAS
    ]
    assert misplaced == []
    assert all((TESTS / area / "__init__.py").is_file() for area in (*AREAS, "support"))


def _imported_modules(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_test_module_imports_another() -> None:
    imports = {
        str(path.relative_to(TESTS)): sorted(
            name
            for name in _imported_modules(_tree(path))
            if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")
        )
        for path in _test_modules()
    }
    assert {path: names for path, names in imports.items() if names} == {}, "share through tests/support"


def test_every_test_that_starts_processes_is_marked_multiprocess() -> None:
    assert list(_unmarked_process_tests()) == []
