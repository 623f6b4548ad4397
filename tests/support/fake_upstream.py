"""What the fake OpenAI and Anthropic upstreams share: a real aiohttp.web server on a
loopback port, run in its own thread (so sync and async tests alike can use it), that
records every request and fails on demand.

The fault is chosen by the requested upstream model name:

| model                  | non-streaming                   | streaming                     |
|------------------------|---------------------------------|-------------------------------|
| fault-400              | 400 with SECRET in the body     | the same                      |
| fault-500              | 500 with SECRET in the body     | the same                      |
| fault-NNN (401,429,503)| NNN with SECRET in the body     | the same                      |
| stale-keepalive        | on a kept-alive connection that | the same                      |
|                        | served before: closed, nothing  |                               |
|                        | sent (a stale pooled one); on a |                               |
|                        | new connection: normal          |                               |
| fail-before-first-byte | connection closed, nothing sent | the same                      |
| slow                   | answers after SLOW_S            | headers after SLOW_S          |
| cut-mid-stream         | half the body, then cut         | three text events, then cut   |
| slow-stream            | normal                          | first event, PAUSE_S, the rest|
| hang-stream            | normal                          | two text events, then hangs   |
| no-usage               | no usage                        | no usage, even when asked     |
| tool-call              | calls the request's first tool  | the same, streamed            |
| length                 | stops at the output limit       | the same                      |
| redirect               | 307 to /stolen on this server   | the same                      |
| stall-after-accept     | 200 and its headers, then hangs | first event, then hangs       |
| stall-before-first     | normal                          | 200 and headers, then hangs   |
| usage-negative         | every usage count -7            | the same                      |
| usage-string           | every usage count "11"          | the same                      |
| usage-float            | every usage count 11.5          | the same                      |
| usage-null             | every usage count null          | the same                      |
| usage-bool             | every usage count true          | the same                      |
| usage-huge             | every usage count 2**63         | the same                      |
| usage-not-object       | usage is a string               | the same                      |
| malformed-shape        | the message (output, content)   | text events' delta (or        |
|                        | is not an object/list           | response) of the wrong type   |
| done-then-hang         | normal                          | every event, then hangs       |
|                        |                                 | without ending the body       |
| reasoning-cut-mid-stream (OpenAI) | normal               | the text as reasoning_content,|
|                        |                                 | cut as cut-mid-stream         |
| parts-no-usage (OpenAI)| no usage                        | the text as content parts, no |
|                        |                                 | usage                         |
| huge-number (OpenAI)   | no usage                        | chunks carry 1e400; no usage  |
| huge-answer (OpenAI)   | a 17 MiB answer                 | normal                        |
| refusal (OpenAI)       | the text as `refusal`           | the same, as delta.refusal    |

Hanging answers record the moment the gateway closed the connection in `disconnected`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from tests.support.threaded_site import ThreadedSite

REUSED = web.RequestKey("reused", bool)
SECRET = "UPSTREAM-BODY-SECRET-5d1c7e"  # in every upstream error body: must never leak
REPLY_PIECES = ["Hello", " from", " the", " fake", " upstream."]
REPLY = "".join(REPLY_PIECES)
INPUT_TOKENS, OUTPUT_TOKENS = 11, 5  # the usage every fake reports
SLOW_S = 3.0
PAUSE_S = 1.0

# The value every usage count becomes, per broken-usage mode (2**63 is an integer to any
# JSON reader, though no plausible count).
BROKEN_COUNTS = {
    "usage-negative": -7,
    "usage-string": "11",
    "usage-float": 11.5,
    "usage-null": None,
    "usage-bool": True,
    "usage-huge": 2**63,
}
BROKEN_USAGE_MODES = [*BROKEN_COUNTS, "usage-not-object"]
CUT_MODES = {"cut-mid-stream", "reasoning-cut-mid-stream"}
MALFORMED = "malformed-shape"  # what the gateway reads of an answer, in a wrong type
_COUNT_KEYS = frozenset(
    {"prompt_tokens", "completion_tokens", "total_tokens", "input_tokens", "output_tokens"}
)


def usage_for(model: str, usage: dict | None):
    """The usage an upstream in mode `model` reports instead of `usage`."""
    if usage is None or model not in BROKEN_USAGE_MODES:
        return usage
    if model == "usage-not-object":
        return "lots"
    bad = BROKEN_COUNTS[model]
    return {key: bad if key in _COUNT_KEYS else value for key, value in usage.items()}


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict


@dataclass
class FakeUpstream:
    """Start with `.start()`; `.url` is its base; `.requests` what it received."""

    requests: list[Recorded] = field(default_factory=list)
    # model -> monotonic time at which the gateway closed that model's connection
    disconnected: dict[str, float] = field(default_factory=dict)
    # stale-keepalive: requests met by a closed connection
    stale_closed: int = 0
    # Connections (aiohttp's per-connection handlers) that served a request: kept for
    # the fake's life, a few per test session.
    _served: set = field(default_factory=set)

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def start(self) -> FakeUpstream:
        app = web.Application()
        app.add_routes(self.routes())
        self._site = ThreadedSite(app, "fake upstream", handler_cancellation=True)
        self.port = self._site.start()
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        self._site.stop()

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def record(self, request: web.Request) -> dict:
        body = orjson.loads(await request.read())
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(Recorded(request.path, headers, body))
        # Whether this connection served a request before (stale-keepalive reads it).
        protocol = request.protocol
        request[REUSED] = protocol in self._served
        self._served.add(protocol)
        return body

    def sent(self, *, model: str | None = None, marker: str | None = None) -> list[Recorded]:
        """Recorded requests for an upstream model, or whose body contains `marker`."""
        return [
            r
            for r in self.requests
            if (model is None or r.body.get("model") == model)
            and (marker is None or marker in orjson.dumps(r.body).decode())
        ]

    async def before_answer(self, request: web.Request, model: str) -> web.StreamResponse | None:
        """The faults that look the same whatever the API: an error, silence, slowness."""
        if model.startswith("fault-") and model[6:].isdigit():
            status = int(model[6:])
            error = {"type": "invalid_request_error", "message": f"rejected: {SECRET}"}
            return web.json_response({"type": "error", "error": error}, status=status)
        if model == "stale-keepalive" and request[REUSED]:
            self.stale_closed += 1
            request.transport.close()
            await self.hang(request, model)
        if model == "fail-before-first-byte":
            request.transport.abort()
            await self.hang(request, model)
        if model == "slow":
            try:
                await asyncio.sleep(SLOW_S)
            except asyncio.CancelledError:  # the gateway hung up before the answer
                self.disconnected[model] = time.monotonic()
                raise
        if model == "redirect":
            raise web.HTTPTemporaryRedirect(f"{self.url}/stolen")
        return None

    async def stolen(self, request: web.Request) -> web.Response:
        """Where `redirect` points: whatever arrives here followed a redirect."""
        await self.record(request)
        return web.json_response({"stolen": True})

    async def hang(self, request: web.Request, model: str) -> None:
        """Wait until the gateway closes the connection (the handler is cancelled then)."""
        try:
            await asyncio.sleep(3600)
        finally:
            self.disconnected[model] = time.monotonic()

    async def answer(self, request: web.Request, model: str, payload: dict) -> web.StreamResponse:
        """A whole (non-streamed) answer, with the faults that strike its body."""
        if model == "cut-mid-stream":
            return await self.cut_body(request, payload)
        if model == "stall-after-accept":
            return await self.stall_body(request, model, payload)
        return web.json_response(payload)

    async def stall_body(
        self, request: web.Request, model: str, payload: dict
    ) -> web.StreamResponse:
        """200 and headers promising the body: the upstream has accepted. Then nothing."""
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.content_length = len(orjson.dumps(payload))
        await response.prepare(request)
        await self.hang(request, model)
        return response

    async def cut_body(self, request: web.Request, payload: dict) -> web.StreamResponse:
        """Headers promising the whole JSON body, half of it, then the connection cut."""
        raw = orjson.dumps(payload)
        response = web.StreamResponse(headers={"content-type": "application/json"})
        response.content_length = len(raw)
        await response.prepare(request)
        await response.write(raw[: len(raw) // 2])
        await asyncio.sleep(0.05)
        request.transport.abort()
        return response

    async def stream(
        self, request: web.Request, model: str, events: list[bytes], *, text_from: int
    ) -> web.StreamResponse:
        """Write SSE events one by one, with the stream faults of the model.

        `text_from` is the index of the first event that carries text: hang-stream hangs
        after two text events, cut-mid-stream cuts after three.
        """
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        if model == "stall-before-first":
            await self.hang(request, model)
        try:
            for i, event in enumerate(events):
                await response.write(event)
                if model == "slow-stream" and i == 0:
                    await asyncio.sleep(PAUSE_S)
                if model == "stall-after-accept" and i == 0:
                    await self.hang(request, model)
                if model == "hang-stream" and i == text_from + 1:
                    await self.hang(request, model)
                if model in CUT_MODES and i == text_from + 2:
                    await asyncio.sleep(0.05)
                    request.transport.abort()
                    return response
            if model == "done-then-hang":
                await self.hang(request, model)
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected[model] = time.monotonic()
            raise
        await response.write_eof()
        return response


def sse(payload: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"
