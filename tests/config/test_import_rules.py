"""The layers hold: import rules asserted on the module graph, lazy imports included.

Every module of ``hyper_parallel`` is parsed (nothing is imported) and every ``import`` / ``from ... import``
statement is collected at any depth (inside functions too: a lazy import is still a dependency), with
relative names resolved and ``importlib.import_module("literal")`` calls counted. The rules are stated on
what exists, so they hold whatever modules the tree has:

(a) the generic config machinery (``hyper_parallel.config``) imports nothing of the trainer, the components
    or the models, nor the converter bound to ``TrainerConfig`` (it takes a converter); the two modules
    that bind it to ``TrainerConfig`` are the only exception, and they import the root config and its
    rules only;
(b) no module that imports torch imports the config manager or the converter bound to ``TrainerConfig``,
    except the entry points and the trainer package (the runtime gets the run config as data);
(c) no public module of the packages that hold Configs and factories (``TARGET_PACKAGES``) imports torch
    when it is imported: the torch runtimes are private modules, so a ``_target_`` can never reach one;
(d) ``hyper_parallel.parallel`` imports nothing of the trainer at run time;
(e) components and models use the type rules, never the manager or the bound converter.
"""

import ast
import typing
from functools import cache
from pathlib import Path

import pytest

from hyper_parallel.trainer.config import TARGET_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hyper_parallel"

#: The modules that bind the generic machinery to ``TrainerConfig`` (rule a's documented exception).
BINDINGS = frozenset({"hyper_parallel.config.manager", "hyper_parallel.config.resolver"})
#: What the bindings may import of the layers above the machinery: the root config and its rules.
BOUND = frozenset({"hyper_parallel.trainer.config", "hyper_parallel.trainer.rules"})
#: Modules that are, or re-export, the config manager and the converter bound to ``TrainerConfig``.
MANAGER = frozenset({"hyper_parallel.config", *BINDINGS})
#: Entry points: they read argv and hand the config to a trainer, so they may import both sides.
ENTRY_POINTS = frozenset(
    {
        "hyper_parallel.launch",
        "hyper_parallel.train_lm",
        "hyper_parallel.train_vl",
        "hyper_parallel.export",
        "hyper_parallel.generate",
        "hyper_parallel.evaluate",
        "hyper_parallel.config.__main__",
    }
)
#: The layers above the generic machinery.
UPPER = ("hyper_parallel.trainer", "hyper_parallel.components", "hyper_parallel.models")


class Import(typing.NamedTuple):
    """One imported module, where it is imported and when it runs."""

    #: Absolute dotted name of the imported module.
    name: str
    #: Line of the statement.
    line: int
    #: Whether the statement runs when the importing module is imported (not inside a function).
    at_import: bool
    #: Whether the statement is under ``if TYPE_CHECKING:`` (never runs).
    type_only: bool


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its own name)."""
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@cache
def imports(module: str) -> tuple[Import, ...]:
    """Every module ``module`` imports, at any depth."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def absolute(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join([*base, *([node.module] if node.module else [])])

    def visit(node: ast.AST, at_import: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            line = getattr(child, "lineno", 0)
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, line, at_import, type_only) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = absolute(child)
                for alias in child.names:  # ``from package import submodule`` imports the submodule
                    name = f"{base}.{alias.name}"
                    found.append(Import(name if name in modules() else base, line, at_import, type_only))
            elif (
                isinstance(child, ast.Call)
                and getattr(child.func, "attr", getattr(child.func, "id", None)) == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append(Import(child.args[0].value, line, at_import, type_only))
                visit(child, at_import, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.body:
                    visit(ast.Module(body=[statement], type_ignores=[]), at_import, True)
                for statement in child.orelse:
                    visit(ast.Module(body=[statement], type_ignores=[]), at_import, type_only)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False, type_only)
            else:
                visit(child, at_import, type_only)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), True, False)
    return tuple(found)


def _shown(module: str, found: list[Import]) -> list[str]:
    where = modules()[module].relative_to(ROOT)
    return [f"{where}:{i.line}: imports {i.name}" for i in found]


