"""A native Responses stream (gateway.providers.responses_events read by the
NativeResponsesRenderer): events without the response object go out as the upstream
framed them, byte for byte, whatever the reads; the three that carry it (created, in
progress, completed) are re-rendered with the gateway's model id and the usage shown.
End to end, the SDK tests (test_sdk_happy_paths, test_broken_usage, test_cancel,
test_upstream_failures with `oa/` models) run the same path through a real gateway."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_gateway.gateway.inference.output_limit import Delivered
from model_gateway.gateway.inference.renderers import NativeResponsesRenderer
from model_gateway.gateway.inference.usage import Prompt
from model_gateway.gateway.providers.responses_events import NativeResponsesEvents
from model_gateway.gateway.providers.upstream import UpstreamFailure
from tests.support.inference import relay as relay_stream
from tests.support.inference import split, sse_payloads

MODEL_ID = "oa/model"
USAGE = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
TEXT = 'café "model":"up-name" 🙂 and more'

HELD = 10_000  # output tokens the hold covers: more than any stream here delivers
PROMPT = Prompt("the prompt", 10_000)  # its text, and the most input tokens it can bill


def response(status: str, usage) -> bytes:
    return orjson.dumps(
        {"id": "resp_1", "object": "response", "status": status, "model": "up-name",
         "output": [], "usage": usage}
    )  # fmt: skip


def event(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data


# Spaces, an escaped é and a raw emoji: bytes that no re-rendering would reproduce.
DELTAS = [
    event(
        "response.output_text.delta",
        b'{"type":"response.output_text.delta", "sequence_number":2,'
        b' "delta":"caf\\u00e9 \\"model\\":\\"up-name\\" \xf0\x9f\x99\x82"}',
    ),
    event(
        "response.output_text.delta",
        b'{"type":"response.output_text.delta","sequence_number":3,"delta":" and more"}',
    ),
    event(
        "response.output_text.done",
        b'{"type":"response.output_text.done","sequence_number":4,"text":"whole"}',
    ),
]
CREATED = [
    event(
        "response.created",
        b'{"type":"response.created","sequence_number":0,"response":'
        + response("in_progress", None)
        + b"}",
    ),
    event(
        "response.in_progress",
        b'{"type":"response.in_progress","sequence_number":1,"response":'
        + response("in_progress", None)
        + b"}",
    ),
]
COMPLETED = event(
    "response.completed",
    b'{"type":"response.completed","sequence_number":5,"response":'
    + response("completed", USAGE)
    + b"}",
)
UPSTREAM_BYTES = b"".join(e + b"\n\n" for e in [*CREATED, *DELTAS, COMPLETED])


def relay(reads: list[bytes]) -> tuple[bytes, NativeResponsesRenderer]:
    renderer = NativeResponsesRenderer(MODEL_ID, PROMPT, Delivered(HELD))
    return relay_stream(NativeResponsesEvents("test"), renderer, reads), renderer


def test_events_without_the_response_pass_as_they_came():
    out, renderer = relay([UPSTREAM_BYTES])
    blocks = out.split(b"\n\n")
    assert blocks[2:5] == DELTAS  # the upstream's own bytes
    payloads = sse_payloads(out)
    assert [p["type"] for p in payloads] == [
        "response.created", "response.in_progress", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.completed",
    ]  # fmt: skip
    for index in (0, 1, 5):  # re-rendered with the gateway's model
        assert payloads[index]["response"]["model"] == MODEL_ID
    assert payloads[5]["response"]["usage"] == USAGE
    assert renderer.delivered.size == len(TEXT.encode())
    assert renderer.usage() == {"input_tokens": 3, "output_tokens": 4}
    assert (
        orjson.loads(renderer.error(UpstreamFailure("bad_response"), "req_1").split(b"data: ")[1])[
            "sequence_number"
        ]
        == 6
    )


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(0, len(UPSTREAM_BYTES)), max_size=40))
def test_any_split_across_reads_gives_the_same_bytes(cuts):
    whole, _ = relay([UPSTREAM_BYTES])
    out, renderer = relay(split(UPSTREAM_BYTES, cuts))
    assert out == whole
    assert renderer.delivered.size == len(TEXT.encode())


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(0, 2 * len(UPSTREAM_BYTES)), max_size=40))
def test_other_framings_give_the_same_events_whatever_the_split(cuts):
    """CRLF line ends, keep-alive comments and events without their `event:` line: decoded
    by the full SSE rules and re-rendered: the same events, whatever the reads."""
    other = UPSTREAM_BYTES.replace(b"\n\n", b"\r\n: keep-alive\r\n\r\n")
    no_names = b"".join(e.split(b"\n", 1)[1] + b"\n\n" for e in [*CREATED, *DELTAS, COMPLETED])
    canonical, _ = relay([UPSTREAM_BYTES])
    for raw in (other, no_names):
        out, renderer = relay(split(raw, cuts))
        assert sse_payloads(out) == sse_payloads(canonical)
        assert renderer.delivered.size == len(TEXT.encode())
        assert b"event: response.output_text.delta\n" in out  # the name the client reads


@pytest.mark.parametrize(
    "failure",
    [
        event("error", b'{"type":"error","message":"upstream secret"}'),
        event("response.failed", b'{"type":"response.failed","response":{"error":"secret"}}'),
        b'data: {"type":"error","message":"upstream secret"}',  # named by its type
    ],
)
def test_an_in_band_failure_ends_the_batch_after_the_events_before_it(failure):
    raw = CREATED[0] + b"\n\n" + DELTAS[0] + b"\n\n" + failure + b"\n\n" + DELTAS[1] + b"\n\n"
    batch, error = NativeResponsesEvents("test").feed(raw)
    assert [e.block for e in batch] == [CREATED[0], DELTAS[0]]
    assert isinstance(error, UpstreamFailure) and error.reason == "bad_response"
    assert "secret" not in str(error.message)


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[1, 2]",
        b'{"type":"response.output_text.delta","sequence_number":"two"}',
        b'{"type":"response.output_text.delta","response":"x"}',
    ],
)
def test_a_malformed_event_is_the_upstreams_failure(data):
    raw = DELTAS[0] + b"\n\n" + event("response.output_text.delta", data) + b"\n\n"
    batch, error = NativeResponsesEvents("test").feed(raw)
    assert [e.block for e in batch] == [DELTAS[0]]
    assert isinstance(error, UpstreamFailure) and error.detail == "malformed"


def test_invalid_utf8_is_read_as_the_sse_decoder_reads_it():
    bad = DELTAS[1].replace(b" and more", b" and \xff more")
    out, renderer = relay([CREATED[0] + b"\n\n" + bad + b"\n\n" + COMPLETED + b"\n\n"])
    assert sse_payloads(out)[1]["delta"] == " and \ufffd more"
    assert renderer.delivered.size == len(" and \ufffd more".encode())


def test_what_follows_the_end_is_read_and_dropped():
    events = NativeResponsesEvents("test")
    batch, _ = events.feed(COMPLETED + b"\n\n" + DELTAS[0] + b"\n\ndata: [DONE]\n\n")
    assert [e.name for e in batch] == ["response.completed"] and events.complete
