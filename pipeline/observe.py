"""Observe: tells the observers (metrics, the access log) how each request went.

Reads: the response status as it goes out, and at the end the whole `ctx` (endpoint,
model, provider, project, settled hold). Writes: nothing. Rejects: nothing. It sits just
inside the request id stage, so it sees every answer, the stages' refusals included; an
exception that escapes is observed as a 500, as the request id stage then answers it. A
client that left before its response was sent in full is observed as 499 (nginx's
"client closed request"), whatever had started.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.ports import RequestObserver

CLIENT_CLOSED_REQUEST = 499


class Observe:
    def __init__(self, app: ASGIApp, *, observers: Sequence[RequestObserver]) -> None:
        self.app = app
        self.observers = tuple(observers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None or not self.observers:  # (None: not one of the chain's requests)
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # until a response starts: an escaped exception is answered 500
        sent = False  # the response's last body message went out

        async def send_observed(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
            elif not message.get("more_body", False):
                sent = True
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            seconds = time.perf_counter() - started
            # (A server reports a disconnect to whoever listens once a response is sent:
            # only a client that left before is one that closed the request.)
            if ctx.client_left and not sent:
                status = CLIENT_CLOSED_REQUEST
            for observer in self.observers:
                observer.request_done(ctx, scope["method"], scope["path"], status, seconds)
