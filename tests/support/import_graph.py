"""The import graph of a package, read from its source: who imports whom, and the cycles that makes.

Nothing is imported: every module is parsed, and every ``import`` / ``from ... import`` statement counts,
at any depth (inside a function, under ``if TYPE_CHECKING:``): a lazy import is still a dependency, and a
type-only one still ties the two modules for a reader and for mypy. Relative names are resolved;
``from package import submodule`` is an edge to the submodule; ``importlib.import_module("literal")`` is
an edge too. A name that is no module of the package (``from package import SomeClass``) is an edge to
the nearest enclosing module of the package; imports from outside the package are left out.
"""

import ast
from pathlib import Path

__all__ = ["import_graph", "largest_cycle", "module_names", "reaches"]


def module_names(package: Path) -> dict[str, Path]:
    """Every module of the package at ``package`` by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` if it is a module of the package, else its nearest enclosing one (None: outside it)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(tree: ast.AST, package: str, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``tree`` imports, relative names made absolute against ``package``."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            for alias in node.names:  # a submodule, or a name inside ``base``
                names.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return {module for name in names if (module := _nearest(name, modules)) is not None}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (never itself)."""
    modules = module_names(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] = _imported(tree, own_package, modules) - {name}
    return graph


def reaches(graph: dict[str, set[str]], module: str, prefix: str) -> list[str]:
    """The modules within ``prefix`` (the package itself or below it) that ``module`` imports directly."""
    return sorted(t for t in graph[module] if t == prefix or t.startswith(prefix + "."))


def largest_cycle(graph: dict[str, set[str]]) -> list[str]:
    """The largest strongly connected component (modules that all reach each other), sorted; a module on
    no cycle is a component of one. Tarjan's algorithm, iterative (no recursion limit on deep chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    best: list[str] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > len(best):
                    best = sorted(component)
    return best
