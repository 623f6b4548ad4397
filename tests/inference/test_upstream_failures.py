"""Upstream failures as the spec maps them, on both endpoints, streaming and not.

Before the stream opens: an ordinary JSON error with its status (400 invalid_request,
502 provider_error, 504 provider_timeout). After it opened: one in-band error event,
then the end of the stream; the part already delivered is billed as `failed`.
"""

from __future__ import annotations

import time

import pytest

from model_gateway.gateway.inference.tokens import estimate_tokens
from tests.support.errors import assert_error
from tests.support.fake_upstream import REPLY, REPLY_PIECES, SECRET, SLOW_S
from tests.support.inference import IMPATIENT_TIMEOUT_S, read_sse, sse_payloads

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
PROMPT = "Tell me something."


def body(endpoint: str, model: str, stream: bool) -> dict:
    if endpoint == "chat":
        return {"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    return {"model": model, "stream": stream, "input": PROMPT}


FAULTS = [
    ("fault-400", 400, "invalid_request"),
    ("fault-500", 502, "provider_error"),
    ("fail-before-first-byte", 502, "provider_error"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
@pytest.mark.parametrize(("fault", "status", "error_type"), FAULTS)
def test_failure_before_output_is_a_json_error(
    http, provider, endpoint, stream, fault, status, error_type
):
    response = http.post(PATHS[endpoint], json=body(endpoint, f"{provider}/{fault}", stream))
    error = assert_error(response, status, error_type)
    assert SECRET not in response.text
    assert "param" not in error
    assert "x-receipt-id" not in response.headers  # nothing billed


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_unreachable_provider_is_502(http, endpoint, stream):
    response = http.post(PATHS[endpoint], json=body(endpoint, "dead/normal", stream))
    assert_error(response, 502, "provider_error")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "an"])
def test_no_answer_within_the_gateway_timeout_is_504(impatient_http, provider, endpoint, stream):
    started = time.monotonic()
    response = impatient_http.post(PATHS[endpoint], json=body(endpoint, f"{provider}/slow", stream))
    elapsed = time.monotonic() - started
    assert_error(response, 504, "provider_timeout")
    assert IMPATIENT_TIMEOUT_S <= elapsed < SLOW_S - 1, (
        elapsed
    )  # the gateway's clock, not the upstream's


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "an"])
def test_body_cut_before_it_was_whole_is_502(http, provider, endpoint):
    response = http.post(PATHS[endpoint], json=body(endpoint, f"{provider}/cut-mid-stream", False))
    assert_error(response, 502, "provider_error")


def _delivered_text(endpoint: str, raw: bytes) -> str:
    if endpoint == "chat":
        chunks = [p for p in sse_payloads(raw) if isinstance(p, dict) and "choices" in p]
        return "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
    return "".join(
        p["delta"] for p in sse_payloads(raw) if p.get("type") == "response.output_text.delta"
    )


def assert_in_band_error(endpoint: str, response, error_type: str) -> dict:
    """The stream is 200 text/event-stream and ends with exactly one error event."""
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = read_sse(response.content)
    name, _ = events[-1]
    payloads = sse_payloads(response.content)
    error_events = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert len(error_events) == 1
    error = error_events[0]["error"]
    assert payloads[-1] is error_events[0], "the stream goes on after its error"
    assert error["type"] == error_type
    assert error["request_id"] == response.headers["x-request-id"]
    assert set(error) <= {"type", "message", "request_id", "param"}
    if endpoint == "chat":
        assert name is None
        assert "[DONE]" not in payloads
        assert list(payloads[-1]) == ["error"]  # the same object as error bodies
    else:
        assert name == "error"
        assert payloads[-1]["type"] == "error"
        assert payloads[-1]["code"] == error_type
        assert payloads[-1]["sequence_number"] == payloads[-2]["sequence_number"] + 1
        assert not any(p.get("type") == "response.completed" for p in payloads)
    assert SECRET not in response.text
    return error


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "oa-chat", "an"])
def test_stream_cut_after_output_ends_with_one_error_event(http, provider, endpoint):
    response = http.post(PATHS[endpoint], json=body(endpoint, f"{provider}/cut-mid-stream", True))
    assert_in_band_error(endpoint, response, "provider_error")
    delivered = _delivered_text(endpoint, response.content)
    assert delivered == "".join(REPLY_PIECES[:3])
    # The delivered part is billed and receipted as failed; usage counted from what came.
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == estimate_tokens(delivered)
    assert receipt["usage"]["input_tokens"] == estimate_tokens(PROMPT)


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
@pytest.mark.parametrize("provider", ["oa", "an"])
def test_stream_silent_after_output_times_out_in_band(impatient_http, provider, endpoint):
    started = time.monotonic()
    response = impatient_http.post(
        PATHS[endpoint], json=body(endpoint, f"{provider}/hang-stream", True)
    )
    assert time.monotonic() - started < 5
    assert_in_band_error(endpoint, response, "provider_timeout")
    assert _delivered_text(endpoint, response.content) == "".join(REPLY_PIECES[:2])
    receipt = impatient_http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "failed"


