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

from gateway.sandbox.client import NodeBusy, NodeError, execute_on_node
from gateway.sandbox.isolation import Sandbox
from gateway.sandbox.signing import NONCE_HEADER, SignatureError, Signer, load_or_create_secret

REPO = Path(__file__).resolve().parents[2]
SERVE = (
    "import asyncio, sys\n"
    "from gateway.sandbox.node import serve_node\n"
    "asyncio.run(serve_node('127.0.0.1', int(sys.argv[1]), sys.argv[2], max_concurrent=1))\n"
)


@contextlib.contextmanager
def running_node(workdir: Path):
    """Starts `python -c ... serve_node(...)` on a free port; yields (process, url, secret)."""
    secret_file = workdir / "sandbox-secret"
    secret = load_or_create_secret(secret_file)
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
def node(tmp_path_factory):
    """(base url, secret) of a node running as a real process."""
    with running_node(tmp_path_factory.mktemp("node")) as (_, url, secret):
        yield url, secret


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
    headers = signer.sign_request(body)
    status, response_headers, raw = await post(session, url, body, headers)
    assert status == 200
    signer.verify_response(response_headers, raw, headers[NONCE_HEADER])
    other = signer.sign_request(body)[NONCE_HEADER]
    with pytest.raises(SignatureError):
        signer.verify_response(response_headers, raw, other)


async def test_wrong_secret_is_rejected(node, session):
    url, _ = node
    job = {"runtime": "bash", "code": "echo hi", "execution_id": "ex_3"}
    body = orjson.dumps(job)
    status, _, raw = await post(session, url, body, Signer(os.urandom(32)).sign_request(body))
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
    headers = Signer(secret).sign_request(body)
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
    status, _, _ = await post(session, node[0], b"x" * (2 << 20), {})
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
        while not survivors(0, grace=0) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if not survivors(0, grace=0):
            pytest.skip("the node did not start the execution (no isolation here?)")
        proc.kill()
        with pytest.raises(NodeError, match="unreachable"):
            await running
    assert survivors(0) == []
    # What the dead node could not clean up goes when a node starts again.
    restarted = Sandbox(max_concurrent=1)
    assert [n for n in restarted._cgroups.names() if n.startswith(f"{proc.pid}-")] == []
