"""Key auth: who is calling.

Reads: `authorization` (Bearer, scheme case-insensitive) or, only when that header is
absent, `x-api-key`. Query strings and cookies are never read. Writes: `ctx.key`,
`ctx.project`. Rejects: 401 invalid_api_key (no, malformed, unknown, revoked or expired
key, all with one identical message), 403 forbidden (archived project).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.errors import GatewayError, InvalidApiKey, send_error
from model_gateway.pipeline.ports import KeyLookup


def presented_key(headers: Headers) -> str:
    """The key from the request headers, or InvalidApiKey."""
    authorization = headers.getlist("authorization")
    if len(authorization) > 1:
        raise InvalidApiKey()  # two Authorization headers: ambiguous, so malformed
    if authorization:
        scheme, _, credential = authorization[0].partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise InvalidApiKey()
        return credential.strip()
    api_key = headers.get("x-api-key", "").strip()
    if api_key:
        return api_key
    raise InvalidApiKey()


class KeyAuth:
    def __init__(self, app: ASGIApp, *, keys: KeyLookup) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        try:
            ctx.key, ctx.project = await self.keys.authenticate(presented_key(Headers(scope=scope)))
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        await self.app(scope, receive, send)
