"""Fallbacks, circuit breakers and the stale keep-alive retry, end to end: real gateway
processes in front of the fake upstreams (decisions.md, "Routing and operations").

Each test tells its own requests apart at the fakes by a marker in the prompt, so the
fakes' shared request lists say what reached which upstream.
"""

from __future__ import annotations

import time
import uuid

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.errors import assert_error
from tests.support.fake_upstream import PAUSE_S, REPLY, SECRET, SLOW_S
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.inference import (
    ANTHROPIC_CREDENTIAL,
    OPENAI_CREDENTIAL,
    UPSTREAM_ENV,
    sse_payloads,
)

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
TIMEOUT_S = 1.0  # the gateway's upstream timeout here, well under the fake's SLOW_S
COOLDOWN_S = 1.0
BREAKER_FAILURES = 3


def _providers(openai_url: str, anthropic_url: str, prefix: str) -> str:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    return f"""
[providers.{prefix}-dead]
kind = "openai"
base_url = "{dead}"
api_key_env = "FAKE_OPENAI_KEY"

[providers.{prefix}-oa]
kind = "openai"
base_url = "{openai_url}/v1"
api_key_env = "FAKE_OPENAI_KEY"

[providers.{prefix}-an]
kind = "anthropic"
base_url = "{anthropic_url}"
api_key_env = "FAKE_ANTHROPIC_KEY"
"""


def _model(model_id: str, provider: str, upstream: str, fallbacks=()) -> str:
    chain = ", ".join(f'{{ provider = "{p}", upstream = "{u}" }}' for p, u in fallbacks)
    return f"""
[models."{model_id}"]
provider = "{provider}"
upstream = "{upstream}"
fallbacks = [{chain}]
input_price_per_mtok = "0.50"
output_price_per_mtok = "1.50"
"""


def _start(folder, config: str, server_extra: str = "") -> tuple[GatewayProcess, httpx.Client]:
    process = GatewayProcess(
        folder,
        extra_config=config,
        env=UPSTREAM_ENV,
        gateway_timeout_s=TIMEOUT_S,
        server_extra=server_extra,
    ).start()
    project = process.cli("projects", "create", "routing", "--balance", "1000")["id"]
    key = process.create_key(project, "inference,receipts")
    client = httpx.Client(
        base_url=process.url, headers={"authorization": f"Bearer {key}"}, timeout=20
    )
    return process, client


@pytest.fixture(scope="module")
def routed(tmp_path_factory, fake_openai, fake_anthropic):
    """Models with fallbacks; the breakers never open here (they are tested below)."""
    config = _providers(fake_openai.url, fake_anthropic.url, "fb")
    config += "\n[routing]\nbreaker_failures = 1000000\n"
    config += _model("fb/down", "fb-dead", "normal", [("fb-oa", "normal")])
    config += _model("fb/down-an", "fb-dead", "normal", [("fb-an", "normal")])
    config += _model("fb/400", "fb-oa", "fault-400", [("fb-an", "normal")])
    config += _model("fb/429", "fb-oa", "fault-429", [("fb-an", "normal")])
    config += _model("fb/500", "fb-an", "fault-500", [("fb-oa", "normal")])
    config += _model("fb/401", "fb-oa", "fault-401", [("fb-an", "normal")])
    config += _model("fb/401-alone", "fb-oa", "fault-401")
    config += _model("fb/dead-then-slow", "fb-dead", "normal", [("fb-oa", "slow")])
    config += _model("fb/slow-then-dead", "fb-oa", "slow", [("fb-dead", "normal")])
    config += _model("fb/stale", "fb-oa", "stale-keepalive")
    config += _model("fb/normal", "fb-oa", "normal")
    config += _model("fb/slow-stream", "fb-oa", "slow-stream")
    process, client = _start(tmp_path_factory.mktemp("routed"), config)
    yield process, client
    client.close()
    process.stop()


@pytest.fixture(scope="module")
def breaking(tmp_path_factory, fake_openai, fake_anthropic):
    """A small breaker: open after 3 failures, a 1 s cool-down; JSON logs."""
    config = _providers(fake_openai.url, fake_anthropic.url, "br")
    config += (
        f"\n[routing]\nbreaker_failures = {BREAKER_FAILURES}\nbreaker_cooldown_s = {COOLDOWN_S}\n"
    )
    config += _model("br/bad", "br-oa", "fault-500")
    config += _model("br/good", "br-oa", "normal")
    config += _model("br/bad-an", "br-an", "fault-503")
    config += _model("br/an-then-oa", "br-an", "normal", [("br-oa", "normal")])
    folder = tmp_path_factory.mktemp("breaking")
    process, client = _start(folder, config, server_extra='log_format = "json"')
    yield process, client
    client.close()
    process.stop()


