"""GET /metrics after real traffic, parsed with prometheus_client's own parser: the counters
say exactly what was sent, labels are route templates, and money matches the receipts."""

from __future__ import annotations

import time
from decimal import Decimal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.errors import assert_error
from tests.support.gateway_process import GatewayProcess
from tests.support.http import bearer, chat_body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def gateway(tmp_path):
    process = GatewayProcess(tmp_path)
    process.start()
    yield process
    process.stop()


def test_counters_match_the_traffic_sent(gateway):
    rich = gateway.create_key(
        gateway.create_project("rich", "--balance", "5"), "inference,receipts"
    )
    poor = gateway.create_key(gateway.create_project("poor", "--balance", "0.000001"), "inference")
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        receipts = []
        for _ in range(3):
            done = http.post("/v1/chat/completions", json=chat_body(), headers=bearer(rich))
            assert done.status_code == 200
            receipts.append(done.headers["x-receipt-id"])
        assert_error(
            http.post("/v1/chat/completions", json=chat_body(), headers=bearer(poor)),
            402,
            "insufficient_balance",
        )
        assert_error(
            http.post("/v1/chat/completions", json=chat_body(), headers=bearer("proj_live_x")),
            401,
            "invalid_api_key",
        )
        assert_error(http.get("/v1/nope/rcpt_secret_path_part"), 404, "not_found")
        costs = [
            Decimal(http.get(f"/v1/receipts/{r}", headers=bearer(rich)).json()["cost"])
            for r in receipts
        ]
        time.sleep(1)  # the log integrates every 250 ms
        response = http.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    chat = "/v1/chat/completions"
    assert value(found, "gateway_requests_total", endpoint=chat, method="POST", status="200") == 3
    assert value(found, "gateway_requests_total", endpoint=chat, method="POST", status="402") == 1
    assert value(found, "gateway_requests_total", endpoint=chat, method="POST", status="401") == 1
    assert (
        value(found, "gateway_requests_total", endpoint="unmatched", method="GET", status="404")
        == 1
    )
    assert "rcpt_secret_path_part" not in response.text  # never a raw path
    assert value(found, "gateway_request_duration_seconds_count", endpoint=chat) == 5
    assert value(found, "gateway_overhead_seconds_count", endpoint=chat) == 5
    assert value(found, "gateway_reservations_refused_total", reason="insufficient_balance") == 1
    spent = value(found, "gateway_spend_micro_units_total", subject="echo-1")
    assert spent == sum(costs) * 1_000_000 > 0
    assert value(found, "gateway_open_holds") == 0
    assert value(found, "gateway_log_size") == 3
    assert 0 <= value(found, "gateway_log_integration_lag_seconds") < 5


def test_metrics_can_be_turned_off(tmp_path):
    process = GatewayProcess(tmp_path, extra_config="\n[metrics]\nenabled = false\n")
    process.start()
    try:
        assert_error(httpx.get(process.url + "/metrics"), 404, "not_found")
    finally:
        process.stop()
