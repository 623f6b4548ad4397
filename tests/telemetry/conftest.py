"""A gateway with traces on, in front of a fake OpenAI upstream that records the
`traceparent` it gets, exporting to a fake collector."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from tests.support.fake_collector import FakeCollector
from tests.support.fake_openai import FakeOpenAI
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import NO_BREAKER, OPENAI_CREDENTIAL, UPSTREAM_ENV

# What the SDK reads to refine the export; OTEL_BSP_SCHEDULE_DELAY: batches every 50 ms.
OTEL_ENV = {
    "OTEL_BSP_SCHEDULE_DELAY": "50",
    "OTEL_SERVICE_NAME": "gateway-under-test",
    "OTEL_EXPORTER_OTLP_HEADERS": "x-collector-token=collector-token-9f1",
}


def _model(model_id: str, upstream: str, fallbacks: tuple[str, ...] = (), extra: str = "") -> str:
    chain = ", ".join(f'{{ provider = "tr-oa", upstream = "{u}" }}' for u in fallbacks)
    return f"""
[models."{model_id}"]
provider = "tr-oa"
upstream = "{upstream}"
fallbacks = [{chain}]
input_price_per_mtok = "0.50"
{extra}
"""


def traced_config(collector_url: str, upstream_url: str) -> str:
    priced = 'output_price_per_mtok = "1.50"'
    return (
        f"""
[telemetry]
otlp_endpoint = "{collector_url}"

[providers.tr-oa]
kind = "openai"
base_url = "{upstream_url}/v1"
api_key_env = "FAKE_OPENAI_KEY"
"""
        + NO_BREAKER
        + _model("tr/chat", "normal", extra=priced)
        + _model("tr/fallback", "fault-500", ("normal",), extra=priced)
        + _model("tr/down", "fault-500", extra=priced)
        + _model("tr/slow-stream", "slow-stream", extra=priced)
        + _model("tr/embed", "normal", extra='mode = "embedding"')
    )


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
    config = traced_config(collector.url, upstream.url)
    with GatewayProcess(tmp_path_factory.mktemp("traced"), extra_config=config, env=env) as gw:
        project = gw.create_project("traced", "--balance", "100")
        key = gw.create_key(project, "inference,receipts")
        headers = {"authorization": f"Bearer {key}"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=20) as client:
            yield Traced(gw, client, key, project)