@pytest.fixture(scope="module")
def cutting(tmp_path_factory, fake_openai, fake_anthropic):
    """Streams cut midway; a breaker that opens after 2 failures and stays open 60 s."""
    config = _providers(fake_openai.url, fake_anthropic.url, "ms")
    config += "\n[routing]\nbreaker_failures = 2\nbreaker_cooldown_s = 60\n"
    config += _model("ms/cut", "ms-oa", "cut-mid-stream")
    config += _model("ms/good", "ms-oa", "normal")
    config += _model("ms/an-cut", "ms-an", "cut-mid-stream")
    process, client = _start(tmp_path_factory.mktemp("cutting"), config, 'log_format = "json"')
    yield process, client
    client.close()
    process.stop()


def body(endpoint: str, model: str, stream: bool, marker: str) -> dict:
    prompt = f"Tell me something. {marker}"
    if endpoint == "chat":
        return {"model": model, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    return {"model": model, "stream": stream, "input": prompt}


def _text(endpoint: str, response: httpx.Response, stream: bool) -> str:
    if not stream:
        answer = response.json()
        if endpoint == "chat":
            return answer["choices"][0]["message"]["content"]
        return answer["output"][0]["content"][0]["text"]
    payloads = [p for p in sse_payloads(response.content) if isinstance(p, dict)]
    if endpoint == "chat":
        return "".join(
            (c.get("delta") or {}).get("content") or ""
            for p in payloads
            for c in p.get("choices", [])
        )
    return "".join(
        p.get("delta", "") for p in payloads if p.get("type") == "response.output_text.delta"
    )


def _marker() -> str:
    return f"mark-{uuid.uuid4().hex[:12]}"


def _metrics(process: GatewayProcess) -> dict[tuple[str, tuple], float]:
    text = httpx.get(process.url + "/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _sample(snapshot, name: str, **labels) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


# --- fallbacks ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize(
    ("model", "served_by", "fake"),
    [("fb/down", "fb-oa", "fake_openai"), ("fb/down-an", "fb-an", "fake_anthropic")],
)
def test_primary_down_is_served_by_the_fallback(
    routed, request, model, served_by, fake, endpoint, stream
):
    process, client = routed
    marker = _marker()
    response = client.post(PATHS[endpoint], json=body(endpoint, model, stream, marker))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == served_by
    assert _text(endpoint, response, stream) == REPLY
    assert len(request.getfixturevalue(fake).sent(marker=marker)) == 1
    # Billed once, at the model's prices, under the model's name.
    receipt = client.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded" and receipt["model"] == model
    assert receipt["provider"] == served_by  # the receipt names who served
    # The access log line names the provider that served.
    _wait_for(
        lambda: any(
            response.headers["x-request-id"] in line and served_by in line
            for line in process.log().splitlines()
            if "gateway.access" in line
        )
    )


def test_a_400_from_the_primary_is_not_retried(routed, fake_openai, fake_anthropic):
    _, client = routed
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "fb/400", False, marker))
    assert_error(response, 400, "invalid_request")
    assert SECRET not in response.text
    assert len(fake_openai.sent(marker=marker)) == 1
    assert fake_anthropic.sent(marker=marker) == []  # the fallback saw nothing
    assert "x-gateway-provider" not in response.headers


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("model", "served_by"), [("fb/429", "fb-an"), ("fb/500", "fb-oa")])
def test_429_and_5xx_fall_back(routed, fake_openai, fake_anthropic, model, served_by, stream):
    _, client = routed
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", model, stream, marker))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == served_by
    assert len(fake_openai.sent(marker=marker)) == 1
    assert len(fake_anthropic.sent(marker=marker)) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("model", "status", "error_type"),
    [("fb/dead-then-slow", 504, "provider_timeout"), ("fb/slow-then-dead", 502, "provider_error")],
)
def test_when_every_attempt_fails_the_client_gets_the_last_error(
    routed, model, status, error_type, stream
):
    _, client = routed
    started = time.monotonic()
    response = client.post(PATHS["chat"], json=body("chat", model, stream, _marker()))
    assert_error(response, status, error_type)
    assert time.monotonic() - started < SLOW_S  # one gateway timeout, not the fake's pace
    assert "x-receipt-id" not in response.headers  # nothing billed


