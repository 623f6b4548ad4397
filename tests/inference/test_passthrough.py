"""The chat pass-through (gateway.providers.chat_events read by
gateway.inference.passthrough): whatever the reads an upstream stream arrives in, the
client gets the same bytes, and they are the upstream's own bytes but for the model name
and the usage the client did not ask for. First on its own, then end to end."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

import httpx
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from model_gateway.gateway.inference.output_limit import Delivered
from model_gateway.gateway.inference.passthrough import ChatPassThrough
from model_gateway.gateway.inference.sse import MAX_EVENT_BYTES
from model_gateway.gateway.inference.tokens import estimate_tokens, message_output
from model_gateway.gateway.inference.usage import Prompt
from model_gateway.gateway.providers.chat_events import ChatEvents
from model_gateway.gateway.providers.upstream import UpstreamFailure
from tests.support.fake_upstream import SECRET, FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import UPSTREAM_ENV, _model, by_class, split, sse_payloads
from tests.support.inference import relay as relay_stream

MODEL_ID = "pt/model"
UPSTREAM = b'"model":"up-name"'
OURS = b'"model":"pt/model"'
HEAD = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,' + UPSTREAM
TEXT = 'café "model":"up-name" 🙂 and more'
# Spaces, an escaped é and a raw emoji: bytes that no re-rendering would reproduce, and a
# text quoting the model field, which is no field.
CONTENT = [
    HEAD + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"finish_reason":null}],"usage":null}',
    HEAD + b',"choices":[{"index":0, "delta": {"content": "caf\\u00e9 \\"model\\":'
    b'\\"up-name\\" \xf0\x9f\x99\x82"},"finish_reason":null}],"usage":null}',
    HEAD + b',"choices":[{"index":0,"delta":{"content":" and more"},"finish_reason":null}]'
    b',"usage":null}',
    HEAD + b',"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}',
]
USAGE = HEAD + b',"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'
UPSTREAM_BYTES = b"".join(event + b"\n\n" for event in [*CONTENT, USAGE, b"data: [DONE]"])
DONE = b"data: [DONE]\n\n"

HELD = 10_000  # output tokens the hold covers: more than any stream here delivers
THE_PROMPT = Prompt("the prompt", 10_000)  # its text, and the most input tokens it can bill


def expected(include_usage: bool) -> bytes:
    """The upstream's events with the gateway's model id; `"usage":null` and the usage
    chunk only for a client that asked for usage."""
    events = [*CONTENT, USAGE] if include_usage else CONTENT
    out = b"".join(event.replace(UPSTREAM, OURS) + b"\n\n" for event in events)
    if not include_usage:
        out = out.replace(b',"usage":null', b"")
    return out + DONE


def relay(reads: list[bytes], include_usage: bool) -> tuple[bytes, ChatPassThrough]:
    renderer = ChatPassThrough(MODEL_ID, include_usage, THE_PROMPT, Delivered(HELD))
    return relay_stream(ChatEvents("test"), renderer, reads), renderer


cut_points = st.lists(st.integers(0, len(UPSTREAM_BYTES)), max_size=40)


@pytest.mark.parametrize("include_usage", [True, False])
def test_content_bytes_pass_unchanged_but_for_the_model(include_usage):
    out, renderer = relay([UPSTREAM_BYTES], include_usage)
    assert out == expected(include_usage)
    assert renderer.usage() == {"input_tokens": 3, "output_tokens": 4}
    assert renderer.delivered.size == len(TEXT.encode())


@settings(max_examples=300, deadline=None)
@given(cuts=cut_points, include_usage=st.booleans())
def test_any_split_across_reads_gives_the_same_bytes(cuts, include_usage):
    out, renderer = relay(split(UPSTREAM_BYTES, cuts), include_usage)
    assert out == expected(include_usage)
    assert renderer.delivered.size == len(TEXT.encode())


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(0, 2 * len(UPSTREAM_BYTES)), max_size=40))
def test_other_framings_give_the_same_events_whatever_the_split(cuts):
    """CRLF line ends and keep-alive comments: decoded by the full SSE rules, re-rendered,
    and the same events (keep-alives dropped) whatever the reads."""
    crlf = UPSTREAM_BYTES.replace(b"\n\n", b"\r\n: keep-alive\r\n\r\n")
    whole, _ = relay([crlf], True)
    out, renderer = relay(split(crlf, cuts), True)
    assert out == whole
    assert sse_payloads(out) == sse_payloads(expected(True))
    assert renderer.delivered.size == len(TEXT.encode())


def test_keep_alive_comments_are_dropped_and_the_rest_passes():
    commented = b": ping\n\n" + UPSTREAM_BYTES.replace(
        b"\n\ndata: [DONE]", b"\n\n: ping\n\ndata: [DONE]"
    )
    out, _ = relay([commented], True)
    assert out == expected(True)


def test_an_in_band_error_ends_the_batch_after_the_events_before_it():
    error = b'data: {"error":{"message":"upstream secret","type":"server_error"}}\n\n'
    raw = CONTENT[0] + b"\n\n" + CONTENT[1] + b"\n\n" + error + CONTENT[2] + b"\n\n"
    batch, failure = ChatEvents("test").feed(raw)
    assert [event.block for event in batch] == CONTENT[:2]
    assert isinstance(failure, UpstreamFailure) and failure.reason == "bad_response"
    assert "secret" not in str(failure.message)


def test_an_event_nested_past_the_parsers_limit_is_malformed():
    """msgspec refuses it with a RecursionError (the nesting may sit in a field the
    gateway never reads): the upstream's malformed answer, not an internal error."""
    nested = b'data: {"x":' + b"[" * 5000 + b"]" * 5000 + b"}\n\n"
    batch, failure = ChatEvents("test").feed(CONTENT[0] + b"\n\n" + nested)
    assert [event.block for event in batch] == CONTENT[:1]
    assert isinstance(failure, UpstreamFailure) and failure.detail == "malformed"


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])  # canonical framing, and decoded
def test_an_event_that_never_ends_is_malformed_past_a_mebibyte(line_end):
    """An upstream that never ends its event would grow the buffer (and the time spent
    rescanning it) without end: past MAX_EVENT_BYTES it is the upstream's malformed answer."""
    events = ChatEvents("test")
    first = CONTENT[0].replace(b"\n", line_end) + line_end * 2
    batch, failure = events.feed(first + b'data: {"x":"' + b"a" * (MAX_EVENT_BYTES // 2))
    assert len(batch) == 1 and failure is None
    batch, failure = events.feed(b"a" * (MAX_EVENT_BYTES // 2 + 100))
    assert batch == [] and isinstance(failure, UpstreamFailure)
    assert failure.detail == "malformed"


def test_an_integer_past_64_bits_in_a_re_rendered_event_is_written_again():
    """A re-rendered event (here CRLF framing) is read as orjson reads it, an integer past
    64 bits as a float: written again, not refused mid-stream."""
    big = CONTENT[2].replace(b'"usage":null', b'"usage":null,"seed":18446744073709551616')
    out, renderer = relay([big + b"\r\n\r\n" + DONE], True)
    assert b"1.8446744073709552e+19" in out and out.endswith(DONE)
    assert renderer.delivered.size == len(b" and more")


def test_reasoning_sent_under_both_names_counts_once():
    """Recent vLLM fills `reasoning_content` and `reasoning` alike: the delta carries the
    text once, and is counted once."""
    both = {"reasoning_content": "Let me think.", "reasoning": "Let me think."}
    assert message_output(both) == "Let me think."
    assert message_output({"reasoning": "Hm.", "content": "Hi"}) == "HiHm."


def test_usage_the_upstream_never_sent_leaves_the_text_to_count():
    out, renderer = relay([b"".join(event + b"\n\n" for event in CONTENT) + DONE], True)
    assert out == b"".join(e.replace(UPSTREAM, OURS) + b"\n\n" for e in CONTENT) + DONE
    assert renderer.usage() == {}
    assert renderer.delivered.size == len(TEXT.encode())


def test_broken_usage_is_shown_as_the_gateways_count():
    broken = USAGE.replace(b'"completion_tokens":4', b'"completion_tokens":-4')
    raw = b"".join(event + b"\n\n" for event in [*CONTENT, broken]) + DONE
    out, _ = relay([raw], True)
    shown = sse_payloads(out)[-2]["usage"]
    assert shown["completion_tokens"] == -(-len(TEXT.encode()) // 4)
    assert shown["prompt_tokens"] == 3
    assert out.startswith(b"".join(e.replace(UPSTREAM, OURS) + b"\n\n" for e in CONTENT))


def test_an_event_with_fields_elsewhere_is_rendered_like_any_chunk():
    """`"model": "up-name"` (a space) is not the field as searched: decoded and re-rendered."""
    spaced = CONTENT[1].replace(UPSTREAM, b'"model": "up-name"')
    out, _ = relay([spaced + b"\n\n" + CONTENT[3] + b"\n\n" + DONE], False)
    first = sse_payloads(out)[0]
    assert first["model"] == MODEL_ID and "usage" not in first
    assert first["choices"][0]["delta"]["content"] == TEXT.removesuffix(" and more")
    assert out.endswith(
        CONTENT[3].replace(UPSTREAM, OURS).replace(b',"usage":null', b"") + b"\n\n" + DONE
    )


def test_invalid_utf8_is_read_as_the_sse_decoder_reads_it():
    bad = CONTENT[2].replace(b" and more", b" and \xff more")
    out, _ = relay([bad + b"\n\n" + CONTENT[3] + b"\n\n" + DONE], True)
    assert sse_payloads(out)[0]["choices"][0]["delta"]["content"] == " and \ufffd more"
    assert orjson.loads(out.split(b"\n\n")[0][6:])["model"] == MODEL_ID


# End to end: a real gateway in front of an upstream that writes a scripted stream in
# pieces, with a pause between them, so that the gateway reads them apart.

PROMPT = "Pass this through."


@dataclass
class ScriptedUpstream(FakeUpstream):
    script: bytes = b""
    cuts: list[int] = field(default_factory=list)

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/chat/completions", self.chat)]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in split(self.script, self.cuts):
            await response.write(piece)
            await asyncio.sleep(0.003)
        await response.write_eof()
        return response


@pytest.fixture(scope="module")
def upstream():
    with ScriptedUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, upstream):
    config = f"""
[providers.scripted]
kind = "openai"
base_url = "{upstream.url}/v1"
api_key_env = "FAKE_OPENAI_KEY"
"""
    process = GatewayProcess(
        tmp_path_factory.mktemp("passthrough"),
        extra_config=config + _model(MODEL_ID, "scripted", "up-name"),
        env=UPSTREAM_ENV,
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def session(gateway):
    project = gateway.create_project("passthrough", "--balance", "10")
    key = gateway.create_key(project, "inference,receipts")
    with httpx.Client(
        base_url=gateway.url, headers={"authorization": f"Bearer {key}"}, timeout=20
    ) as client:
        yield client


def stream(session, upstream, script: bytes, include_usage: bool, cuts=()) -> httpx.Response:
    upstream.script, upstream.cuts = script, list(cuts)
    request = {"model": MODEL_ID, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    response = session.post("/v1/chat/completions", json=request)
    assert response.status_code == 200
    return response


def receipt(session, response: httpx.Response) -> dict:
    return session.get(f"/v1/receipts/{response.headers['x-receipt-id']}").json()


@pytest.mark.parametrize("include_usage", [True, False])
def test_the_client_gets_the_upstreams_bytes(session, upstream, include_usage):
    response = stream(session, upstream, UPSTREAM_BYTES, include_usage, cuts=[100, 101, 400])
    assert response.content == expected(include_usage)
    # The upstream is asked for usage either way: the bill needs it.
    assert upstream.requests[-1].body["stream_options"] == {"include_usage": True}
    found = receipt(session, response)
    assert found["status"] == "succeeded" and found["usage_source"] == "provider"
    assert found["usage"] == by_class(3, 4)
    assert found["response_sha256"] == hashlib.sha256(response.content).hexdigest()


@settings(max_examples=12, deadline=None)
@given(cuts=cut_points)
def test_reads_cut_anywhere_give_the_same_stream(session, upstream, cuts):
    assert stream(session, upstream, UPSTREAM_BYTES, False, cuts).content == expected(False)


def test_usage_never_sent_is_counted_by_the_gateway(session, upstream):
    script = b"".join(event + b"\n\n" for event in CONTENT) + DONE
    response = stream(session, upstream, script, True, cuts=[50])
    assert response.content == b"".join(e.replace(UPSTREAM, OURS) + b"\n\n" for e in CONTENT) + DONE
    found = receipt(session, response)
    assert found["status"] == "succeeded" and found["usage_source"] == "gateway"
    assert found["usage"] == by_class(estimate_tokens(PROMPT), estimate_tokens(TEXT))


def test_an_in_band_error_mid_stream_ends_it_in_band(session, upstream):
    error = f'data: {{"error":{{"message":"{SECRET}","type":"server_error"}}}}\n\n'.encode()
    script = CONTENT[0] + b"\n\n" + CONTENT[1] + b"\n\n" + error + CONTENT[2] + b"\n\n" + DONE
    response = stream(session, upstream, script, False, cuts=[len(CONTENT[0]) + 2])
    assert SECRET.encode() not in response.content and DONE not in response.content
    payloads = sse_payloads(response.content)
    assert [p["choices"][0]["delta"].get("content") for p in payloads[:2]] == [
        "",
        TEXT.removesuffix(" and more"),
    ]
    assert payloads[2]["error"]["type"] == "provider_error" and len(payloads) == 3
    # What reached the client before the failure is billed.
    found = receipt(session, response)
    assert found["status"] == "failed"
    assert found["usage"]["output_tokens"] == estimate_tokens(TEXT.removesuffix(" and more"))
