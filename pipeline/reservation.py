"""Reservation: holds the most a request can cost before it runs, and owns that hold.

Reads: `ctx.endpoint.pricing`, `ctx.project`, `ctx.key`. Writes: `ctx.hold`,
`ctx.receipt_id` (allocated now, so `x-receipt-id` can go out with a stream's first
byte), and the `x-receipt-id` header on successful responses and on errors that were
billed (an upstream's answer past the held output: its input). Rejects: 402
budget_exceeded (key's monthly limit or project's monthly budget), 402
insufficient_balance (balance minus open reservations), 503 service_unavailable (a model
without a price). Whatever happens inside (error, disconnect, cancellation, a settlement
that failed), the hold is released on the way out unless settle committed it.
"""

from __future__ import annotations

import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.errors import GatewayError, send_error
from model_gateway.pipeline.hold import Hold
from model_gateway.pipeline.ports import Meter


def new_receipt_id() -> str:
    """Milliseconds first, then 64 random bits: ids grow with time, so a storage's index of
    them takes each new receipt at its end rather than at a random page (throughput that
    does not fall as receipts pile up), and an id is still unguessable."""
    return f"rcpt_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"


class Reservation:
    def __init__(self, app: ASGIApp, *, meter: Meter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        assert ctx.endpoint is not None and ctx.project is not None
        pricing = ctx.endpoint.pricing
        if pricing is None:
            await self.app(scope, receive, send)
            return
        try:
            amount = pricing.estimate(ctx)
            key_id = ctx.key.id if ctx.key is not None else None
            # A stream's client may read its project while the stream runs.
            watched = getattr(ctx.payload, "stream", None) is True
            hold = ctx.hold = await Hold.take(
                self.meter, ctx.project.id, key_id, amount, watched=watched
            )
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        ctx.receipt_id = new_receipt_id()
        receipt_header = (b"x-receipt-id", ctx.receipt_id.encode())

        async def send_with_receipt_id(message: Message) -> None:
            if message["type"] == "http.response.start" and (
                message["status"] < 400 or ctx.billing is not None
            ):
                message["headers"] = [*message.get("headers", ()), receipt_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_receipt_id)
        finally:
            await hold.release()  # a no-op when settle committed it
