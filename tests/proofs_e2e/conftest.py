"""A real `gateway serve` (the shared session gateway), billed chats and their proofs."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.http import bearer

INTEGRATION_DEADLINE_S = 1.0


@dataclass
class Customer:
    project_id: str
    project_name: str
    key: str


@pytest.fixture(scope="session")
def http(gateway: GatewayProcess):
    with httpx.Client(base_url=gateway.url, timeout=30, cookies=None) as client:
        yield client


@pytest.fixture(scope="session")
def customer(gateway: GatewayProcess) -> Customer:
    name = "proof-project-" + secrets.token_hex(6)
    project_id = gateway.create_project(name, "--balance", "5")
    return Customer(project_id, name, gateway.create_key(project_id, "inference,receipts"))


def chat(http: httpx.Client, key: str, content: str = "hi") -> str:
    """A billed chat completion on echo-1; its receipt id."""
    body = {"model": "echo-1", "messages": [{"role": "user", "content": content}]}
    response = http.post("/v1/chat/completions", headers=bearer(key), json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-receipt-id"]


def wait_proof(http: httpx.Client, receipt_id: str) -> dict:
    """The proof document, which must be integrated within a second of the response."""
    deadline = time.monotonic() + INTEGRATION_DEADLINE_S
    while True:
        response = http.get(f"/api/proofs/{receipt_id}")
        if response.status_code == 200:
            return response.json()
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "pending"
        assert response.headers["retry-after"] == "1"
        assert time.monotonic() < deadline, "the receipt was not integrated within a second"
        time.sleep(0.02)


def verify(*args: str) -> tuple[int, dict | None, str]:
    """`gateway verify ARGS`: (exit code, the --json object or None, all text output)."""
    # Run from a folder without a config.toml, and without GATEWAY_CONFIG: the checkout's
    # own config (and a signing key `make run` made there) must not become the trusted key.
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_CONFIG"}
    done = subprocess.run(
        [GATEWAY, "verify", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tempfile.gettempdir(),
        env=env,
    )
    parsed = orjson.loads(done.stdout) if "--json" in args and done.stdout.strip() else None
    return done.returncode, parsed, done.stdout + done.stderr
