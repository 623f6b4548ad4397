"""Dispatch: the terminal stage, which runs the endpoint's handler.

Reads: `ctx.endpoint.handler`. Writes: whatever the handler records in `ctx`. Rejects:
whatever the handler raises as a GatewayError, rendered as the spec's error object. A
client that disconnects while the handler works cancels it at once (and with it any
upstream call); nothing is sent to a client that is gone.
"""

from __future__ import annotations

import anyio

from gateway.errors import GatewayError, send_error
from pipeline.context import context_of


async def _until_disconnect(receive, cancel_scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    cancel_scope.cancel()


class Dispatch:
    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        response = error = None
        async with anyio.create_task_group() as watch:
            watch.start_soon(_until_disconnect, receive, watch.cancel_scope)
            try:
                response = await ctx.endpoint.handler(ctx)
            except GatewayError as raised:  # caught here: the task group would wrap it
                error = raised
            watch.cancel_scope.cancel()
        if error is not None:
            await send_error(send, error, ctx.request_id)
        elif response is not None:  # None: the client left while the handler ran
            await response(scope, receive, send)
