"""CORS: answers browsers only for origins the operator listed.

Reads: `origin`, and on preflight `access-control-request-method`. Writes: the CORS
headers for allowed origins (methods GET/POST/OPTIONS, request headers authorization,
content-type, x-api-key, exposed x-request-id and x-receipt-id, max-age 600, never
credentials). Rejects: nothing; other origins simply get no CORS headers.
"""

from __future__ import annotations

ALLOW_METHODS = b"GET, POST, OPTIONS"
ALLOW_HEADERS = b"authorization, content-type, x-api-key"
EXPOSE_HEADERS = b"x-request-id, x-receipt-id"
MAX_AGE = b"600"


def _header(scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


class Cors:
    def __init__(self, app, *, origins: list[str]) -> None:
        self.app = app
        self.origins = frozenset(o.encode() for o in origins)
        self._preflight_headers = [
            (b"access-control-allow-methods", ALLOW_METHODS),
            (b"access-control-allow-headers", ALLOW_HEADERS),
            (b"access-control-max-age", MAX_AGE),
            (b"vary", b"Origin"),
            (b"content-length", b"0"),
        ]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.origins:
            await self.app(scope, receive, send)
            return
        origin = _header(scope, b"origin")
        if origin is None or origin not in self.origins:
            await self.app(scope, receive, send)
            return
        allow_origin = (b"access-control-allow-origin", origin)
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method"):
            headers = [allow_origin, *self._preflight_headers]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", ()),
                    allow_origin,
                    (b"access-control-expose-headers", EXPOSE_HEADERS),
                    (b"vary", b"Origin"),
                ]
            await send(message)

        await self.app(scope, receive, send_with_cors)