@pytest.mark.parametrize(("model", "status"), [("fb/401-alone", 502), ("fb/401", 200)])
def test_credentials_rejected_is_logged_by_provider_never_the_key(
    routed, fake_anthropic, model, status
):
    """A refused credential is the operator's: 502 alone, and a fallback trigger."""
    process, client = routed
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", model, False, marker))
    assert response.status_code == status
    if status == 502:
        assert_error(response, 502, "provider_error")
    assert len(fake_anthropic.sent(marker=marker)) == (status == 200)
    request_id = response.headers["x-request-id"]
    _wait_for(lambda: f"request_id={request_id}" in process.log())
    lines = [line for line in process.log().splitlines() if request_id in line]
    assert any("credentials rejected by provider fb-oa" in line for line in lines), lines
    log = process.log()
    for secret in (OPENAI_CREDENTIAL, ANTHROPIC_CREDENTIAL, SECRET, marker):
        assert secret not in log


def test_stale_keep_alive_is_retried_once_on_a_fresh_connection(routed, fake_openai):
    process, client = routed
    before = _metrics(process)
    # A first request leaves a kept-alive connection in the gateway's pool...
    assert (
        client.post(PATHS["chat"], json=body("chat", "fb/normal", False, _marker())).status_code
        == 200
    )
    closed = fake_openai.stale_closed
    # ...which the fake treats as gone stale: it closes it when the next request comes.
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "fb/stale", False, marker))
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-provider"] == "fb-oa"
    assert fake_openai.stale_closed == closed + 1  # the pooled connection was met closed
    assert len(fake_openai.sent(marker=marker)) == 2  # and retried once, not more
    after = _metrics(process)
    failures = "gateway_upstream_failures_total"
    assert sum(
        v for (n, labels), v in after.items() if n == failures and ("provider", "fb-oa") in labels
    ) == sum(
        v for (n, labels), v in before.items() if n == failures and ("provider", "fb-oa") in labels
    )  # not counted as a failure


def test_metrics_count_attempts_and_failures(routed):
    process, client = routed
    before = _metrics(process)
    for stream in (False, True):
        response = client.post(PATHS["chat"], json=body("chat", "fb/down", stream, _marker()))
        assert response.status_code == 200
    response = client.post(PATHS["chat"], json=body("chat", "fb/400", False, _marker()))
    assert response.status_code == 400
    after = _metrics(process)

    def delta(name, **labels):
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    attempts, failures = "gateway_upstream_attempts_total", "gateway_upstream_failures_total"
    assert delta(attempts, provider="fb-dead") == 2
    assert delta(failures, provider="fb-dead", reason="unreachable") == 2
    assert delta(attempts, provider="fb-oa") == 3
    assert delta(failures, provider="fb-oa", reason="client_error") == 1
    assert delta(attempts, provider="fb-an") == 0
    assert _sample(after, "gateway_provider_breaker", provider="fb-dead") == 0  # closed


def test_time_waiting_on_the_upstream_is_not_overhead(routed):
    """ctx.upstream_seconds: the fake pauses PAUSE_S inside the stream; the request's
    latency includes it, the gateway's overhead does not."""
    process, client = routed
    endpoint = PATHS["chat"]
    before = _metrics(process)
    response = client.post(endpoint, json=body("chat", "fb/slow-stream", True, _marker()))
    assert response.status_code == 200
    _wait_for(
        lambda: (
            _sample(_metrics(process), "gateway_request_duration_seconds_count", endpoint=endpoint)
            > _sample(before, "gateway_request_duration_seconds_count", endpoint=endpoint)
        )
    )
    after = _metrics(process)
    latency = _sample(after, "gateway_request_duration_seconds_sum", endpoint=endpoint) - _sample(
        before, "gateway_request_duration_seconds_sum", endpoint=endpoint
    )
    overhead = _sample(after, "gateway_overhead_seconds_sum", endpoint=endpoint) - _sample(
        before, "gateway_overhead_seconds_sum", endpoint=endpoint
    )
    assert latency >= PAUSE_S
    assert overhead < PAUSE_S / 2, (latency, overhead)


# --- circuit breaker ---------------------------------------------------------------------


def _health(process: GatewayProcess) -> dict:
    response = httpx.get(process.url + "/healthz", timeout=10)
    assert response.status_code == 200
    return response.json()


