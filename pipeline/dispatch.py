"""Dispatch: the terminal stage, which runs the endpoint's handler.

Reads: `ctx.endpoint.handler`. Writes: whatever the handler records in `ctx`. Rejects:
whatever the handler raises as a GatewayError, rendered as the spec's error object.
"""

from __future__ import annotations

from gateway.errors import GatewayError, send_error
from pipeline.context import context_of


class Dispatch:
    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        try:
            response = await ctx.endpoint.handler(ctx)
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        await response(scope, receive, send)
