"""What the fake OpenAI and Anthropic upstreams share: a real aiohttp.web server on a
loopback port, run in its own thread (so sync and async tests alike can use it), that
records every request and fails on demand.

The fault is chosen by the requested upstream model name:

| model                  | non-streaming                   | streaming                     |
|------------------------|---------------------------------|-------------------------------|
| fault-400              | 400 with SECRET in the body     | the same                      |
| fault-500              | 500 with SECRET in the body     | the same                      |
| fail-before-first-byte | connection closed, nothing sent | the same                      |
| slow                   | answers after SLOW_S            | headers after SLOW_S          |
| cut-mid-stream         | half the body, then cut         | three text events, then cut   |
| slow-stream            | normal                          | first event, PAUSE_S, the rest|
| hang-stream            | normal                          | two text events, then hangs   |
| no-usage               | no usage                        | no usage, even when asked     |
| tool-call              | calls the request's first tool  | the same, streamed            |
| length                 | stops at the output limit       | the same                      |
| redirect               | 307 to /stolen on this server   | the same                      |
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

SECRET = "UPSTREAM-BODY-SECRET-5d1c7e"  # in every upstream error body: must never leak
REPLY_PIECES = ["Hello", " from", " the", " fake", " upstream."]
REPLY = "".join(REPLY_PIECES)
INPUT_TOKENS, OUTPUT_TOKENS = 11, 5  # the usage every fake reports
SLOW_S = 3.0
PAUSE_S = 1.0


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

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def start(self) -> FakeUpstream:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            app = web.Application()
            app.add_routes(self.routes())
            self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake upstream did not start")
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        future.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def record(self, request: web.Request) -> dict:
        body = orjson.loads(await request.read())
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append(Recorded(request.path, headers, body))
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
        if model in ("fault-400", "fault-500"):
            status = int(model[-3:])
            error = {"type": "invalid_request_error", "message": f"rejected: {SECRET}"}
            return web.json_response({"type": "error", "error": error}, status=status)
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
        try:
            for i, event in enumerate(events):
                await response.write(event)
                if model == "slow-stream" and i == 0:
                    await asyncio.sleep(PAUSE_S)
                if model == "hang-stream" and i == text_from + 1:
                    await self.hang(request, model)
                if model == "cut-mid-stream" and i == text_from + 2:
                    await asyncio.sleep(0.05)
                    request.transport.abort()
                    return response
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnected[model] = time.monotonic()
            raise
        await response.write_eof()
        return response


def sse(payload: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"
