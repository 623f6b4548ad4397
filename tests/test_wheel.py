"""The wheel holds every module of the source tree. pyproject.toml lists the packages by
name (the repository root is the `model_gateway` package, which discovery cannot map): a
package left off the list still imports from a checkout, through the editable install,
but is missing from the wheel, and so from every real installation."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gateway", "pipeline", "storage")  # what model_gateway is made of


def source_modules() -> set[str]:
    return {
        f"model_gateway/{path.relative_to(ROOT).as_posix()}"
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_every_module_of_the_source_tree(tmp_path):
    # Built from a copy: a build leaves build/ and an egg-info in the tree it builds,
    # and other runs share this checkout.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder,
            source / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"),
        )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(dist)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name for name in archive.namelist() if name.endswith(".py")}
    expected = source_modules()
    assert {"model_gateway/storage/sqlite/ledger.py", "model_gateway/gateway/cli.py"} <= expected
    assert sorted(expected - in_wheel) == []  # modules a real installation would lack
    assert sorted(in_wheel - expected) == []
