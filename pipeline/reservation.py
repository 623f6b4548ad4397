"""Reservation: holds the most a request can cost before it runs, and owns that hold.

Reads: `ctx.endpoint.pricing`, `ctx.project`, `ctx.key`. Writes: `ctx.reservation`,
`ctx.receipt_id` (allocated now, so `x-receipt-id` can go out with a stream's first
byte), and the `x-receipt-id` header on successful responses. Rejects: 402
budget_exceeded (key's monthly limit or project's monthly budget), 402
insufficient_balance (balance minus open reservations), 503 service_unavailable (a model
without a price). Whatever happens inside (error, disconnect, cancellation), a hold that
settle did not consume is released on the way out, shielded from cancellation.
"""

from __future__ import annotations

import secrets

import anyio

from gateway.errors import GatewayError, send_error
from gateway.metering import Meter
from pipeline.context import context_of


class Reservation:
    def __init__(self, app, *, meter: Meter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        pricing = ctx.endpoint.pricing
        if pricing is None:
            await self.app(scope, receive, send)
            return
        try:
            amount = pricing.estimate(ctx)
            key_id = ctx.key.id if ctx.key is not None else None
            # Shielded: a hold taken for a request cancelled meanwhile must still be released.
            with anyio.CancelScope(shield=True):
                ctx.reservation = await self.meter.reserve(ctx.project.id, key_id, amount)
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        ctx.receipt_id = "rcpt_" + secrets.token_hex(12)
        receipt_header = (b"x-receipt-id", ctx.receipt_id.encode())

        async def send_with_receipt_id(message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                message["headers"] = [*message.get("headers", ()), receipt_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_receipt_id)
        finally:
            if ctx.reservation is not None:  # settle clears it once it has closed the hold
                with anyio.CancelScope(shield=True):
                    await self.meter.release(ctx.reservation)
                ctx.reservation = None
