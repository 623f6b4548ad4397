"""The package structure the README's layout section promises: arrows point one way, and
no two modules or exported classes share a name across the packages."""

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


def test_no_two_modules_share_a_name():
    names = Counter(
        path.name
        for package in PACKAGES
        for path in modules(package)
        if path.name not in {"__init__.py", "__main__.py"}
    )
    assert [name for name, count in names.items() if count > 1] == []


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