def test_reasoning_delivered_then_cut_is_billed_failed(http):
    """vLLM, DeepSeek, Ollama stream the model's reasoning beside its content: output the
    client received, billed when the stream then fails."""
    response = http.post(PATHS["chat"], json=body("chat", "oa/reasoning-cut-mid-stream", True))
    assert_in_band_error("chat", response, "provider_error")
    chunks = [p for p in sse_payloads(response.content) if isinstance(p, dict) and p.get("choices")]
    delivered = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    assert delivered == "".join(REPLY_PIECES[:3])
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == estimate_tokens(delivered)


@pytest.mark.parametrize("stream", [True, False])
def test_content_in_parts_is_counted_when_usage_never_comes(http, stream):
    response = http.post(PATHS["chat"], json=body("chat", "oa/parts-no-usage", stream))
    assert response.status_code == 200
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert (receipt["status"], receipt["usage_source"]) == ("succeeded", "gateway")
    assert receipt["usage"]["output_tokens"] == estimate_tokens(REPLY)


def test_translated_responses_take_content_in_parts(http):
    """A chat-only upstream's content parts become Responses text, not an internal error
    (streamed) or a list where the text belongs (a whole answer)."""
    response = http.post(PATHS["responses"], json=body("responses", "oa-chat/parts-no-usage", True))
    assert _delivered_text("responses", response.content) == REPLY
    assert sse_payloads(response.content)[-1]["type"] == "response.completed"
    whole = http.post(PATHS["responses"], json=body("responses", "oa-chat/parts-no-usage", False))
    assert whole.json()["output"][0]["content"][0]["text"] == REPLY


@pytest.mark.parametrize(
    ("endpoint", "provider"), [("chat", "oa"), ("chat", "an"), ("responses", "oa")]
)
def test_a_stream_ends_at_its_last_event_whatever_the_upstream_does_next(http, endpoint, provider):
    """An upstream that keeps its body open after the last event: the client's stream ends
    at once and succeeds (only the connection is lost)."""
    started = time.monotonic()
    response = http.post(PATHS[endpoint], json=body(endpoint, f"{provider}/done-then-hang", True))
    assert time.monotonic() - started < 3  # the drain's 0.5 s, not the gateway's timeout
    assert not [p for p in sse_payloads(response.content) if isinstance(p, dict) and "error" in p]
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert receipt["status"] == "succeeded"


def test_a_number_beyond_a_double_cuts_nothing(http):
    """An event passes the shape check with 1e400 in a field the gateway does not read:
    metering reads it with the same parser, so the stream ends and is billed."""
    response = http.post(PATHS["chat"], json=body("chat", "oa/huge-number", True))
    assert response.content.endswith(b"data: [DONE]\n\n")
    assert b"1e400" in response.content  # passed through as it came
    receipt = http.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert (receipt["status"], receipt["usage_source"]) == ("succeeded", "gateway")
    assert receipt["usage"]["output_tokens"] == estimate_tokens(REPLY)


def test_an_answer_over_16_mib_is_the_upstreams_failure(http):
    """A whole answer is read up to 16 MiB once decoded (a small gzip can decode to
    gigabytes): past that, 502 provider_error, the hold released, no receipt."""
    response = http.post(PATHS["chat"], json=body("chat", "oa/huge-answer", False))
    assert_error(response, 502, "provider_error")
    assert "x-receipt-id" not in response.headers


@pytest.mark.parametrize("stream", [True, False])
def test_a_chat_refusal_is_a_responses_refusal_part(http, stream):
    """A chat-only upstream's refusal reaches a Responses client as OpenAI sends one: a
    message whose part is a refusal (and, streamed, refusal deltas), counted as output."""
    response = http.post(PATHS["responses"], json=body("responses", "oa-chat/refusal", stream))
    assert response.status_code == 200
    if stream:
        events = sse_payloads(response.content)
        deltas = [e["delta"] for e in events if e["type"] == "response.refusal.delta"]
        assert "".join(deltas) == REPLY
        done = next(e for e in events if e["type"] == "response.refusal.done")
        assert done["refusal"] == REPLY
        answer = events[-1]["response"]
    else:
        answer = response.json()
    parts = [part for item in answer["output"] for part in item.get("content") or ()]
    assert parts == [{"type": "refusal", "refusal": REPLY}]
