"""What `gateway serve` writes: the start-up summary, one access line per request in the
chosen format, and never a key, a prompt or an output."""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import pytest

from tests.sandbox_e2e.helpers import Tenant, sandbox_config
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.http import bearer, chat_body

PROMPT = "a prompt marker 7f3e9c that must never be logged"
UNSET_PROVIDER = """
[providers.elsewhere]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "GATEWAY_TEST_CREDENTIAL_NEVER_SET"

[models."far-1"]
provider = "elsewhere"
input_price_per_mtok = "1"
output_price_per_mtok = "1"
"""


def serve(folder, log_format: str) -> GatewayProcess:
    process = GatewayProcess(
        folder, server_extra=f'log_format = "{log_format}"', extra_config=UNSET_PROVIDER
    )
    return process.start()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_one_access_line_per_request_without_secrets(tmp_path, log_format):
    process = serve(tmp_path, log_format)
    try:
        project = process.create_project("logs", "--balance", "1")
        key = process.create_key(project, "inference")
        body = chat_body(messages=[{"role": "user", "content": PROMPT}])
        done = httpx.post(process.url + "/v1/chat/completions", json=body, headers=bearer(key))
        assert done.status_code == 200
        missing = httpx.get(process.url + "/v1/nope", headers=bearer(key))
    finally:
        process.stop()
    log = process.log()
    assert PROMPT not in log and key not in log and key[18:] not in log
    assert done.json()["choices"][0]["message"]["content"] not in log
    request_id, receipt = done.headers["x-request-id"], done.headers["x-receipt-id"]
    lines = [line for line in log.splitlines() if request_id in line]
    assert len(lines) == 1
    if log_format == "json":
        records = [json.loads(line) for line in log.splitlines()]  # every line is JSON
        entry = next(r for r in records if r.get("request_id") == request_id)
        assert entry["method"] == "POST" and entry["path"] == "/v1/chat/completions"
        assert entry["status"] == 200 and entry["model"] == "echo-1"
        assert entry["project_id"] == project and entry["receipt_id"] == receipt
        assert float(entry["cost"]) > 0 and entry["duration_ms"] > 0
        other = next(r for r in records if r.get("request_id") == missing.headers["x-request-id"])
        assert other["status"] == 404 and other["receipt_id"] is None
    else:
        line = lines[0]
        assert f"{request_id} POST /v1/chat/completions 200 " in line
        for part in ("model=echo-1", f"project={project}", f"receipt={receipt}", "cost=0.0"):
            assert part in line


def test_a_path_cannot_write_a_line_of_its_own(tmp_path):
    """uvicorn decodes %0a in a path: the text format escapes it, so that a request with
    no key cannot forge an access line (here, one that bills a project)."""
    process = serve(tmp_path, "text")
    forged = "2026-11-27 09:00:00 INFO gateway.access req_0 POST /v1/chat/completions 200"
    try:
        path = "/x%0a" + forged.replace(" ", "%20") + "%20project=proj_victim"
        answer = httpx.get(process.url + path)
        assert answer.status_code == 404
    finally:
        process.stop()
    lines = process.log().splitlines()
    assert not [line for line in lines if line.startswith(forged)]
    line = next(line for line in lines if answer.headers["x-request-id"] in line)
    # Percent-encoded again: the path is one word, and no word of it passes for a field.
    assert " GET /x%0A2026-11-27%2009:00:00%20INFO%20" in line
    assert "%20project=proj_victim 404 " in line and " project=" not in line


def test_the_start_up_summary_names_what_is_ready_and_why_not(tmp_path):
    process = serve(tmp_path, "text")
    process.stop()
    log = process.log()
    assert f"listening on http://127.0.0.1:{process.port}" in log
    assert f"console: http://127.0.0.1:{process.port}/console" in log
    assert f"config {process.config_path}" in log
    assert "provider local (echo): ready" in log
    assert (
        "provider elsewhere (openai): not ready: GATEWAY_TEST_CREDENTIAL_NEVER_SET is not set"
        in log
    )
    assert "model echo-1 via local: ready" in log
    assert (
        "model far-1 via elsewhere: not ready: GATEWAY_TEST_CREDENTIAL_NEVER_SET is not set" in log
    )
    assert "model echo-off via local: not ready: marked available = false" in log


def test_the_console_url_is_the_public_one_when_set(tmp_path):
    process = GatewayProcess(tmp_path, server_extra='public_url = "https://gw.example.com/ai/"')
    process.start().stop()
    assert "console: https://gw.example.com/ai/console" in process.log()


RFC3339_UTC = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")
TEXT_LINE = re.compile(r"\A\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+ ")
PROBE_INTERVALS = 3  # the gateway checks its node's /healthz every 2 s


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_every_line_of_serve_and_its_spawned_node_follows_log_format(tmp_path, log_format):
    """Hardening III: uvicorn's own lines and the node's (spawn = true) in the configured
    format, JSON times in UTC with Z, and GET /healthz never logged: neither the
    clients' probes of the gateway nor the gateway's probes of its node."""
    node = sandbox_config(f"http://127.0.0.1:{free_port()}", "data/sandbox-secret", spawn=True)
    process = GatewayProcess(
        tmp_path, server_extra=f'log_format = "{log_format}"', extra_config=node
    ).start()
    try:
        tenant = Tenant(process)
        sandbox = tenant.sandbox("python")
        with httpx.Client(timeout=30) as client:
            for _ in range(3):
                assert client.get(process.url + "/healthz").status_code == 200
            ran = tenant.execute(client, sandbox_id=sandbox, runtime="python", code="print(1)")
            time.sleep(2 * PROBE_INTERVALS)
    finally:
        process.stop()
    lines = process.log().splitlines()
    assert "healthz" not in process.log()
    if log_format == "json":
        records = [json.loads(line) for line in lines]  # every line, or this fails
        assert all(RFC3339_UTC.match(record["time"]) for record in records), lines
        loggers = {record["logger"] for record in records}
        executed = [r for r in records if r.get("path") == "/v1/sandbox/executions"]
        assert [r["status"] for r in executed] == [ran.status_code]
        ready = next(r for r in records if r["logger"] == "gateway.sandbox.node")
        assert ready["isolation"]["runtimes"], ready  # a record, not a Python dict in text
    else:
        assert all(TEXT_LINE.match(line) for line in lines), lines
        loggers = {line.split(" ")[3] for line in lines}
    # The node's own lines and uvicorn's, not only the gateway's.
    assert {"gateway", "gateway.access", "gateway.sandbox.node", "uvicorn.error"} <= loggers


def test_a_failed_start_says_why_in_json_too(tmp_path):
    """The last words of `gateway serve` follow log_format like the rest."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = sandbox_config(f"http://127.0.0.1:{port}", "data/sandbox-secret", spawn=True)
        process = GatewayProcess(tmp_path, server_extra='log_format = "json"', extra_config=node)
        with pytest.raises(RuntimeError, match="exited at start-up"):
            process.start()
    records = [json.loads(line) for line in process.log().splitlines()]
    assert f"cannot listen on 127.0.0.1:{port}" in records[-1]["message"]
    assert records[-1]["level"] == "error"
