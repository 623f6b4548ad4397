"""The systemd units of the deployment recipe pass `systemd-analyze verify`, with their
ExecStart pointing at this checkout's real `gateway` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gateway_process import GATEWAY

UNITS = Path(__file__).resolve().parents[2] / "scripts" / "deploy"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
@pytest.mark.parametrize("unit", ["gateway.service", "gateway-sandbox-node.service"])
def test_the_unit_verifies(tmp_path, unit):
    text = (UNITS / unit).read_text()
    assert "/opt/gateway/.venv/bin/gateway " in text
    (tmp_path / unit).write_text(text.replace("/opt/gateway/.venv/bin/gateway", GATEWAY))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Other units on this machine may warn; only lines about ours count.
    ours = [line for line in (done.stdout + done.stderr).splitlines() if unit in line]
    assert ours == [], "\n".join(ours)
