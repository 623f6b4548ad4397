"""Traces end to end (decisions.md, "Operators (wave 3)", Traces): a gateway with
`[telemetry] otlp_endpoint` exports a span per request, one per upstream attempt and one
for the settlement to a real OTLP/HTTP collector; the client's traceparent is the
request's parent, and each upstream request carries its attempt's; nothing exported
holds a prompt, an output, a key or a credential.

Each test marks its prompt, so the fake upstream's shared record tells its requests apart.
"""

from __future__ import annotations

import secrets
import uuid

import orjson

from tests.support.fake_collector import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    STATUS_ERROR,
    Span,
)
from tests.support.fake_upstream import INPUT_TOKENS, OUTPUT_TOKENS, PAUSE_S, REPLY, SECRET
from tests.support.inference import OPENAI_CREDENTIAL, sse_payloads


def _traceparent() -> tuple[str, str, str]:
    """(a client's traceparent header, its trace id, its span id): sampled."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _chat(client, model: str, marker: str, headers=None, **fields):
    body = {"model": model, "messages": [{"role": "user", "content": marker}], **fields}
    return client.post("/v1/chat/completions", json=body, headers=headers or {})


def _trace_of(collector, response) -> tuple[Span, list[Span]]:
    """The request's span (found by its request id) and every span of its trace."""
    request_id = response.headers["x-request-id"]

    def request_span(spans: list[Span]) -> Span | None:
        return next(
            (s for s in spans if s.attributes.get("gateway.request_id") == request_id), None
        )

    # Children end before their request: exported with it or before.
    spans = collector.wait_for(lambda spans: request_span(spans) is not None)
    root = request_span(spans)
    assert root is not None
    return root, [s for s in spans if s.trace_id == root.trace_id]


def _children(root: Span, trace: list[Span], kind: int) -> list[Span]:
    found = [s for s in trace if s.parent_span_id == root.span_id and s.kind == kind]
    return sorted(found, key=lambda s: s.start_ns)


def _upstream_parent(recorded) -> tuple[str, str]:
    """(trace id, parent span id) of the traceparent an upstream request carried."""
    version, trace_id, parent_id, flags = recorded.headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return trace_id, parent_id


def test_a_request_its_attempt_and_settlement_are_one_trace_under_the_clients(
    traced, collector, upstream
):
    client = traced.client
    marker = f"prompt-{uuid.uuid4().hex}"
    header, client_trace, client_span = _traceparent()
    response = _chat(client, "tr/chat", marker, {"traceparent": header, "tracestate": "vnd=1"})
    assert response.status_code == 200, response.text
    root, trace = _trace_of(collector, response)

    assert (root.trace_id, root.parent_span_id) == (client_trace, client_span)
    assert root.kind == KIND_SERVER
    assert root.name == "POST /v1/chat/completions"
    attributes = root.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tr/chat"
    assert attributes["gen_ai.response.model"] == "normal"  # as the upstream named it
    assert attributes["gen_ai.usage.input_tokens"] == INPUT_TOKENS
    assert attributes["gen_ai.usage.output_tokens"] == OUTPUT_TOKENS
    assert attributes["gen_ai.provider.name"] == attributes["gen_ai.system"] == "openai"
    assert attributes["gateway.provider"] == "tr-oa"
    assert attributes["gateway.receipt_id"] == response.headers["x-receipt-id"]
    assert attributes["gateway.project_id"] == traced.project
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/chat/completions"
    assert attributes["http.response.status_code"] == 200
    assert root.status_code != STATUS_ERROR
    assert root.resource["service.name"] == "gateway-under-test"  # OTEL_SERVICE_NAME

    [attempt] = _children(root, trace, KIND_CLIENT)
    assert attempt.name == "chat normal"
    assert attempt.attributes["gen_ai.request.model"] == "normal"
    assert attempt.attributes["gen_ai.provider.name"] == "openai"
    assert attempt.attributes["gateway.provider"] == "tr-oa"
    assert attempt.attributes["gateway.outcome"] == "succeeded"
    assert attempt.attributes["http.response.status_code"] == 200
    assert attempt.attributes["server.address"] == "127.0.0.1"
    [sent] = upstream.sent(marker=marker)
    assert _upstream_parent(sent) == (client_trace, attempt.span_id)
    assert sent.headers["tracestate"] == "vnd=1"

    [settlement] = _children(root, trace, KIND_INTERNAL)
    assert settlement.name == "settlement"
    assert settlement.attributes["gateway.receipt_id"] == response.headers["x-receipt-id"]
    assert settlement.attributes["gateway.outcome"] == "succeeded"
    receipt = client.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()
    assert settlement.attributes["gateway.cost"] == round(float(receipt["cost"]) * 1_000_000)
    for child in (attempt, settlement):
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns


