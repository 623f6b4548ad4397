"""The node as a real process on loopback, spoken to over HTTP with signed requests."""

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from model_gateway.gateway.sandbox.client import (
    NodeBusy,
    NodeError,
    execute_on_node,
    stop_on_node,
)
from model_gateway.gateway.sandbox.node.isolation import Sandbox
from model_gateway.gateway.sandbox.node.service import MAX_CODE_BYTES, MAX_STDIN_BYTES
from model_gateway.gateway.sandbox.wire_auth import (
    NONCE_HEADER,
    SignatureError,
    Signer,
    load_shared_secret,
)

REPO = Path(__file__).resolve().parents[2]
SERVE = (
    "import asyncio, sys\n"
    "from model_gateway.gateway.sandbox.node.service import serve_node\n"
    "asyncio.run(serve_node('127.0.0.1', int(sys.argv[1]), sys.argv[2], max_concurrent=1))\n"
)


@contextlib.contextmanager
def running_node(workdir: Path):
    """Starts `python -c ... serve_node(...)` on a free port; yields (process, url, secret)."""
    secret_file = workdir / "sandbox-secret"
    secret = load_shared_secret(secret_file)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = workdir / "node.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(port), str(secret_file)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"node did not start:\n{log.read_text()}")
                time.sleep(0.05)
        yield proc, f"http://127.0.0.1:{port}", secret
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert secret not in log.read_bytes()  # never logged


@pytest.fixture(scope="module")
def node_process(tmp_path_factory):
    """(process, base url, secret) of a node running as a real process."""
    with running_node(tmp_path_factory.mktemp("node")) as running:
        yield running


@pytest.fixture(scope="module")
def node(node_process):
    """(base url, secret) of the node."""
    return node_process[1], node_process[2]


@pytest.fixture
def ours(node_process, survivors):
    """survivors(), counting only the processes of this module's node."""
    return lambda grace=1.0: survivors(0, grace, under=node_process[0].pid)


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def executing(node, session):
    """Skips execution tests when the node reports it would refuse (no isolation here)."""
    async with session.get(f"{node[0]}/healthz") as response:
        report = (await response.json())["isolation"]
    if not report["will_execute"]:
        pytest.skip(f"the node refuses to execute here: {report['refusal']}")


EXECUTE = "POST /execute"  # what a request to the node's /execute is signed for


async def post(session, url, body: bytes, headers: dict[str, str]):
    async with session.post(f"{url}/execute", data=body, headers=headers) as response:
        return response.status, response.headers, await response.read()


async def test_healthz_reports_the_isolation_achieved(node, session):
    async with session.get(f"{node[0]}/healthz") as response:
        assert response.status == 200
        body = await response.json()
    report = body["isolation"]
    assert set(report) >= {"will_execute", "namespaces", "uid_switch", "seccomp", "cgroups"}
    assert report["max_concurrent"] == 1


async def test_signed_execution_returns_a_verified_result(node, session, executing):
    url, secret = node
    job = {"runtime": "python", "code": "print(input() * 2)", "stdin": "ab", "execution_id": "ex_1"}
    result = await execute_on_node(session, url, Signer(secret), job)
    assert result["execution_id"] == "ex_1"
    assert (result["status"], result["exit_code"], result["stdout"]) == ("completed", 0, "abab\n")
    assert result["duration_ms"] > 0


async def test_response_is_bound_to_the_request(node, session, executing):
    url, secret = node
    signer = Signer(secret)
    body = orjson.dumps({"runtime": "bash", "code": "echo hi", "execution_id": "ex_2"})
    headers = signer.sign_request(EXECUTE, body)
    status, response_headers, raw = await post(session, url, body, headers)
    assert status == 200
    signer.verify_response(response_headers, status, raw, headers[NONCE_HEADER])
    other = signer.sign_request(EXECUTE, body)[NONCE_HEADER]
    with pytest.raises(SignatureError):
        signer.verify_response(response_headers, status, raw, other)


