import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["pipeline", "pipeline.cors", "storage", "gateway"])
def test_each_package_imports_on_its_own(module):
    """A stage must be usable alone (style: built and tested against a fake inner app)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