def test_breaker_opens_skips_half_opens_and_closes(breaking, fake_openai):
    process, client = breaking
    assert _health(process)["providers"]["br-oa"] == {"breaker": "closed"}
    for _ in range(BREAKER_FAILURES):
        response = client.post(PATHS["chat"], json=body("chat", "br/bad", False, _marker()))
        assert_error(response, 502, "provider_error")
    # Each failure is one JSON log line naming the request, the provider and the reason.
    request_id = response.headers["x-request-id"]
    _wait_for(lambda: request_id in process.log())
    lines = [orjson.loads(line) for line in process.log().splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("logger") == "gateway.routing"]
    assert {"request_id": request_id, "provider": "br-oa", "reason": "server_error"}.items() <= (
        next(line for line in failed if line["request_id"] == request_id).items()
    )
    health = _health(process)
    assert health["status"] == "ok"
    assert health["providers"]["br-oa"] == {"breaker": "open"}
    assert _sample(_metrics(process), "gateway_provider_breaker", provider="br-oa") == 1

    # Open: skipped without a connection attempt; every provider of the model skipped → 503.
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "br/good", False, marker))
    assert_error(response, 503, "service_unavailable")
    assert 1 <= int(response.headers["retry-after"]) <= COOLDOWN_S
    assert fake_openai.sent(marker=marker) == []

    # After the cool-down: half-open, one trial, whose success closes it.
    time.sleep(COOLDOWN_S + 0.2)
    assert _health(process)["providers"]["br-oa"] == {"breaker": "half_open"}
    assert _sample(_metrics(process), "gateway_provider_breaker", provider="br-oa") == 2
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "br/good", True, marker))
    assert response.status_code == 200, response.text
    assert len(fake_openai.sent(marker=marker)) == 1
    assert _health(process)["providers"]["br-oa"] == {"breaker": "closed"}


def test_a_failed_trial_opens_the_breaker_again(breaking, fake_anthropic):
    process, client = breaking
    for _ in range(BREAKER_FAILURES):
        client.post(PATHS["chat"], json=body("chat", "br/bad-an", False, _marker()))
    assert _health(process)["providers"]["br-an"] == {"breaker": "open"}
    # With br-an open, its model with a fallback is served by the fallback, br-an untouched.
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "br/an-then-oa", False, marker))
    assert response.headers["x-gateway-provider"] == "br-oa"
    assert fake_anthropic.sent(marker=marker) == []
    time.sleep(COOLDOWN_S + 0.2)
    marker = _marker()
    response = client.post(PATHS["chat"], json=body("chat", "br/bad-an", False, marker))
    assert_error(response, 502, "provider_error")  # the trial, and it failed
    assert len(fake_anthropic.sent(marker=marker)) == 1
    assert _health(process)["providers"]["br-an"] == {"breaker": "open"}


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("endpoint", "model", "provider"),
    [("chat", "ms/cut", "ms-oa"), ("responses", "ms/an-cut", "ms-an")],
)
def test_a_stream_cut_midway_counts_against_its_provider(
    cutting, fake_openai, endpoint, model, provider
):
    """After the first byte no fallback is possible, but the failure is the provider's:
    logged, counted in upstream_failures, and against its breaker."""
    process, client = cutting
    before = _metrics(process)
    for _ in range(2):
        response = client.post(PATHS[endpoint], json=body(endpoint, model, True, _marker()))
        assert response.status_code == 200  # the stream had begun: the error is in-band
        payloads = [p for p in sse_payloads(response.content) if isinstance(p, dict)]
        assert any("error" in p or p.get("type") == "error" for p in payloads), payloads
    after = _metrics(process)
    failures = "gateway_upstream_failures_total"
    counted = {
        labels: value - before.get((name, labels), 0.0)
        for (name, labels), value in after.items()
        if name == failures and ("provider", provider) in labels
    }
    assert sum(counted.values()) == 2, counted
    [(reason_labels, _)] = [(labels, n) for labels, n in counted.items() if n]
    reason = dict(reason_labels)["reason"]
    assert reason in {"unreachable", "bad_response"}  # the provider's fault
    assert _health(process)["providers"][provider] == {"breaker": "open"}
    request_id = response.headers["x-request-id"]
    _wait_for(lambda: request_id in process.log())
    lines = [orjson.loads(line) for line in process.log().splitlines() if line.startswith("{")]
    logged = next(
        line for line in lines
        if line.get("logger") == "gateway.routing" and line.get("request_id") == request_id
    )  # fmt: skip
    assert "mid-stream" in logged["message"] and logged["reason"] == reason
    if provider == "ms-oa":  # open: its next request is not even sent
        marker = _marker()
        response = client.post(PATHS["chat"], json=body("chat", "ms/good", False, marker))
        assert_error(response, 503, "service_unavailable")
        assert fake_openai.sent(marker=marker) == []