async def test_wrong_secret_is_rejected(node, session):
    url, _ = node
    job = {"runtime": "bash", "code": "echo hi", "execution_id": "ex_3"}
    body = orjson.dumps(job)
    status, _, raw = await post(
        session, url, body, Signer(os.urandom(32)).sign_request(EXECUTE, body)
    )
    assert (status, orjson.loads(raw)["error"]["type"]) == (401, "unauthorized")
    with pytest.raises(NodeError, match="rejected"):  # the client never trusts an unsigned answer
        await execute_on_node(session, url, Signer(os.urandom(32)), job)


async def test_unsigned_request_is_rejected(node, session):
    body = orjson.dumps({"runtime": "bash", "code": "echo hi", "execution_id": "ex_4"})
    status, _, raw = await post(session, node[0], body, {"content-type": "application/json"})
    assert status == 401
    assert orjson.loads(raw)["error"]["message"] == "missing x-sandbox-timestamp header"


async def test_replayed_request_is_rejected(node, session):
    url, secret = node
    body = orjson.dumps({"runtime": "nope", "code": "", "execution_id": "ex_5"})
    headers = Signer(secret).sign_request(EXECUTE, body)
    assert (await post(session, url, body, headers))[0] == 400
    status, _, raw = await post(session, url, body, headers)
    assert (status, orjson.loads(raw)["error"]["message"]) == (401, "replayed nonce")


async def test_invalid_job_gets_a_signed_400(node, session):
    url, secret = node
    with pytest.raises(NodeError, match=r"invalid_request.*runtime"):
        await execute_on_node(
            session, url, Signer(secret), {"runtime": "cobol", "code": "", "execution_id": "ex_6"}
        )


async def test_oversized_body_is_refused(node, session):
    status, _, _ = await post(session, node[0], b"x" * (3 << 20), {})
    assert status == 413


async def test_executions_beyond_max_concurrent_get_busy(node, session, executing):
    url, secret = node
    signer = Signer(secret)
    slow = asyncio.create_task(
        execute_on_node(
            session, url, signer, {"runtime": "bash", "code": "sleep 1", "execution_id": "ex_7"}
        )
    )
    await asyncio.sleep(0.3)
    with pytest.raises(NodeBusy) as busy:
        await execute_on_node(
            session, url, signer, {"runtime": "bash", "code": "true", "execution_id": "ex_8"}
        )
    assert busy.value.retry_after == "5"
    assert (await slow)["status"] == "completed"


