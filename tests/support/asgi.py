"""In-process ASGI helpers for stage tests: call an app with exact messages, and a recording
fake inner app that stands where the rest of the chain would be."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from model_gateway.pipeline.context import STATE_KEY, RequestContext
from model_gateway.pipeline.request_id import new_request_id


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1")


@dataclass
class Reply:
    """What an ASGI app sent, shaped like an httpx.Response where it matters."""

    status_code: int
    raw_headers: list[tuple[bytes, bytes]]
    content: bytes
    messages: list[dict]
    receive_calls: int

    @property
    def headers(self) -> httpx.Headers:
        return httpx.Headers(self.raw_headers)

    def json(self) -> Any:
        return orjson.loads(self.content)


async def call(
    app,
    method: str = "GET",
    path: str = "/",
    *,
    headers: list[tuple[str | bytes, str | bytes]] | dict | None = None,
    body: bytes | list[bytes] = b"",
    root_path: str = "",
    query_string: bytes = b"",
    disconnect_after_body: bool = True,
) -> Reply:
    """Run one HTTP request through `app`; `body` as a list is sent as separate chunks."""
    if isinstance(headers, dict):
        headers = list(headers.items())
    raw = [(_bytes(k).lower(), _bytes(v)) for k, v in (headers or [])]
    chunks = [body] if isinstance(body, bytes) else list(body)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": root_path,
        "query_string": query_string,
        "headers": raw,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }
    sent: list[dict] = []
    receive_calls = 0
    pending = list(chunks)

    async def receive() -> dict:
        nonlocal receive_calls
        receive_calls += 1
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        if disconnect_after_body:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # a client that stays connected
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) <= 1, f"more than one response started: {starts}"
    status = starts[0]["status"] if starts else 0
    resp_headers = [(bytes(k), bytes(v)) for k, v in starts[0].get("headers", [])] if starts else []
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return Reply(status, resp_headers, content, sent, receive_calls)


@dataclass
class Seen:
    """One request as the fake inner app saw it."""

    scope: dict
    ctx: RequestContext | None
    body: bytes | None


@dataclass
class Recorder:
    """A fake inner app: records what reached it and answers what the test says."""

    status: int = 200
    body: bytes = b'{"reached":"inner"}'
    headers: list[tuple[bytes, bytes]] = field(
        default_factory=lambda: [(b"content-type", b"application/json; charset=utf-8")]
    )
    read_body: bool = False
    calls: list[Seen] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.calls)

    @property
    def last(self) -> Seen:
        assert self.calls, "the inner app was never called"
        return self.calls[-1]

    async def __call__(self, scope, receive, send) -> None:
        ctx = scope.get("state", {}).get(STATE_KEY)
        received = None
        if self.read_body:
            parts = []
            while True:
                message = await receive()
                parts.append(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body"):
                    break
            received = b"".join(parts)
        self.calls.append(Seen(scope, ctx, received))
        if scope["type"] != "http":
            return
        headers = [*self.headers, (b"content-length", str(len(self.body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


class WithContext:
    """Stands in for the stages before the one under test: sets fields of the request's
    context (the one RequestId made, when it wraps this; else a new one)."""

    def __init__(self, app, **fields: Any) -> None:
        self.app = app
        self.fields = fields
        self.last: RequestContext | None = None

    async def __call__(self, scope, receive, send) -> None:
        state = scope.setdefault("state", {})
        ctx = state.get(STATE_KEY)
        if ctx is None:
            ctx = state[STATE_KEY] = RequestContext(new_request_id())
        for name, value in self.fields.items():
            setattr(ctx, name, value)
        self.last = ctx
        await self.app(scope, receive, send)
