"""A client that disconnects during a run, over real HTTP to a real gateway and node: the
run is stopped on the node, the time it ran is billed with a `cancelled` receipt, and the
gateway's slot is free again once the node's is."""

from __future__ import annotations

import socket
import sqlite3
import time
from decimal import Decimal

import httpx
import orjson
import pytest

from tests.sandbox_e2e.helpers import (
    Tenant,
    expected_cost,
    node_slot_processes,
    sandbox_config,
)
from tests.support.gateway_process import GatewayProcess


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


def send_and_leave_open(gateway, key: str, body: dict) -> socket.socket:
    """Sends a whole request on a raw connection and returns it unread."""
    raw = orjson.dumps(body)
    head = (
        "POST /v1/sandbox/executions HTTP/1.1\r\n"
        f"host: 127.0.0.1:{gateway.port}\r\n"
        f"authorization: Bearer {key}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n"
    )
    connection = socket.create_connection(("127.0.0.1", gateway.port))
    connection.sendall(head.encode() + raw)
    return connection


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)
    return value


def receipt_ids(gateway, project: str) -> list[str]:
    """The project's receipts, read from the gateway's database file (no list endpoint)."""
    path = gateway.folder / "data" / "gateway.db"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id FROM receipts WHERE project_id = ?", (project,))
        return [row[0] for row in rows]


def test_a_client_that_leaves_mid_run_stops_it_and_pays_what_ran(
    sandbox_gateway, executing, client
):
    tenant, other = Tenant(sandbox_gateway), Tenant(sandbox_gateway)
    sandbox = tenant.sandbox("python", "--timeout-s", "60")
    other_sandbox = other.sandbox("python")
    credits, _ = tenant.account()
    node = executing.process.pid

    body = {"sandbox_id": sandbox, "runtime": "python", "code": "import time; time.sleep(30)"}
    connection = send_and_leave_open(sandbox_gateway, tenant.key, body)
    wait_for(lambda: node_slot_processes(node), 10, "the program started")
    time.sleep(1.0)  # it runs a while: a positive time to bill
    connection.close()
    left = time.monotonic()

    wait_for(lambda: not node_slot_processes(node), 5, "the program's processes are gone")
    print(f"\nprocesses gone {1000 * (time.monotonic() - left):.0f} ms after the client left")
    wait_for(lambda: tenant.account()[1] == 0, 10, "reserved back to 0")
    [receipt_id] = wait_for(lambda: receipt_ids(sandbox_gateway, tenant.project), 5, "receipt")
    receipt = tenant.receipt(client, receipt_id)
    assert (receipt["status"], receipt["kind"], receipt["runtime"]) == (
        "cancelled",
        "sandbox",
        "python",
    )
    ran_ms = receipt["usage"]["duration_ms"]
    assert 1000 <= ran_ms < 10_000  # what ran, not the 30 s asked for nor the 60 s limit
    cost = Decimal(receipt["cost"])
    assert cost == expected_cost(ran_ms) > 0
    assert tenant.account() == (credits - cost, 0)

    # The gateway's only slot is free again, as the node's is: another project runs.
    answer = other.execute(client, sandbox_id=other_sandbox, runtime="python", code="print(2)")
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "2\n"


def test_a_gateway_killed_mid_run_leaves_nothing_running_on_the_node(executing, tmp_path):
    """No stop request can come from a dead gateway: the node sees its connection close."""
    config = sandbox_config(executing.url, executing.secret_file, max_concurrent=1)
    gateway = GatewayProcess(tmp_path, extra_config=config).start()
    try:
        tenant = Tenant(gateway)
        sandbox = tenant.sandbox("python", "--timeout-s", "60")
        body = {"sandbox_id": sandbox, "runtime": "python", "code": "import time; time.sleep(30)"}
        connection = send_and_leave_open(gateway, tenant.key, body)
        node = executing.process.pid
        wait_for(lambda: node_slot_processes(node), 10, "the program started")
        gateway.kill()
        wait_for(lambda: not node_slot_processes(node), 5, "the program's processes are gone")
        connection.close()
    finally:
        gateway.stop()
