"""`make dist` builds one executable; copied alone into an empty folder, with no virtualenv
and a bare PATH, it serves the embedded defaults, passes the README's first requests and
serves its console (sign-in, script and style: the package's data files are inside)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fake_bedrock import FakeBedrock
from tests.support.fake_gemini import FakeGemini, FakeVertex, model_block
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


def run(folder: Path, *args: str, input: str | None = None, env: dict | None = None) -> dict:
    done = subprocess.run(
        ["./gateway", *args, "--json"],
        cwd=folder,
        env=env or BARE_ENV,
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


CONSOLE_ASSETS = {  # what the page links to, and the content type it must be served with
    r'<script src="([^"]+)"': "text/javascript",
    r'<link rel="stylesheet" href="([^"]+)"': "text/css",
}


def check_the_console(url: str, email: str, password: str) -> None:
    """Sign in, open the console's first page, and load the script and style it links."""
    with httpx.Client(base_url=url, timeout=30) as console:
        signed_in = console.post("/console/api/login", json={"email": email, "password": password})
        assert signed_in.status_code == 200, signed_in.text
        page = console.get("/console", follow_redirects=True)
        assert page.status_code == 200 and email in page.text
        for pattern, content_type in CONSOLE_ASSETS.items():
            path = re.search(pattern, page.text).group(1)
            asset = console.get(path)
            assert asset.status_code == 200, (path, asset.text)
            assert asset.headers["content-type"].startswith(content_type), asset.headers
            shipped = ROOT / "gateway" / "console" / "static" / path.rsplit("/", 1)[-1]
            assert asset.content == shipped.read_bytes()


def wait_healthy(server: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert server.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_the_binary_alone_serves_the_first_requests(binary, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    shutil.copy2(binary, folder / "gateway")
    project = run(folder, "projects", "create", "demo", "--balance", "5")["id"]
    key = run(folder, "keys", "create", "--project", project, "--scopes", "inference,receipts")[
        "key"
    ]
    password = "correct horse battery staple"
    run(folder, "users", "create", "owner@example.com", "--password-stdin", input=password + "\n")
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
        wait_healthy(server, url, tmp_path / "serve.log")
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
        check_the_console(url, "owner@example.com", password)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    assert sorted(p.name for p in folder.iterdir()) == ["data", "gateway"]
    assert "embedded defaults" in (tmp_path / "serve.log").read_text()


def test_the_binary_carries_every_provider_kinds_libraries(binary, tmp_path):
    """The kinds' vendor libraries and the price catalog, imported only when configured,
    are inside: Signature V4 (botocore), a service-account token (google-auth) and the
    genai-prices dataset serve from the binary alone, against the vendor-checking fakes."""
    folder = tmp_path / "kinds"
    folder.mkdir()
    shutil.copy2(binary, folder / "gateway")
    port = free_port()
    with FakeBedrock() as bedrock, FakeVertex() as vertex, FakeGemini() as gemini:
        config, env = f"[server]\nport = {port}\n", dict(BARE_ENV)
        for name, fake in (("bed", bedrock), ("vtx", vertex), ("gem", gemini)):
            block, variables = fake.provider_config(name)
            config += block + model_block(f"{name}/normal", name, "normal")
            env |= variables
        config += (
            '[providers.local]\nkind = "echo"\n'
            '[models.catalogued]\nprovider = "local"\nupstream = "echo-1"\n'
            'prices = "catalog"\ncatalog_id = "anthropic/claude-sonnet-4-5"\n'
        )
        (folder / "config.toml").write_text(config)
        project = run(folder, "projects", "create", "kinds", "--balance", "5", env=env)["id"]
        key = run(folder, "keys", "create", "--project", project, "--scopes", "inference", env=env)
        server = subprocess.Popen(
            ["./gateway", "serve"],
            cwd=folder,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "kinds.log").open("wb"),
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(server, url, tmp_path / "kinds.log")
            headers = {"Authorization": f"Bearer {key['key']}"}
            for model in ("bed/normal", "vtx/normal", "gem/normal", "catalogued"):
                for stream in (False, True):
                    body = {
                        "model": model,
                        "stream": stream,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    done = httpx.post(
                        url + "/v1/chat/completions", json=body, headers=headers, timeout=30
                    )
                    assert done.status_code == 200, (model, stream, done.text)
                    assert "x-receipt-id" in done.headers
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)
    assert bedrock.sent() and vertex.sent() and gemini.sent()
