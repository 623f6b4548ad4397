"""Body limit: reads the JSON body, counting bytes as they arrive.

Reads: `content-type`, `content-length` and the body stream, for endpoints that take a
body. Writes: `ctx.body`. Rejects: 400 invalid_request for a Content-Type other than
application/json (parameters such as charset are fine) and for a body over the limit,
announced or actual (Content-Length is not trusted alone).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.errors import InvalidRequest, send_error

MAX_BODY_BYTES = 2 * 1024 * 1024


class _ClientGone(Exception):
    pass


def _declared_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None or not (value.isascii() and value.isdigit()):  # not '²'
        return None
    # int() refuses over 4300 digits; any length of 19 digits or more is over the limit.
    return int(value) if len(value) < 19 else 10**18


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.too_large = f"The request body exceeds {max_bytes // (1024 * 1024)} MB."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        assert ctx.endpoint is not None
        if ctx.endpoint.decode is None:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type != "application/json":
            await send_error(
                send, InvalidRequest("Content-Type must be application/json."), ctx.request_id
            )
            return
        declared = _declared_length(headers)
        if declared is not None and declared > self.max_bytes:
            await send_error(send, InvalidRequest(self.too_large), ctx.request_id)
            return
        try:
            body = await self._read(receive)
        except _ClientGone:
            return  # nobody is left to answer
        if body is None:
            await send_error(send, InvalidRequest(self.too_large), ctx.request_id)
            return
        ctx.body = body
        await self.app(scope, receive, send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
