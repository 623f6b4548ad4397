"""`spawn = true`: `gateway serve` runs its own node, restarts it when it dies and stops
it at shutdown."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.sandbox_e2e.helpers import Tenant, sandbox_config
from tests.support.gateway_process import GatewayProcess, free_port


def node_children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"model_gateway.gateway.sandbox.supervisor" in cmdline:
            found.append(int(entry))
    return found


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail("condition not reached in time")


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_spawned_node_serves_restarts_and_stops_with_the_gateway(executing, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    config = sandbox_config(url, "data/sandbox-secret", spawn=True)
    gateway = GatewayProcess(tmp_path, extra_config=config).start()
    try:
        tenant = Tenant(gateway)
        sandbox = tenant.sandbox("python")
        with httpx.Client(timeout=30) as client:

            def run() -> httpx.Response:
                body = {"sandbox_id": sandbox, "runtime": "python", "code": "print(6 * 7)"}
                return tenant.execute(client, **body)

            first = run()
            assert first.status_code == 200, first.text
            assert first.json()["stdout"] == "42\n"

            [node] = node_children(gateway.process.pid)
            os.kill(node, signal.SIGKILL)
            # The killed node may still be listed until it is reaped: wait for a new one.
            [restarted] = wait_for(
                lambda: [p for p in node_children(gateway.process.pid) if p != node]
            )
            wait_for(lambda: run().status_code == 200)

        gateway.process.send_signal(signal.SIGTERM)  # the gateway alone, not its group
        gateway.process.wait(timeout=15)
        wait_for(lambda: gone(restarted), timeout=5)
    finally:
        gateway.stop()


def test_a_second_deployment_on_the_same_node_port_fails_to_start(executing, tmp_path):
    port = free_port()
    config = sandbox_config(f"http://127.0.0.1:{port}", "data/sandbox-secret", spawn=True)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = GatewayProcess(tmp_path / "first", extra_config=config).start()
    second = GatewayProcess(tmp_path / "second", extra_config=config)
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="exited at start-up"):
            second.start()
        assert time.monotonic() - started < 10  # it stops at once, it does not hang
        assert second.process.returncode != 0
        assert f"cannot listen on 127.0.0.1:{port}" in second.log(), second.log()
        assert "Traceback" not in second.log()  # a message for the operator, not a crash

        # The first deployment and its node are untouched, and still serve it.
        tenant = Tenant(first)
        sandbox = tenant.sandbox("python")
        with httpx.Client(timeout=30) as client:
            body = {"sandbox_id": sandbox, "runtime": "python", "code": "print(6 * 7)"}
            answer = tenant.execute(client, **body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["stdout"] == "42\n"
        assert len(node_children(first.process.pid)) == 1
    finally:
        second.stop()
        first.stop()
