"""CORS: answers browsers only for origins the operator listed.

Reads: `origin`, and on preflight `access-control-request-method`. Writes: the CORS
headers for allowed origins (methods GET/POST/OPTIONS, request headers authorization,
content-type, x-api-key, exposed x-request-id and x-receipt-id, max-age 600, never
credentials). Rejects: nothing; other origins simply get no CORS headers.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ALLOW_METHODS = b"GET, POST, OPTIONS"
ALLOW_HEADERS = b"authorization, content-type, x-api-key, anthropic-version, anthropic-beta"
EXPOSE_HEADERS = b"x-request-id, x-receipt-id"
MAX_AGE = b"600"


class Cors:
    def __init__(self, app: ASGIApp, *, origins: list[str]) -> None:
        self.app = app
        self.origins = frozenset(origins)
        self._preflight_headers = [
            (b"access-control-allow-methods", ALLOW_METHODS),
            (b"access-control-allow-headers", ALLOW_HEADERS),
            (b"access-control-max-age", MAX_AGE),
            (b"vary", b"Origin"),
            (b"content-length", b"0"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.origins:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or origin not in self.origins:
            await self.app(scope, receive, send)
            return
        allow_origin = (b"access-control-allow-origin", origin.encode("latin-1"))
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            preflight = [allow_origin, *self._preflight_headers]
            await send({"type": "http.response.start", "status": 204, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", ()),
                    allow_origin,
                    (b"access-control-expose-headers", EXPOSE_HEADERS),
                    (b"vary", b"Origin"),
                ]
            await send(message)

        await self.app(scope, receive, send_with_cors)
