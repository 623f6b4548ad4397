"""Admission: the endpoint's own checks that need I/O, before anything is reserved.

Reads: `ctx.endpoint.admit`, `ctx.payload`, `ctx.project`. Writes: what the check
attaches to the payload that pricing then depends on (e.g. the sandbox configuration,
whose time limit fixes the hold). Rejects: whatever the check raises (a foreign or
unknown sandbox: 404 not_found).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.errors import GatewayError, send_error


class Admission:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        assert ctx.endpoint is not None
        if ctx.endpoint.admit is not None:
            try:
                await ctx.endpoint.admit(ctx)
            except GatewayError as error:
                await send_error(send, error, ctx.request_id)
                return
        await self.app(scope, receive, send)
