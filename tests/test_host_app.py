"""A host application with its own `storage` and `pipeline` modules embeds the gateway, and
builds its own chain from the stages, each in a uvicorn process of its own on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.errors import assert_error
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.http import bearer, chat_body

HOST_FOLDER = Path(__file__).parent / "support" / "host_app"


@pytest.fixture
def host(tmp_path):
    """Start `host_main:<app>` from the host's folder; yield its base URL."""
    processes = []

    def start(app: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", f"host_main:{app}", "--port", str(port)],
            cwd=HOST_FOLDER,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"{app}.log", "wb"),
        )
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / f"{app}.log").read_text()
            try:
                httpx.get(url + "/", timeout=1)
                return url
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError("the host app did not start")

    yield start
    for process in processes:
        process.terminate()
        process.wait(10)


def test_the_gateway_mounts_in_a_host_with_its_own_storage_module(host, tmp_path):
    (tmp_path / "gw").mkdir()
    deployment = GatewayProcess(tmp_path / "gw")
    key = deployment.create_key(deployment.create_project("host", "--balance", "1"), "inference")
    url = host("embedded_app", {"GATEWAY_CONFIG": str(deployment.config_path)})
    assert httpx.get(url + "/").text == "the host app"
    done = httpx.post(url + "/llm/v1/chat/completions", json=chat_body(), headers=bearer(key))
    assert done.status_code == 200, done.text
    assert done.headers["x-receipt-id"].startswith("rcpt_")


def test_a_custom_chain_around_the_hosts_endpoint_meters_with_the_memory_ports(host):
    url = host("custom")
    ask = {"model": "tiny", "question": "why"}
    first = httpx.post(url + "/v1/answer", json=ask, headers=bearer("host-secret-key"))
    assert first.status_code == 200, first.text
    assert first.json()["answer"] == "WHY"
    receipt = first.headers["x-receipt-id"]
    assert httpx.get(url + "/books").json() == {
        "balance": 900,
        "reserved": 0,
        "receipts": [receipt],
    }
    # 900 left cannot cover the 1000 hold: refused before the handler, nothing charged.
    second = httpx.post(url + "/v1/answer", json=ask, headers=bearer("host-secret-key"))
    assert_error(second, 402, "insufficient_balance")
    assert httpx.get(url + "/books").json()["balance"] == 900
    # The stages are all there: unknown key, wrong scope-less model, bad body.
    assert_error(
        httpx.post(url + "/v1/answer", json=ask, headers=bearer("nope")), 401, "invalid_api_key"
    )
    other = {"model": "big", "question": "why"}
    assert_error(
        httpx.post(url + "/v1/answer", json=other, headers=bearer("host-secret-key")),
        404,
        "model_not_found",
    )
    assert_error(
        httpx.post(url + "/v1/answer", json={"model": "tiny"}, headers=bearer("host-secret-key")),
        400,
        "invalid_request",
        param="question",
    )
