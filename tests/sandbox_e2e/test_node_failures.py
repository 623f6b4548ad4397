"""A node that is down, disagrees on the secret, or answers without proof is a 502
`sandbox_error`; so is a deployment without sandboxes. None of it is billed."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest

from model_gateway.gateway.sandbox.wire_auth import NONCE_HEADER, Signer, load_shared_secret
from tests.sandbox_e2e.helpers import Tenant, sandbox_config
from tests.support.gateway_process import free_port


class FakeNode:
    """Answers every /execute with a plausible result: unsigned, or signed but malformed."""

    def __init__(self, secret: bytes) -> None:
        self.mode = "unsigned"
        signer = Signer(secret)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # /healthz: healthy, so the gateway sends it jobs
                raw = orjson.dumps({"status": "ok", "isolation": {"will_execute": True}})
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:
                job = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                result = {
                    "execution_id": job["execution_id"],
                    "status": "completed",
                    "exit_code": 0,
                    "signal": None,
                    "stdout": "forged\n",
                    "stderr": "",
                    "stdout_truncated": False,
                    "stderr_truncated": False,
                    "duration_ms": 1,
                    "oom_killed": False,
                }
                headers = {}
                if fake.mode == "malformed":
                    del result["exit_code"]
                if fake.mode == "other_execution":
                    result["execution_id"] = "exe_someone_else"
                raw = orjson.dumps(result)
                if fake.mode != "unsigned":
                    headers = signer.sign_response(200, raw, self.headers[NONCE_HEADER])
                self.send_response(200)
                for name, value in {**headers, "content-type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def fake_node(tmp_path_factory):
    secret_file = tmp_path_factory.mktemp("fake-node") / "sandbox-secret"
    fake = FakeNode(load_shared_secret(secret_file))
    fake.secret_file = secret_file
    yield fake
    fake.server.shutdown()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60) as c:
        yield c


CASES = ["node_down", "wrong_secret", "unsigned", "malformed", "other_execution", "unconfigured"]


@pytest.fixture(scope="module")
def tenants(node, fake_node, make_gateway, gateway):
    """A tenant on a gateway set up for each failure; the fake node's modes share one."""
    made: dict[str, Tenant] = {}

    def of(case: str) -> Tenant:
        setup = "fake" if case in ("unsigned", "malformed", "other_execution") else case
        if setup not in made:
            if setup == "node_down":
                config = sandbox_config(f"http://127.0.0.1:{free_port()}", "data/sandbox-secret")
            elif setup == "wrong_secret":
                # The gateway creates its own secret: the real node cannot verify it.
                config = sandbox_config(node.url, "data/sandbox-secret")
            elif setup == "fake":
                config = sandbox_config(fake_node.url, fake_node.secret_file)
            # The shared gateway has no [sandbox_node].
            target = gateway if setup == "unconfigured" else make_gateway(config)
            made[setup] = Tenant(target)
        return made[setup]

    return of


@pytest.mark.parametrize("case", CASES)
def test_node_failure_is_sandbox_error_and_not_billed(case, tenants, fake_node, client):
    fake_node.mode = case
    tenant = tenants(case)
    sandbox = tenant.sandbox("python")
    before = tenant.account()
    answer = tenant.execute(client, sandbox_id=sandbox, runtime="python", code="print(1)")
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["type"] == "sandbox_error"
    assert "x-receipt-id" not in answer.headers
    assert tenant.account() == before
