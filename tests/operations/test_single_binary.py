"""`make dist` builds one executable; copied alone into an empty folder, with no virtualenv
and a bare PATH, it serves the embedded defaults and passes the README's first requests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.gateway_process import free_port
from tests.support.inference import sse_payloads

ROOT = Path(__file__).resolve().parents[2]
BARE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    built = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["make", "-s", "dist", f"DIST={built}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return built / "gateway"


def run(folder: Path, *args: str) -> dict:
    done = subprocess.run(
        ["./gateway", *args, "--json"],
        cwd=folder,
        env=BARE_ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_binary_alone_serves_the_first_requests(binary, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    shutil.copy2(binary, folder / "gateway")
    project = run(folder, "projects", "create", "demo", "--balance", "5")["id"]
    key = run(folder, "keys", "create", "--project", project, "--scopes", "inference,receipts")[
        "key"
    ]
    port = free_port()
    server = subprocess.Popen(
        ["./gateway", "serve", "--port", str(port)],
        cwd=folder,
        env=BARE_ENV,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve.log").open("wb"),
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        body = {
            "model": "echo-1",
            "stream": True,
            "messages": [{"role": "user", "content": "Hello from the gateway"}],
        }
        done = httpx.post(
            url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert done.status_code == 200
        assert sse_payloads(done.content)[-1] == "[DONE]"
        receipt = httpx.get(
            f"{url}/v1/receipts/{done.headers['x-receipt-id']}",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert receipt.status_code == 200 and receipt.json()["status"] == "succeeded"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    assert sorted(p.name for p in folder.iterdir()) == ["data", "gateway"]
    assert "embedded defaults" in (tmp_path / "serve.log").read_text()
