"""A fake Anthropic Messages upstream (see fake_upstream for its fault modes).

It checks the protocol's headers (x-api-key, anthropic-version) and the shapes the
Messages API insists on (alternating roles, a max_tokens, no system role in messages),
and records every request with its headers (anthropic-beta among them).
`/v1/messages/count_tokens` answers COUNTED_TOKENS for any request. Modes of this fake:

| model        | non-streaming                       | streaming                           |
|--------------|-------------------------------------|-------------------------------------|
| cache        | usage with cache reads and writes   | the same, in message_start          |
| cached       | INPUT_TOKENS in all: cache reads,   | the same, in message_start          |
|              | writes (5-minute and 1-hour apart)  |                                     |
|              | and the rest (the contract's mode)  |                                     |
| stream-error | normal                              | two text events, then an in-band    |
|              |                                     | `error` event with SECRET in it     |
| long         | LONG_PIECES as the text             | the same, a delta each              |
"""

from __future__ import annotations

import itertools

import orjson
from aiohttp import web

from tests.support.fake_upstream import (
    INPUT_TOKENS,
    MALFORMED,
    OUTPUT_TOKENS,
    REPLY_PIECES,
    SECRET,
    FakeUpstream,
    sse,
    usage_for,
)

TOOL_INPUT_PARTS = ['{"city":', ' "Paris"}']
COUNTED_TOKENS = 4242  # what count_tokens answers: no estimate of the gateway's says so
# `cache`: beside its INPUT_TOKENS (uncached), the prompt read and wrote these from cache.
CACHE_READS, CACHE_WRITES = 7, 3
# `cached` (the mode every fake has for tests/providers/test_contract.py): of its
# INPUT_TOKENS in all, the cache's reads, its writes, and the 1-hour writes among those.
CACHED_READS, CACHED_WRITES, CACHED_WRITES_1H = 4, 3, 2
CACHE, CACHED, STREAM_ERROR, LONG = "cache", "cached", "stream-error", "long"
LONG_PIECES = [f"Piece {n} of a long answer that goes on and on. " for n in range(60)]


def _usage(model: str, output_tokens: int) -> dict:
    usage = {"input_tokens": INPUT_TOKENS, "output_tokens": output_tokens}
    if model == CACHE:
        usage |= {
            "cache_read_input_tokens": CACHE_READS,
            "cache_creation_input_tokens": CACHE_WRITES,
        }
    if model == CACHED:
        usage |= {
            "input_tokens": INPUT_TOKENS - CACHED_READS - CACHED_WRITES,
            "cache_read_input_tokens": CACHED_READS,
            "cache_creation_input_tokens": CACHED_WRITES,
            "cache_creation": {
                "ephemeral_5m_input_tokens": CACHED_WRITES - CACHED_WRITES_1H,
                "ephemeral_1h_input_tokens": CACHED_WRITES_1H,
            },
        }
    return usage_for(model, usage)


def _problem(body: dict) -> str | None:
    """What the real API would reject this body for, if anything."""
    if not isinstance(body.get("max_tokens"), int):
        return "max_tokens is required"
    roles = [m.get("role") for m in body.get("messages", [])]
    if not roles or roles[0] != "user" or any(r not in ("user", "assistant") for r in roles):
        return "messages must start with user and hold only user and assistant"
    if any(a == b for a, b in itertools.pairwise(roles)):
        return "roles must alternate"
    return None


def _reply(body: dict) -> tuple[list[str], str, dict | None]:
    """(text pieces, stop_reason, tool_use block) the fake answers `body` with."""
    model = body["model"]
    last = body["messages"][-1]["content"]
    results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
    if results:
        return [f"The tool said: {results[0].get('content')}"], "end_turn", None
    if model == "tool-call" and body.get("tools"):
        block = {"type": "tool_use", "id": "toolu_fake1", "name": body["tools"][0]["name"]}
        return ["Let me check."], "tool_use", block
    if model == "length":
        return REPLY_PIECES[:2], "max_tokens", None
    if model == LONG:
        return LONG_PIECES, "end_turn", None
    return REPLY_PIECES, "end_turn", None


class FakeAnthropic(FakeUpstream):
    def __init__(self, credential: str) -> None:
        super().__init__()
        self.credential = credential

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
            web.post("/stolen", self.stolen),
        ]

    def provider_config(self, name: str) -> tuple[str, dict[str, str]]:
        """The `[providers.NAME]` block pointing at this fake, and its credential's variable."""
        block = f"""
[providers."{name}"]
kind = "anthropic"
base_url = "{self.url}"
api_key_env = "FAKE_ANTHROPIC_KEY"
"""
        return block, {"FAKE_ANTHROPIC_KEY": self.credential}

    def _refusal(self, request: web.Request, problem: str | None) -> web.Response | None:
        """What the real API answers a request without its credential or version."""
        if request.headers.get("x-api-key") != self.credential:
            error = {"type": "authentication_error", "message": "invalid x-api-key"}
            return web.json_response({"type": "error", "error": error}, status=401)
        if not request.headers.get("anthropic-version"):
            problem = "no anthropic-version"
        if problem:
            error = {"type": "invalid_request_error", "message": problem}
            return web.json_response({"type": "error", "error": error}, status=400)
        return None

    async def answer(self, request: web.Request, model: str, payload: dict) -> web.StreamResponse:
        """As the API answers: compact JSON (the faults of fake_upstream's alike)."""
        if model in ("cut-mid-stream", "stall-after-accept"):
            return await super().answer(request, model, payload)
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        refusal = self._refusal(request, None if body.get("messages") else "messages required")
        return refusal or web.json_response({"input_tokens": COUNTED_TOKENS})

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self.record(request)
        refusal = self._refusal(request, _problem(body))
        if refusal is not None:
            return refusal
        model = body["model"]
        early = await self.before_answer(request, model)
        if early is not None:
            return early
        pieces, stop_reason, tool = _reply(body)
        usage = _usage(model, OUTPUT_TOKENS)
        if not body.get("stream"):
            content = [{"type": "text", "text": "".join(pieces)}]
            if tool:
                content.append({**tool, "input": {"city": "Paris"}})
            message = {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": "not a list" if model == MALFORMED else content,
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": usage,
            }
            return await self.answer(request, model, message)

        def event(name: str, **fields) -> bytes:
            return sse({"type": name, **fields}, event=name)

        start = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "usage": _usage(model, 1),
        }
        events = [
            event("message_start", message=start),
            event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            *[
                event(
                    "content_block_delta",
                    index=0,
                    delta="x" if model == MALFORMED else {"type": "text_delta", "text": p},
                )
                for p in pieces
            ],
            event("ping"),
            event("content_block_stop", index=0),
        ]
        if tool:
            events.append(
                event("content_block_start", index=1, content_block={**tool, "input": {}})
            )
            events += [
                event(
                    "content_block_delta",
                    index=1,
                    delta={"type": "input_json_delta", "partial_json": part},
                )
                for part in TOOL_INPUT_PARTS
            ]
            events.append(event("content_block_stop", index=1))
        delta_usage = usage_for(model, {"output_tokens": OUTPUT_TOKENS})
        events += [
            event("message_delta", delta={"stop_reason": stop_reason}, usage=delta_usage),
            event("message_stop"),
        ]
        if model == STREAM_ERROR:  # after two text events, as the API reports overload
            error = {"type": "overloaded_error", "message": f"Overloaded: {SECRET}"}
            events[4:] = [event("error", error=error)]
        return await self.stream(request, model, events, text_from=2)
