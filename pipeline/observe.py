"""Observe: tells the observers (metrics, the access log) how each request went.

Reads: the response status as it goes out, and at the end the whole `ctx` (endpoint,
model, provider, project, settled hold). Writes: nothing. Rejects: nothing. It sits just
inside the request id stage, so it sees every answer, the stages' refusals included; an
exception that escapes is observed as a 500, as the request id stage then answers it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.ports import RequestObserver


class Observe:
    def __init__(self, app: ASGIApp, *, observers: Sequence[RequestObserver]) -> None:
        self.app = app
        self.observers = tuple(observers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.observers:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # until a response starts: an escaped exception is answered 500

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            seconds = time.perf_counter() - started
            ctx = context_of(scope)
            for observer in self.observers:
                observer.request_done(ctx, scope["method"], scope["path"], status, seconds)
