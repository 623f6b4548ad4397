"""A gateway with traces on, in front of a fake OpenAI upstream that records the
`traceparent` it gets, exporting to a fake collector."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from tests.support.fake_collector import FakeCollector
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import OPENAI_CREDENTIAL, UPSTREAM_ENV
from tests.telemetry.configs import OTEL_ENV, telemetry, upstream_config


@dataclass
class Traced:
    gateway: GatewayProcess
    client: httpx.Client  # with `key`, a key of `project`
    key: str
    project: str


@pytest.fixture(scope="module")
def collector():
    with FakeCollector() as fake:
        yield fake


@pytest.fixture(scope="module")
def upstream():
    with FakeOpenAI(OPENAI_CREDENTIAL) as fake:
        yield fake


@pytest.fixture(scope="module")
def traced(tmp_path_factory, collector, upstream):
    env = {
        **UPSTREAM_ENV,
        **OTEL_ENV,
        # Neither moves the export: otlp_endpoint names where spans go.
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url + "/not-here",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url + "/nor-here/v1/traces",
        "PYTHONPROFILEIMPORTTIME": "1",  # the log shows what the gateway imported
    }
    config = telemetry(collector.url) + upstream_config(upstream.url)
    with GatewayProcess(tmp_path_factory.mktemp("traced"), extra_config=config, env=env) as gw:
        project = gw.create_project("traced", "--balance", "100")
        key = gw.create_key(project, "inference,receipts")
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=20) as client:
            yield Traced(gw, client, key, project)
