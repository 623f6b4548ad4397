"""Dispatch: the terminal stage, which runs the endpoint's handler.

Reads: `ctx.endpoint.handler`. Writes: whatever the handler records in `ctx`. Rejects:
whatever the handler raises as a GatewayError, rendered as the spec's error object. A
client that disconnects while the handler works cancels it at once (and with it any
upstream call); nothing is sent to a client that is gone.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError, send_error
from pipeline.context import context_of


async def _cancel_on_disconnect(receive, handler: asyncio.Task) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    handler.cancel()


class Dispatch:
    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        # Plain asyncio tasks: an anyio task group here cost ~10x more on every request.
        handler = asyncio.ensure_future(ctx.endpoint.handler(ctx))
        watcher = asyncio.ensure_future(_cancel_on_disconnect(receive, handler))
        try:
            response = await handler
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        except asyncio.CancelledError:
            if watcher.done():
                return  # the client left: nobody to answer
            raise
        finally:
            watcher.cancel()
        await response(scope, receive, send)
