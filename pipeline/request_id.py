"""Request id: the outermost stage.

Writes: `ctx` (a new RequestContext with a `req_` id) into scope["state"], and the
`x-request-id` header on every response. Rejects: nothing; an exception that escapes
the inner stages is logged with the request id and answered as a generic internal_error.
"""

from __future__ import annotations

import logging
import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import STATE_KEY, RequestContext
from model_gateway.pipeline.errors import InternalError, send_error

log = logging.getLogger("gateway")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = RequestContext(new_request_id())
        scope.setdefault("state", {})[STATE_KEY] = ctx
        header = (b"x-request-id", ctx.request_id.encode())
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            # The stack trace goes to our log only; the client gets the generic error.
            log.exception("unexpected failure request_id=%s", ctx.request_id)
            if not started:
                await send_error(send_with_id, InternalError(), ctx.request_id)
