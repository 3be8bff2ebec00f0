"""``hyper_parallel.parallel`` owns the distributed techniques: one mesh builder, no torch at package import.

Checked on the source tree (every module, lazy imports included) and in a fresh process, so a second mesh
builder or a torch import creeping into the package surface fails here rather than as a layout that
differs between the trainer and the tests.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hyper_parallel"


def _calls_to(name: str) -> list[str]:
    """``file:function`` of every call to ``name`` (as ``name(...)`` or ``x.name(...)``) in the package."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call):
                    callee = node.func
                    called = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", None)
                    if called == name:
                        found.append(f"{path.relative_to(REPO).as_posix()}:{func.name}")
    return sorted(set(found))


def test_exactly_one_function_builds_device_meshes() -> None:
    assert _calls_to("init_device_mesh") == ["hyper_parallel/parallel/parallel_dims.py:build_mesh"]
    assert _calls_to("DeviceMesh") == []


def test_no_module_reaches_into_a_private_module_of_parallel_or_models() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        owner = path.relative_to(PACKAGE).parts[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module
                names = [f"{module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if len(parts) < 3 or parts[0] != "hyper_parallel" or parts[1] == owner:
                    continue
                if parts[1] not in ("parallel", "models"):
                    continue
                private = [p for p in parts[2:] if p.startswith("_")]
                assert not private, f"{path.relative_to(REPO)} imports the private {name}"


_PROBE = """
import json, sys
import hyper_parallel.parallel as parallel
print(json.dumps({"torch": "torch" in sys.modules, "trainer": "hyper_parallel.trainer" in sys.modules}))
"""


@pytest.mark.multiprocess
def test_importing_the_package_imports_neither_torch_nor_the_trainer() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout) == {"torch": False, "trainer": False}


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Modules imported outside ``if TYPE_CHECKING:`` blocks (function bodies included)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skipped.update(id(inner) for child in node.body for inner in ast.walk(child))
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


_ABOVE = ("hyper_parallel.trainer", "hyper_parallel.models", "hyper_parallel.components")


def test_the_techniques_import_neither_the_trainer_nor_the_models_at_run_time() -> None:
    for path in sorted((PACKAGE / "parallel").glob("*.py")):
        upward = [
            name
            for name in _runtime_imports(ast.parse(path.read_text(), filename=str(path)))
            if name.startswith(_ABOVE)
        ]
        assert upward == [], f"{path.relative_to(REPO)} imports {upward} at run time"
