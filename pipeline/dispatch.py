"""Dispatch: the terminal stage, which runs the endpoint's handler.

Reads: `ctx.endpoint.handler`. Writes: whatever the handler records in `ctx` (its
`billing`). Rejects: whatever the handler raises as a GatewayError, rendered as the
spec's error object. A client that disconnects while the handler works or its response
goes out cancels it at once (and with it any upstream call), and sets
`ctx.client_left`; nothing is sent to a client that is gone.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope, Send

from model_gateway.pipeline.context import RequestContext, request_context
from model_gateway.pipeline.errors import GatewayError, send_error
from model_gateway.pipeline.routing import answer_foreign_scope


async def _cancel_on_disconnect(
    ctx: RequestContext, receive: Receive, exchange: asyncio.Future[None]
) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    ctx.client_left = True
    exchange.cancel()


async def _serve(ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
    assert ctx.endpoint is not None
    try:
        response = await ctx.endpoint.handler(ctx)
    except GatewayError as error:
        await send_error(send, error, ctx.request_id)
        return
    await response(scope, receive, send)


class Dispatch:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:
            await answer_foreign_scope(scope, receive, send)
            return
        # The watch covers the handler and its response (a stream included); plain asyncio
        # tasks, because an anyio task group here cost ~10x more on every request.
        exchange = asyncio.ensure_future(_serve(ctx, scope, receive, send))
        watcher = asyncio.ensure_future(_cancel_on_disconnect(ctx, receive, exchange))
        try:
            await exchange
        except asyncio.CancelledError:
            if watcher.done():
                return  # the client left: nobody to answer
            raise
        finally:
            watcher.cancel()