async def test_a_crashing_node_takes_its_executions_with_it(tmp_path, session, survivors):
    with running_node(tmp_path) as (proc, url, secret):
        job = {"runtime": "bash", "code": "sleep 1000 & sleep 1000", "execution_id": "ex_9"}
        running = asyncio.create_task(execute_on_node(session, url, Signer(secret), job))
        deadline = time.monotonic() + 5
        # Its own: other test runs on this host use the same slot uids.
        while len(survivors(0, grace=0, under=proc.pid)) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        started = survivors(0, grace=0, under=proc.pid)
        if not started:
            pytest.skip("the node did not start the execution (no isolation here?)")
        proc.kill()
        with pytest.raises(NodeError, match="unreachable"):
            await running
    deadline = time.monotonic() + 1
    while set(started) & set(survivors(0, grace=0)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert set(started) & set(survivors(0, grace=0)) == set()
    # What the dead node could not clean up goes when a node starts again.
    restarted = Sandbox(max_concurrent=1)
    assert [n for n in restarted._cgroups.names() if n.startswith(f"{proc.pid}-")] == []


async def test_every_refusal_is_signed_and_bound_to_its_request(node, session):
    url, secret = node
    signer = Signer(secret)
    oversized = b"x" * (3 << 20)
    headers = signer.sign_request(EXECUTE, oversized)
    status, answer_headers, raw = await post(session, url, oversized, headers)
    assert status == 413
    signer.verify_response(answer_headers, status, raw, headers[NONCE_HEADER])
    stale = Signer(secret, clock=lambda: time.time() - 300)
    body = orjson.dumps({"runtime": "bash", "code": "echo hi", "execution_id": "ex_10"})
    headers = stale.sign_request(EXECUTE, body)
    status, answer_headers, raw = await post(session, url, body, headers)
    assert (status, orjson.loads(raw)["error"]["type"]) == (401, "unauthorized")
    signer.verify_response(answer_headers, status, raw, headers[NONCE_HEADER])


async def test_largest_job_with_the_worst_json_escaping_runs(node, session, executing):
    url, secret = node
    head = "import sys\nd = sys.stdin.read()\nprint(len(d), set(d) == {chr(1)})\n#"
    code = head + "\x1f" * (MAX_CODE_BYTES - len(head))
    stdin = "\x01" * MAX_STDIN_BYTES
    job = {"runtime": "python", "code": code, "stdin": stdin, "execution_id": "ex_11"}
    assert len(orjson.dumps(job)) > 2 << 20  # twice the node's old cap
    result = await execute_on_node(session, url, Signer(secret), job)
    assert (result["status"], result["stdout"]) == ("completed", f"{MAX_STDIN_BYTES} True\n")


async def test_a_request_captured_before_a_restart_is_refused_after_it(tmp_path, session):
    body = orjson.dumps({"runtime": "bash", "code": "echo replayed", "execution_id": "ex_12"})
    with running_node(tmp_path) as (_, url, secret):
        captured = Signer(secret).sign_request(EXECUTE, body)
        first = await post(session, url, body, captured)
        assert first[0] in (200, 500)  # 500: the host refuses to execute; still accepted
    with running_node(tmp_path) as (_, url, secret):  # same secret file, new process
        status, headers, raw = await post(session, url, body, captured)
        assert status == 401, raw
        assert (
            orjson.loads(raw)["error"]["message"] == "request timestamped before this node started"
        )
        Signer(secret).verify_response(headers, status, raw, captured[NONCE_HEADER])
        # A request signed now is accepted at once.
        assert (await post(session, url, body, Signer(secret).sign_request(EXECUTE, body)))[
            0
        ] != 401


async def wait_until_running(ours) -> None:
    deadline = time.monotonic() + 10
    while not ours(grace=0):
        assert time.monotonic() < deadline, "the execution did not start"
        await asyncio.sleep(0.02)


async def wait_until_gone(ours, bound_s: float) -> float:
    started = time.monotonic()
    while ours(grace=0):
        assert time.monotonic() - started < bound_s, "the execution's processes survived"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_stop_ends_a_running_execution_and_reports_the_time_it_ran(
    node, session, executing, ours
):
    url, secret = node
    signer = Signer(secret)
    job = {"runtime": "bash", "code": "sleep 1000 & sleep 1000", "execution_id": "ex_13"}
    job["timeout_s"] = 60
    running = asyncio.create_task(execute_on_node(session, url, signer, job))
    await wait_until_running(ours)
    await asyncio.sleep(0.5)
    assert await stop_on_node(session, url, signer, "ex_13") == "stopping"
    result = await asyncio.wait_for(running, 5)
    assert result["status"] == "cancelled"
    assert 500 <= result["duration_ms"] < 5000
    assert ours() == []


async def test_a_closed_connection_stops_its_execution(node, session, executing, ours):
    url, secret = node
    signer = Signer(secret)
    job = {"runtime": "bash", "code": "sleep 1000", "execution_id": "ex_14", "timeout_s": 60}
    running = asyncio.create_task(execute_on_node(session, url, signer, job))
    await wait_until_running(ours)
    running.cancel()  # aiohttp closes the connection of a request it abandons
    await wait_until_gone(ours, bound_s=3)
    # The node's slot is free again: the next execution is not refused as busy.
    deadline = time.monotonic() + 3
    while True:
        try:
            job = {"runtime": "bash", "code": "echo next", "execution_id": "ex_15"}
            result = await execute_on_node(session, url, signer, job)
            break
        except NodeBusy:
            assert time.monotonic() < deadline, "the slot was not freed"
            await asyncio.sleep(0.05)
    assert result["stdout"] == "next\n"


async def test_a_stop_that_overtakes_its_job_wins(node, session, executing):
    url, secret = node
    signer = Signer(secret)
    assert await stop_on_node(session, url, signer, "ex_16") == "not_running"
    job = {"runtime": "bash", "code": "sleep 1000", "execution_id": "ex_16", "timeout_s": 60}
    result = await asyncio.wait_for(execute_on_node(session, url, signer, job), 5)
    assert result["status"] == "cancelled"
