"""Traces off unless `[telemetry] otlp_endpoint` says so, and flushed at shutdown when on.

Whether a process imported OpenTelemetry is read from the interpreter itself:
PYTHONPROFILEIMPORTTIME (`-X importtime`) makes it write a line to stderr for every
module it imports, whenever that happens, and the gateway's stderr is its log.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import httpx

from tests.support.fake_collector import FakeCollector
from tests.support.gateway_process import GATEWAY, GatewayProcess
from tests.support.inference import UPSTREAM_ENV
from tests.telemetry.configs import OTEL_ENV, telemetry, upstream_config

IMPORT_TIMES = {"PYTHONPROFILEIMPORTTIME": "1"}


def _imported_opentelemetry(stderr: str) -> list[str]:
    assert "import time:" in stderr  # the interpreter did report its imports
    return [line for line in stderr.splitlines() if "opentelemetry" in line]


def _chat(gateway: GatewayProcess, key: str, model: str, marker: str, stream: bool = False):
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": marker}]}
    headers = {"authorization": f"Bearer {key}", "traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    response = httpx.post(
        gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=20
    )
    assert response.status_code == 200, response.text
    return response


def test_otel_variables_alone_neither_export_nor_import_anything(tmp_path, upstream):
    with FakeCollector() as collector:
        env = {
            **UPSTREAM_ENV,
            **OTEL_ENV,
            **IMPORT_TIMES,
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/v1/traces",
            "OTEL_TRACES_EXPORTER": "otlp",
        }
        gateway = GatewayProcess(tmp_path, extra_config=upstream_config(upstream.url), env=env)
        with gateway:
            project = gateway.create_project("untraced", "--balance", "10")
            key = gateway.create_key(project)
            marker = f"prompt-{uuid.uuid4().hex}"
            _chat(gateway, key, "tr/chat", marker)
            _chat(gateway, key, "tr/fallback", marker, stream=True)
            time.sleep(0.3)  # > OTEL_BSP_SCHEDULE_DELAY: a batch would have gone
        # Stopped: an exporter would have flushed.
        assert collector.exports == [] and collector.refused_paths == []
    assert _imported_opentelemetry(gateway.log()) == []
    # The client's traceparent is not passed on either: no span, no context.
    assert all("traceparent" not in r.headers for r in upstream.sent(marker=marker))
    cli = subprocess.run(
        [GATEWAY, "projects", "list", "--config", str(gateway.config_path), "--json"],
        capture_output=True,
        text=True,
        env=gateway.env,
        timeout=60,
        check=True,
    )
    assert _imported_opentelemetry(cli.stderr) == []


def test_spans_left_in_the_batch_are_exported_at_shutdown(tmp_path, upstream):
    with FakeCollector() as collector:
        env = {**UPSTREAM_ENV, "OTEL_BSP_SCHEDULE_DELAY": "600000"}  # no batch for 10 minutes
        config = telemetry(collector.url) + upstream_config(upstream.url)
        with GatewayProcess(tmp_path, extra_config=config, env=env) as gateway:
            project = gateway.create_project("traced", "--balance", "10")
            key = gateway.create_key(project)
            response = _chat(gateway, key, "tr/chat", "hello")
            time.sleep(0.3)
            assert collector.exports == []
        request_id = response.headers["x-request-id"]
        spans = collector.spans()
        [root] = [s for s in spans if s.attributes.get("gateway.request_id") == request_id]
        assert root.trace_id == "ab" * 16 and root.parent_span_id == "cd" * 8
        assert {s.name for s in spans if s.trace_id == root.trace_id} == {
            "POST /v1/chat/completions",
            "chat normal",
            "settlement",
        }
