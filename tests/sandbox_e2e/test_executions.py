"""POST /v1/sandbox/executions through a real gateway to a real node: what runs is billed
and receipted, whatever its exit; what is refused costs nothing."""

from __future__ import annotations

import hashlib
import threading
import time
from decimal import Decimal

import httpx
import pytest

from tests.sandbox_e2e.helpers import (
    Tenant,
    expected_cost,
    node_slot_processes,
    sandbox_config,
)

MAX_CODE = 100 * 1024
MAX_STDIN = 256 * 1024
PER_TIMEOUT_1S = expected_cost(1000)


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tenant(sandbox_gateway) -> Tenant:
    return Tenant(sandbox_gateway)


def test_execution_runs_and_is_billed(tenant, client):
    sandbox = tenant.sandbox("python")
    before, _ = tenant.account()
    code = "import sys\nprint(sys.stdin.read().upper())"
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code, stdin="hi")
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["id"].startswith("exe_")
    assert result["receipt_id"].startswith("rcpt_")
    assert answer.headers["x-receipt-id"] == result["receipt_id"]
    assert {k: result[k] for k in ("sandbox_id", "runtime", "status", "exit_code")} == {
        "sandbox_id": sandbox,
        "runtime": "python",
        "status": "completed",
        "exit_code": 0,
    }
    assert (result["stdout"], result["stderr"]) == ("HI\n", "")
    assert result["stdout_truncated"] is result["stderr_truncated"] is False

    receipt = tenant.receipt(client, result["receipt_id"])
    assert receipt["status"] == "succeeded"
    assert (receipt["kind"], receipt["runtime"]) == ("sandbox", "python")
    assert receipt["usage"] == {"duration_ms": result["duration_ms"]}
    assert receipt["response_sha256"] == hashlib.sha256(answer.content).hexdigest()
    cost = Decimal(receipt["cost"])
    assert cost == expected_cost(result["duration_ms"])
    assert tenant.account() == (before - cost, 0)


def test_nonzero_exit_is_billed_and_receipted_as_failed(tenant, client):
    sandbox = tenant.sandbox("bash")
    before, _ = tenant.account()
    code = "echo partial\necho oops >&2\nexit 3\n"
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="bash", code=code)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert (result["status"], result["exit_code"]) == ("failed", 3)
    assert (result["stdout"], result["stderr"]) == ("partial\n", "oops\n")
    receipt = tenant.receipt(client, result["receipt_id"])
    assert receipt["status"] == "failed"
    cost = Decimal(receipt["cost"])
    assert cost == expected_cost(result["duration_ms"])
    assert tenant.account() == (before - cost, 0)


def test_timeout_is_billed_and_leaves_no_process(tenant, client, executing):
    sandbox = tenant.sandbox("python", "--timeout-s", "1")
    before, _ = tenant.account()
    # Children in their own sessions: a process-group kill alone would miss them.
    code = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        break\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code)
    assert time.monotonic() - started < 10
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == "timed_out"
    assert result["stdout"].startswith("started")
    assert result["duration_ms"] >= 1000
    receipt = tenant.receipt(client, result["receipt_id"])
    assert receipt["status"] == "failed"
    cost = Decimal(receipt["cost"])
    assert cost == PER_TIMEOUT_1S  # the time over the limit is never billed
    assert tenant.account() == (before - cost, 0)
    # This node's: other test runs on this host use the same slot uids.
    deadline = time.monotonic() + 2
    while node_slot_processes(executing.process.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node_slot_processes(executing.process.pid) == []


def test_code_of_exactly_100_kib_runs(tenant, client):
    sandbox = tenant.sandbox("python")
    code = "print('ok')\n#" + "x" * (MAX_CODE - len("print('ok')\n#"))
    assert len(code.encode()) == MAX_CODE
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "ok\n"


def test_stdin_of_control_characters_runs(tenant, client):
    """200 KB of control characters: six times that once JSON-escaped for the node."""
    sandbox = tenant.sandbox("python")
    code = "import sys\nd = sys.stdin.read()\nprint(len(d), set(d) == {chr(1)})"
    stdin = "\x01" * 200_000
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code, stdin=stdin)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "200000 True\n"


@pytest.fixture(scope="module")
def foreign_sandbox(sandbox_gateway) -> str:
    return Tenant(sandbox_gateway).sandbox("python")


@pytest.mark.parametrize(
    ("case", "status", "kind", "param"),
    [
        ("runtime_mismatch", 400, "invalid_request", "runtime"),
        ("code_too_large", 400, "invalid_request", "code"),
        ("stdin_too_large", 400, "invalid_request", "stdin"),
        ("unknown_runtime", 400, "invalid_request", "runtime"),
        ("missing_code", 400, "invalid_request", "code"),
        ("unknown_sandbox", 404, "not_found", "sandbox_id"),
        ("foreign_sandbox", 404, "not_found", "sandbox_id"),
    ],
)
def test_refused_requests_cost_nothing(tenant, client, foreign_sandbox, case, status, kind, param):
    own = tenant.sandbox("python") if case != "foreign_sandbox" else None
    body = {"sandbox_id": own, "runtime": "python", "code": "print(1)"}
    if case == "runtime_mismatch":
        body["runtime"] = "node"
    elif case == "code_too_large":
        body["code"] = "#" * (MAX_CODE + 1)
    elif case == "stdin_too_large":
        body["stdin"] = "é" * (MAX_STDIN // 2) + "x"  # 128 Ki characters, 256 KiB + 1 of UTF-8
    elif case == "unknown_runtime":
        body["runtime"] = "ruby"
    elif case == "missing_code":
        del body["code"]
    elif case == "unknown_sandbox":
        body["sandbox_id"] = "sbx_0000000000000000"
    else:
        body["sandbox_id"] = foreign_sandbox
    before = tenant.account()
    answer = tenant.execute(client, **body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["type"], error.get("param")) == (kind, param)
    assert "x-receipt-id" not in answer.headers
    assert tenant.account() == before


@pytest.fixture(scope="module")
def busy_node_gateway(executing, make_gateway):
    """Admits two at once to a node with one slot: the node itself answers busy."""
    return make_gateway(sandbox_config(executing.url, executing.secret_file, max_concurrent=2))


@pytest.mark.parametrize("where", ["gateway", "node"])
def test_capacity_exhausted_is_503_and_not_billed(
    where, sandbox_gateway, busy_node_gateway, client
):
    tenant = Tenant(sandbox_gateway if where == "gateway" else busy_node_gateway)
    sandbox = tenant.sandbox("python")
    before, _ = tenant.account()
    answers: list[httpx.Response] = []

    def run() -> None:
        code = "import time\ntime.sleep(1.5)"
        answers.append(tenant.execute(client, sandbox_id=sandbox, runtime="python", code=code))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ok, refused = sorted(answers, key=lambda a: a.status_code)
    assert (ok.status_code, refused.status_code) == (200, 503), refused.text
    assert refused.headers["retry-after"] == "5"
    error = refused.json()["error"]
    assert (error["type"], error["retry_after_seconds"]) == ("service_unavailable", 5)
    assert "x-receipt-id" not in refused.headers
    cost = tenant.receipt(client, ok.json()["receipt_id"])["cost"]
    assert tenant.account() == (before - Decimal(cost), 0)
