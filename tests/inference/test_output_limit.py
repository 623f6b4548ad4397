"""Output never past the hold (decisions.md, "Prices, exactly"; issue "Hardening III" 2-3).

A runaway upstream ignores the request's output limit: it streams 16 KiB deltas that never
end (chat, native Responses, Anthropic), or answers more than it was asked, or reports
usage past the limit. The client gets no more output than the hold covers (the output
limit x 1.25 + 16 tokens, counted as bytes / 4), then the in-band `provider_error`; the
receipt (`failed`) bills what was delivered, at list price, and that is within the hold.
A whole answer past the held output is 502, billed its input only. A stream that ends at
its limit is never cut. The gateway keeps counts, not events: its memory stays flat while
an endless stream runs through it.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import httpx
import orjson
import pytest
from aiohttp import web

from model_gateway.gateway.inference.output_limit import Delivered, delivered_chunk
from model_gateway.gateway.inference.passthrough import ChatPassThrough
from model_gateway.gateway.inference.tokens import message_output
from model_gateway.gateway.inference.usage import Prompt
from model_gateway.gateway.metering.money import cost_of_tokens
from model_gateway.gateway.providers.chat_events import ChatEvents
from tests.metering.billing import books, micros
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.inference import _model, read_sse, sse_payloads

DELTA = "runaway " * 2048  # 16 KiB a delta
INPUT_PRICE, OUTPUT_PRICE = 500_000, 1_500_000  # micro-units per million tokens
BIG_LIMIT = 8_000_000  # a model whose hold covers 40 MB of output: room to watch memory
PROMPT_TOKENS = 9  # what the runaway upstream reports as the prompt's tokens


def held_output_tokens(limit: int, model_max: int) -> int:
    """decisions.md: the output limit (clamped to the model's) x 1.25, rounded up, + 16."""
    return -(-min(limit, model_max) * 5 // 4) + 16


def _sse(payload: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def _chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> dict:
    chunk: dict = {
        "id": "chatcmpl-runaway",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream-name",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        chunk["choices"], chunk["usage"] = [], usage
    return chunk


class Runaway(FakeUpstream):
    """`/v1` speaks chat and Responses, `/chatonly/v1` chat only, `/anthropic` Messages; the
    requested upstream model name picks the behaviour (see each handler)."""

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.chat),
            web.post("/chatonly/v1/chat/completions", self.chat),
            web.post("/chatonly/v1/responses", self.absent),
            web.post("/v1/responses", self.responses),
            web.post("/anthropic/v1/messages", self.messages),
        ]

    async def absent(self, request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no such endpoint"}}, status=404)

    async def _stream(self, request: web.Request, events) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for event in events:
                await response.write(event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the gateway hung up: what it should do
        return response

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        model, limit = body["model"], body.get("max_completion_tokens") or body.get("max_tokens")
        if not body.get("stream"):
            return web.json_response(self._whole_chat(model))
        if model == "endless":
            events = (_sse(_chunk({"content": DELTA})) for _ in itertools.count())
        elif model == "endless-reasoning":
            events = (_sse(_chunk({"reasoning_content": DELTA})) for _ in itertools.count())
        elif model in ("usage-past", "prompt-past"):
            usage = _usage(PROMPT_TOKENS, 100_000)
            if model == "prompt-past":
                usage = _usage(100_000, 4)  # more prompt tokens than the request has bytes
            events = iter(
                [
                    _sse(_chunk({"content": "Short answer."}, "stop")),
                    _sse(_chunk({}, usage=usage)),
                    b"data: [DONE]\n\n",
                ]
            )
        else:  # "exact-length": exactly the limit, 4 bytes a token, then "length"
            pieces = ["word" for _ in range(limit)]
            events = itertools.chain(
                (_sse(_chunk({"content": piece})) for piece in pieces),
                [
                    _sse(_chunk({}, "length")),
                    _sse(_chunk({}, usage=_usage(PROMPT_TOKENS, limit))),
                    b"data: [DONE]\n\n",
                ],
            )
        return await self._stream(request, events)

    @staticmethod
    def _whole_chat(model: str) -> dict:
        text, usage = "Short answer.", _usage(PROMPT_TOKENS, 4)
        if model == "endless":
            text, usage = DELTA * 4, None  # 64 KiB, no usage: counted by the gateway
        elif model == "usage-past":
            usage = _usage(PROMPT_TOKENS, 100_000)
        elif model == "prompt-past":
            usage = _usage(100_000, 4)
        answer = {
            "id": "chatcmpl-runaway",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-name",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
        return answer if usage is None else {**answer, "usage": usage}

    async def responses(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        created = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
        head = [
            _sse(
                {"type": "response.created", "sequence_number": 0, "response": created},
                "response.created",
            ),
        ]
        deltas = (
            _sse(
                {
                    "type": "response.output_text.delta",
                    "sequence_number": n,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": DELTA,
                },
                "response.output_text.delta",
            )
            for n in itertools.count(1)
        )
        return await self._stream(request, itertools.chain(head, deltas))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        await self.record(request)
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "upstream-name",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1},
        }
        head = [
            _sse({"type": "message_start", "message": message}, "message_start"),
            _sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
                "content_block_start",
            ),
        ]
        delta = _sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": DELTA},
            },
            "content_block_delta",
        )
        return await self._stream(request, itertools.chain(head, itertools.repeat(delta)))


def _usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@pytest.fixture(scope="module")
def runaway():
    with Runaway() as fake:
        yield fake


@pytest.fixture(scope="module")
def gw(tmp_path_factory, runaway):
    config = f"""
[providers.runaway]
kind = "openai"
base_url = "{runaway.url}/v1"
api_key_env = "RUNAWAY_KEY"

[providers.runaway-chat]
kind = "openai"
base_url = "{runaway.url}/chatonly/v1"
api_key_env = "RUNAWAY_KEY"

[providers.runaway-anthropic]
kind = "anthropic"
base_url = "{runaway.url}/anthropic"
api_key_env = "RUNAWAY_KEY"
"""
    for name in ("endless", "endless-reasoning", "usage-past", "prompt-past", "exact-length"):
        config += _model(name, "runaway", name)
    config += _model("translated-endless", "runaway-chat", "endless")
    config += _model("anthropic-endless", "runaway-anthropic", "endless")
    config += _model("big-endless", "runaway", "endless", max_output_tokens=BIG_LIMIT)
    folder = tmp_path_factory.mktemp("output-limit")
    with GatewayProcess(folder, extra_config=config, env={"RUNAWAY_KEY": "sk-runaway"}) as process:
        yield process


@pytest.fixture(scope="module")
def project(gw) -> str:
    return gw.create_project("output-limit", "--balance", "1000")


@pytest.fixture(scope="module")
def http(gw, project):
    key = gw.create_key(project, "inference,receipts")
    with httpx.Client(
        base_url=gw.url, headers={"authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


def _chat(model: str, limit: int | None, **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "Go on forever."}], **extra}
    return body if limit is None else {**body, "max_tokens": limit}


def _chat_output(payloads: list) -> str:
    return "".join(
        (choice["delta"].get("content") or "") + (choice["delta"].get("reasoning_content") or "")
        for payload in payloads
        if isinstance(payload, dict)
        for choice in payload.get("choices", ())
    )


def _receipt(http: httpx.Client, receipt_id: str) -> dict:
    response = http.get(f"/v1/receipts/{receipt_id}")
    assert response.status_code == 200, response.text
    return response.json()


def _assert_billed_at_list_price(receipt: dict, held: int) -> None:
    usage = receipt["usage"]
    assert usage["output_tokens"] <= held
    expected = cost_of_tokens(usage["input_tokens"], INPUT_PRICE) + cost_of_tokens(
        usage["output_tokens"], OUTPUT_PRICE
    )
    assert micros(receipt["cost"]) == expected  # what it covers, not capped below it


STREAMS = {  # model, endpoint, how the client reads the output off the events
    "chat pass-through": ("endless", "/v1/chat/completions"),
    "chat, reasoning": ("endless-reasoning", "/v1/chat/completions"),
    "chat from Anthropic": ("anthropic-endless", "/v1/chat/completions"),
    "native Responses": ("endless", "/v1/responses"),
    "translated Responses": ("translated-endless", "/v1/responses"),
}


@pytest.mark.parametrize("case", STREAMS)
def test_an_endless_stream_stops_at_the_held_output_and_bills_what_was_delivered(
    gw, project, http, case
):
    model, path = STREAMS[case]
    limit = 1000
    held = held_output_tokens(limit, 4096)
    before = books(gw, project)
    if path == "/v1/responses":
        body = {"model": model, "input": "Go on forever.", "max_output_tokens": limit}
    else:
        body = _chat(model, limit)
    response = http.post(path, json={**body, "stream": True})
    assert response.status_code == 200
    events = read_sse(response.content)
    if path == "/v1/responses":
        delivered = "".join(
            orjson.loads(data).get("delta", "")
            for name, data in events
            if name == "response.output_text.delta"
        )
        name, last = events[-1]
        assert name == "error"
        assert orjson.loads(last)["error"]["type"] == "provider_error"
    else:
        payloads = sse_payloads(response.content)
        delivered = _chat_output(payloads)
        assert payloads[-1]["error"]["type"] == "provider_error"
    # Not one byte past the hold; the event that crossed it was cut short, not dropped.
    assert held * 4 - len(DELTA) < len(delivered.encode()) <= held * 4
    receipt = _receipt(http, response.headers["x-receipt-id"])
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == -(-len(delivered.encode()) // 4)
    _assert_billed_at_list_price(receipt, held)
    after = books(gw, project)
    assert before["balance"] - after["balance"] == micros(receipt["cost"])
    assert after["reserved"] == 0


def test_a_stream_whose_usage_is_past_the_hold_ends_failed_billed_what_it_delivered(
    gw, project, http
):
    held = held_output_tokens(50, 4096)
    response = http.post(
        "/v1/chat/completions",
        json=_chat("usage-past", 50, stream=True, stream_options={"include_usage": True}),
    )
    payloads = sse_payloads(response.content)
    assert _chat_output(payloads) == "Short answer."
    assert "[DONE]" not in payloads and payloads[-1]["error"]["type"] == "provider_error"
    assert not any(isinstance(p, dict) and p.get("usage") for p in payloads)  # never shown
    receipt = _receipt(http, response.headers["x-receipt-id"])
    assert receipt["status"] == "failed" and receipt["usage_source"] == "gateway"
    assert receipt["usage"]["output_tokens"] == -(-len(b"Short answer.") // 4)
    _assert_billed_at_list_price(receipt, held)


@pytest.mark.parametrize("model", ["endless", "usage-past"])
def test_a_whole_answer_past_the_held_output_is_502_billed_its_input_only(gw, project, http, model):
    before = books(gw, project)
    response = http.post("/v1/chat/completions", json=_chat(model, 16))
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "provider_error"
    receipt = _receipt(http, response.headers["x-receipt-id"])
    assert receipt["status"] == "failed"
    assert receipt["usage"]["output_tokens"] == 0
    input_cost = cost_of_tokens(receipt["usage"]["input_tokens"], INPUT_PRICE)
    assert micros(receipt["cost"]) == input_cost > 0
    after = books(gw, project)
    assert before["balance"] - after["balance"] == input_cost and after["reserved"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_answer_that_ends_at_its_limit_is_never_cut(gw, http, stream):
    limit = 300
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    response = http.post("/v1/chat/completions", json=_chat("exact-length", limit, **extra))
    assert response.status_code == 200
    if stream:
        payloads = sse_payloads(response.content)
        assert payloads[-1] == "[DONE]"
        assert len(_chat_output(payloads)) == limit * 4
        assert payloads[-3]["choices"][0]["finish_reason"] == "length"
    receipt = _receipt(http, response.headers["x-receipt-id"])
    assert receipt["status"] == "succeeded"


def test_a_limit_above_the_models_is_clamped_not_refused(gw, runaway, http):
    response = http.post("/v1/chat/completions", json=_chat("exact-length", 10_000_000))
    assert response.status_code == 200
    assert runaway.sent(model="exact-length")[-1].body["max_tokens"] == 4096


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_an_endless_stream_keeps_the_gateways_memory_flat(gw, http):
    """32 MiB relayed (within a hold of 40 MB): the gateway grows by less than 8 MiB
    from the first 4 MiB to the end (it kept every event's JSON: +280 MiB at 96 MiB)."""
    body = _chat("big-endless", None, stream=True)
    relayed, start_rss = 0, None
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            relayed += len(chunk)
            if start_rss is None and relayed > 4 << 20:
                start_rss = _rss_kib(gw.process.pid)
            if relayed > 36 << 20:
                break
    assert start_rss is not None
    growth_kib = _rss_kib(gw.process.pid) - start_rss
    assert growth_kib < 8 << 10, f"the gateway grew by {growth_kib} KiB"


# The count where the pass-through reads it (the decoded struct) and where a rendered chunk
# is cut (the dict) must agree for every form of output an upstream may send: a form one
# of them did not count was relayed past the hold for free (a review found five).
OUTPUT_FORMS = {
    "content": {"content": "x" * 100},
    "reasoning fields that differ": {"reasoning_content": "a", "reasoning": "R" * 1000},
    "reasoning_content not text": {"reasoning_content": 1, "reasoning": "R" * 1000},
    "legacy function call": {"content": "", "function_call": {"name": "f", "arguments": "A" * 999}},
    "audio": {"content": "", "audio": {"transcript": "T" * 1000, "data": "QUFB" * 250}},
}


@pytest.mark.parametrize("form", OUTPUT_FORMS)
def test_every_form_of_output_counts_against_the_hold_in_a_pass_through(form):
    delivered = Delivered(20)  # 80 bytes
    relay = ChatPassThrough("m", False, Prompt("hi", 100), delivered)
    events = ChatEvents("runaway")
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    chunk["choices"] = [{"index": 0, "delta": OUTPUT_FORMS[form], "finish_reason": None}]
    for _ in range(50):
        batch, failure = events.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
        assert failure is None
        relay.feed(batch)
        if delivered.cut:
            break
    assert delivered.cut and delivered.size <= 80


def test_a_delta_cut_short_never_counts_past_the_room():
    delta = {"reasoning_content": "é", "reasoning": "r", "tool_calls": [
        {"index": 0, "function": {"name": "n", "arguments": "a"}}
    ]}  # fmt: skip
    delivered = Delivered(1)
    delivered.take(3)  # one byte of room left: less than "é"
    cut = delivered_chunk(delivered, {"choices": [{"index": 0, "delta": delta}]})
    assert delivered.cut and delivered.size <= 4
    assert len(message_output(cut["choices"][0]["delta"]).encode()) <= 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_prompt_count_past_the_requests_bytes_is_no_count(gw, http, stream):
    """No tokenizer makes more tokens than bytes: such a count is replaced by the gateway's
    own, as any broken count is, so the receipt's cost is its usage at list price (it was
    capped at the hold, below what the receipt said it billed)."""
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    body = _chat("prompt-past", 50, **extra)
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    if stream:
        shown = sse_payloads(response.content)[-2]["usage"]
    else:
        shown = response.json()["usage"]
    receipt = _receipt(http, response.headers["x-receipt-id"])
    assert receipt["usage_source"] == "gateway"
    assert receipt["usage"]["input_tokens"] < len(orjson.dumps(body))
    assert shown["prompt_tokens"] == receipt["usage"]["input_tokens"]  # shown as billed
    _assert_billed_at_list_price(receipt, held_output_tokens(50, 4096))