def imports_torch(module: str) -> bool:
    """Whether ``module`` imports torch when something runs (at import or in a function)."""
    return any(_within(i.name, "torch") and not i.type_only for i in imports(module))


def _in(*prefixes: str) -> list[str]:
    return [m for m in modules() if any(_within(m, p) for p in prefixes)]


def _public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


# -- the collector itself ---------------------------------------------------------------------------------


def test_the_collector_sees_lazy_relative_and_type_only_imports() -> None:
    assert {"hyper_parallel.config", "hyper_parallel.config.manager"} <= set(modules())
    found = {i.name: i for i in imports("hyper_parallel.config.manager")}
    assert found["hyper_parallel.trainer.config"].at_import
    assert not found["hyper_parallel.config.overrides"].at_import  # imported inside a function
    assert found["hyper_parallel.config.overrides"].type_only is False
    assert any(i.type_only for i in imports("hyper_parallel.config.manager"))  # ``if TYPE_CHECKING:``
    assert imports_torch("hyper_parallel.trainer._trainer")


# -- (a) the generic machinery knows no component ----------------------------------------------------------


@pytest.mark.parametrize("module", [m for m in _in("hyper_parallel.config") if m not in BINDINGS])
def test_the_generic_config_machinery_imports_no_trainer_component_or_model(module: str) -> None:
    upward = [i for i in imports(module) if any(_within(i.name, p) for p in UPPER)]
    assert _shown(module, upward) == []


#: The config modules that face users: the package re-exports the bound API, ``__main__`` is an entry point.
FRONT = frozenset({"hyper_parallel.config", "hyper_parallel.config.__main__"})


@pytest.mark.parametrize("module", [m for m in _in("hyper_parallel.config") if m not in BINDINGS | FRONT])
def test_the_generic_config_machinery_takes_a_converter_instead_of_importing_the_bound_one(
    module: str,
) -> None:
    bound = [i for i in imports(module) if i.name in MANAGER]
    assert _shown(module, bound) == []


@pytest.mark.parametrize("module", sorted(BINDINGS))
def test_the_bindings_import_only_the_root_config_and_its_rules(module: str) -> None:
    upward = [i for i in imports(module) if any(_within(i.name, p) for p in UPPER) and i.name not in BOUND]
    assert _shown(module, upward) == []


# -- (b) the runtime imports no config manager -------------------------------------------------------------


def _runtime_modules() -> list[str]:
    return [
        m
        for m in modules()
        if m not in ENTRY_POINTS and not _within(m, "hyper_parallel.trainer") and imports_torch(m)
    ]


@pytest.mark.parametrize("module", _runtime_modules())
def test_a_torch_module_imports_no_config_manager(module: str) -> None:
    bound = [i for i in imports(module) if i.name in MANAGER and not i.type_only]
    assert _shown(module, bound) == []


# -- (c) the packages a target may name keep torch in private modules --------------------------------------


@pytest.mark.parametrize("module", [m for m in _in(*TARGET_PACKAGES) if _public(m)])
def test_a_public_module_of_the_target_packages_imports_no_torch_when_imported(module: str) -> None:
    heavy = [i for i in imports(module) if _within(i.name, "torch") and i.at_import and not i.type_only]
    assert _shown(module, heavy) == []


# -- (d) the distributed techniques sit below the trainer --------------------------------------------------


@pytest.mark.parametrize("module", _in("hyper_parallel.parallel"))
def test_the_parallel_package_imports_no_trainer_at_run_time(module: str) -> None:
    upward = [i for i in imports(module) if _within(i.name, "hyper_parallel.trainer") and not i.type_only]
    assert _shown(module, upward) == []


# -- (e) components and models use the type rules ----------------------------------------------------------


@pytest.mark.parametrize("module", _in("hyper_parallel.components", "hyper_parallel.models"))
def test_components_and_models_use_the_type_rules_not_the_bound_converter(module: str) -> None:
    bound = [i for i in imports(module) if i.name in MANAGER and not i.type_only]
    assert _shown(module, bound) == []