def test_each_fallback_attempt_is_its_own_span_and_its_upstream_request_its_child(
    traced, collector, upstream
):
    client = traced.client
    marker = f"prompt-{uuid.uuid4().hex}"
    response = _chat(client, "tr/fallback", marker)
    assert response.status_code == 200, response.text
    root, trace = _trace_of(collector, response)
    assert root.parent_span_id == ""  # no traceparent from the client: a new trace

    failed, served = _children(root, trace, KIND_CLIENT)
    assert failed.attributes["gen_ai.request.model"] == "fault-500"
    assert failed.attributes["gateway.attempt"] == 1
    assert failed.attributes["gateway.outcome"] == "failed"
    assert failed.attributes["gateway.failure_reason"] == "server_error"
    assert failed.attributes["http.response.status_code"] == 500
    assert failed.status_code == STATUS_ERROR
    assert failed.status_message == failed.attributes["error.type"] == "provider_error"
    assert served.attributes["gen_ai.request.model"] == "normal"
    assert served.attributes["gateway.attempt"] == 2
    assert served.attributes["gateway.outcome"] == "succeeded"
    assert served.status_code != STATUS_ERROR
    assert failed.end_ns <= served.start_ns

    first, second = upstream.sent(marker=marker)
    assert (first.body["model"], second.body["model"]) == ("fault-500", "normal")
    assert _upstream_parent(first) == (root.trace_id, failed.span_id)
    assert _upstream_parent(second) == (root.trace_id, served.span_id)
    assert root.status_code != STATUS_ERROR
    assert len(_children(root, trace, KIND_INTERNAL)) == 1  # settled once


def test_a_stream_span_ends_with_the_stream_and_has_its_usage(traced, collector, upstream):
    client = traced.client
    marker = f"prompt-{uuid.uuid4().hex}"
    response = _chat(client, "tr/slow-stream", marker, stream=True)
    assert response.status_code == 200, response.text
    assert sse_payloads(response.content)[-1] == "[DONE]"
    root, trace = _trace_of(collector, response)

    assert root.attributes["gen_ai.usage.input_tokens"] == INPUT_TOKENS
    assert root.attributes["gen_ai.usage.output_tokens"] == OUTPUT_TOKENS
    assert root.attributes["gateway.receipt_id"] == response.headers["x-receipt-id"]
    [attempt] = _children(root, trace, KIND_CLIENT)
    [settlement] = _children(root, trace, KIND_INTERNAL)
    # The upstream paused PAUSE_S after its first event: the attempt's span and the
    # request's cover the whole stream, not just its opening.
    assert attempt.end_ns - attempt.start_ns >= PAUSE_S * 1e9
    assert attempt.attributes["gateway.outcome"] == "succeeded"
    assert root.end_ns >= settlement.end_ns >= attempt.end_ns
    [sent] = upstream.sent(marker=marker)
    assert _upstream_parent(sent) == (root.trace_id, attempt.span_id)


def test_a_failed_request_is_an_error_span_with_the_spec_type_only(traced, collector):
    client = traced.client
    response = _chat(client, "tr/down", f"prompt-{uuid.uuid4().hex}")
    assert response.status_code == 502
    error_type = response.json()["error"]["type"]
    root, trace = _trace_of(collector, response)
    assert root.status_code == STATUS_ERROR
    assert root.status_message == root.attributes["error.type"] == error_type
    assert root.attributes["http.response.status_code"] == 502
    [attempt] = _children(root, trace, KIND_CLIENT)
    assert attempt.status_message == error_type
    assert _children(root, trace, KIND_INTERNAL) == []  # nothing billed, nothing settled
    assert all(span.events == [] for span in trace)  # no exception events (stacks)

    refused = _chat(client, "no-such-model", "hello")
    root, _ = _trace_of(collector, refused)
    assert root.status_message == refused.json()["error"]["type"]
    assert root.attributes["http.response.status_code"] == refused.status_code


def test_embeddings_are_their_own_operation(traced, collector):
    client = traced.client
    response = client.post("/v1/embeddings", json={"model": "tr/embed", "input": "some words"})
    assert response.status_code == 200, response.text
    root, trace = _trace_of(collector, response)
    assert root.attributes["gen_ai.operation.name"] == "embeddings"
    assert root.attributes["gen_ai.request.model"] == "tr/embed"
    assert "gen_ai.usage.input_tokens" in root.attributes
    [attempt] = _children(root, trace, KIND_CLIENT)
    assert attempt.name == "embeddings normal"


def test_nothing_exported_holds_a_prompt_an_output_a_key_or_a_credential(
    traced, collector, upstream
):
    client = traced.client
    marker = f"prompt-{uuid.uuid4().hex}"
    for model in ("tr/chat", "tr/fallback", "tr/down"):
        _chat(client, model, marker)
    streamed = _chat(client, "tr/chat", marker, stream=True)
    _trace_of(collector, streamed)  # the last one's spans are in
    raw = collector.raw().lower()
    assert len(upstream.sent(marker=marker)) == 5
    for secret in (marker, REPLY, "fake upstream", traced.key, OPENAI_CREDENTIAL, SECRET, "bearer"):
        assert secret.lower().encode() not in raw, secret
    assert b"authorization" not in raw
    # The exports do carry what the OTEL_* variables add, where they belong.
    assert all(e.headers["x-collector-token"] == "collector-token-9f1" for e in collector.exports)


def test_spans_go_to_the_configured_endpoint_whatever_the_otel_variables_say(traced, collector):
    client = traced.client
    _trace_of(collector, _chat(client, "tr/chat", "hello"))
    assert collector.refused_paths == []
    assert {export.path for export in collector.exports} == {"/v1/traces"}
    # (PYTHONPROFILEIMPORTTIME: the traced gateway did import the SDK, which the untraced
    # one must not: test_traces_off.py relies on the log showing it.)
    assert "opentelemetry.sdk.trace" in traced.gateway.log()


def test_a_payload_that_is_not_json_error_still_gets_a_span(traced, collector):
    client = traced.client
    response = client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    root, _ = _trace_of(collector, response)
    assert root.status_message == orjson.loads(response.content)["error"]["type"]
    assert root.attributes["gateway.project_id"] == traced.project
