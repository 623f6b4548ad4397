import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "model_gateway.pipeline",
        "model_gateway.pipeline.cors",
        "model_gateway.storage",
        "model_gateway.gateway",
    ],
)
def test_each_package_imports_on_its_own(module):
    """A stage must be usable alone (style: built and tested against a fake inner app)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
