"""Streams on the wire: forwarded as they arrive, cancelled upstream when the client goes,
and metered from the exact bytes sent."""

from __future__ import annotations

import hashlib
import time

import httpx
import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, PAUSE_S, REPLY
from tests.support.inference import by_class, sse_payloads

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
PROMPT = "Stream to me."


def body(endpoint: str, model: str, **extra) -> dict:
    if endpoint == "chat":
        return {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
        } | extra
    return {"model": model, "stream": True, "input": PROMPT} | extra


def _fakes(provider, fake_openai, fake_anthropic):
    return fake_anthropic if provider == "an" else fake_openai


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "an"])
def test_events_are_forwarded_as_they_arrive(http, provider, endpoint):
    """The upstream pauses after its first event: that event reaches the client first."""
    arrivals = []
    started = time.monotonic()
    with http.stream("POST", PATHS[endpoint], json=body(endpoint, f"{provider}/slow-stream")) as r:
        assert r.status_code == 200
        for _ in r.iter_raw():
            arrivals.append(time.monotonic() - started)
    assert arrivals[-1] >= PAUSE_S
    assert arrivals[0] < arrivals[-1] - PAUSE_S * 0.7, arrivals  # not held back until the end


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "an"])
def test_client_disconnect_closes_the_upstream_at_once(
    gw, key, fake_openai, fake_anthropic, provider, endpoint
):
    fake = _fakes(provider, fake_openai, fake_anthropic)
    fake.disconnected.pop("hang-stream", None)
    request = body(endpoint, f"{provider}/hang-stream")
    with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {key}"}) as session:
        with session.stream("POST", PATHS[endpoint], json=request) as response:
            assert response.status_code == 200
            receipt_id = response.headers["x-receipt-id"]
            seen = b""
            for chunk in response.iter_raw():
                seen += chunk
                if seen.count(b"Hello") and seen.count(b" from"):
                    break  # two text events in: the upstream now hangs
        gone = time.monotonic()  # the connection is closed here (not returned to the pool)
    deadline = gone + 5
    while "hang-stream" not in fake.disconnected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "hang-stream" in fake.disconnected, "the upstream call outlived the client"
    assert fake.disconnected["hang-stream"] - gone < 1.0
    # The client left after the upstream accepted: the prompt and the part it was sent
    # are billed, as cancelled.
    with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {key}"}) as session:
        deadline = time.monotonic() + 5
        while (found := session.get(f"/v1/receipts/{receipt_id}")).status_code == 404:
            assert time.monotonic() < deadline, "no receipt for the delivered part"
            time.sleep(0.02)
    assert found.json()["status"] == "cancelled"
    assert found.json()["usage"] == by_class(estimate_tokens(PROMPT), estimate_tokens("Hello from"))


@pytest.mark.parametrize("model", ["echo-1", "oa/normal", "an/normal"])
def test_usage_chunk_only_for_who_asked(http, model):
    asked = http.post(
        PATHS["chat"], json=body("chat", model, stream_options={"include_usage": True})
    )
    chunks = [p for p in sse_payloads(asked.content) if p != "[DONE]"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c.get("usage") is None for c in chunks[:-1])
    plain = http.post(PATHS["chat"], json=body("chat", model))
    assert all("usage" not in c for c in sse_payloads(plain.content) if c != "[DONE]")
    assert sse_payloads(plain.content)[-1] == "[DONE]"


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_receipt_holds_reported_usage_and_digest_of_bytes_sent(http, provider, stream, endpoint):
    request = body(endpoint, f"{provider}/normal") | {"stream": stream}
    response = http.post(PATHS[endpoint], json=request)
    assert response.status_code == 200
    expected_type = "text/event-stream" if stream else "application/json"
    assert response.headers["content-type"].startswith(expected_type)
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded"
    assert receipt["usage"] == by_class(INPUT_TOKENS, OUTPUT_TOKENS)
    assert receipt["usage_source"] == "provider"
    assert receipt["response_sha256"] == hashlib.sha256(response.content).hexdigest()
    assert receipt["model"] == f"{provider}/normal"


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_stream_without_reported_usage_is_counted(http, endpoint):
    response = http.post(PATHS[endpoint], json=body(endpoint, "oa/no-usage"))
    assert response.status_code == 200
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded"
    assert receipt["usage"] == by_class(estimate_tokens(PROMPT), estimate_tokens(REPLY))
    assert receipt["usage_source"] == "gateway"
