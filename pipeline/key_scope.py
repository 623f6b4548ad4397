"""Key scope: may this key use this endpoint.

Reads: `ctx.endpoint.scope`, `ctx.key.scopes` (a console session has no key and acts
with full project scope). Rejects: 403 insufficient_scope. The `agents` scope grants
nothing on existing endpoints.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.endpoint import ANY_VALID_KEY
from model_gateway.pipeline.errors import InsufficientScope, send_error


class KeyScope:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        assert ctx.endpoint is not None
        needed = ctx.endpoint.scope
        if needed != ANY_VALID_KEY and ctx.key is not None and needed not in ctx.key.scopes:
            error = InsufficientScope(f"This endpoint requires the '{needed}' scope.")
            await send_error(send, error, ctx.request_id)
            return
        await self.app(scope, receive, send)
