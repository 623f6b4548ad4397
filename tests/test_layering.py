"""The package structure the README's layout section promises: arrows point one way, no
two modules of a package share a name (the storage backends mirror each other), and no
two exported classes share a name across the packages."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "pipeline", "storage")
# What each package may import of the project (itself included).
ALLOWED = {
    "gateway": {"gateway", "pipeline", "storage"},
    "pipeline": {"pipeline"},
    "storage": {"storage"},
}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def project_imports(path: Path) -> set[str]:
    """The project packages a module imports, at any depth (TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "model_gateway" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] in PACKAGES:
                found.add(parts[0])  # a bare top-level import would shadow-break host apps
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_only_down(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(project_imports(path) - ALLOWED[package])
        for path in modules(package)
        if project_imports(path) - ALLOWED[package]
    }
    assert not wrong, f"{package} imports what it may not: {wrong}"


def test_no_module_imports_a_bare_top_level_package():
    """Every import goes through `model_gateway.`: a host's own `storage` must not win."""
    bare = []
    for package in PACKAGES:
        for path in modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    if node.module.split(".")[0] in PACKAGES:
                        bare.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert not bare


def test_no_two_modules_of_a_package_share_a_name():
    """Within each package a module's name says which one it is; the one exception is by
    design: each storage backend has a module per domain, under the same names
    (storage/sqlite/ledger.py mirrors storage/postgres/ledger.py)."""
    backends = {ROOT / "storage" / "sqlite", ROOT / "storage" / "postgres"}
    for package in PACKAGES:
        names = Counter(
            path.name
            for path in modules(package)
            if path.name not in {"__init__.py", "__main__.py"} and path.parent not in backends
        )
        assert [name for name, count in names.items() if count > 1] == [], package
    sqlite, postgres = (sorted(p.name for p in folder.glob("*.py")) for folder in sorted(backends))
    assert sqlite == postgres  # the two backends mirror each other, module for module


def test_no_two_exported_classes_share_a_name():
    owners: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in modules(package):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    owners.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}


def test_every_package_folder_is_installed():
    """pyproject lists the installed packages by hand (package-dir maps them): none missing."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        "model_gateway." + ".".join(init.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }
    assert folders == listed


def _module_names() -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its folder's name)."""
    found = {}
    for package in PACKAGES:
        for path in modules(package):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_modules(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules a module imports when it runs: at any depth (a function's lazy
    import too), except under `if TYPE_CHECKING:`. `from pkg import sub` imports the package
    and, when `sub` is a module, the module."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in child.orelse:
                    visit_one(statement)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            visit(node)
            return
        for name in names:
            if not name.startswith("model_gateway."):
                continue
            name = name.removeprefix("model_gateway.")
            while name and name not in known:  # `from m import function`: the module m
                name = name.rpartition(".")[0]
            if name:
                found.add(name)

    visit(ast.parse(path.read_text()))
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                strong(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            strong(module)
    return found


def test_no_import_circle_among_product_modules():
    """Imports point one way between modules too: a circle (cli -> server -> app -> console
    -> cli, say) makes the import order matter and every module in it load all the others.
    Imports under `if TYPE_CHECKING:` do not run and do not count; lazy ones do."""
    known = _module_names()
    graph = {
        name: {target for target in _imported_modules(path, known) if target != name}
        for name, path in known.items()
    }
    circles = _circles(graph)
    described = "\n\n".join(
        "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & set(circle)))}" for m in circle)
        for circle in circles
    )
    assert not circles, f"import circles among the modules (each imports):\n{described}"
