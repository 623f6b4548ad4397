"""The configurations of the telemetry tests' gateways: the OTEL_* variables they refine
the export with, `[telemetry]`, and a provider at the fake OpenAI upstream."""

from __future__ import annotations

from tests.support.inference import NO_BREAKER

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


def telemetry(collector_url: str) -> str:
    return f'\n[telemetry]\notlp_endpoint = "{collector_url}"\n'


def upstream_config(upstream_url: str) -> str:
    """A provider at the fake upstream, and models that fail, fall back and stream there."""
    priced = 'output_price_per_mtok = "1.50"'
    return (
        f"""
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
