"""Settle: charges what the request actually cost, in the same step that frees its hold.

Reads: `ctx.outcome`, `ctx.usage`, `ctx.response_sha256` (set by the handler),
`ctx.reservation`. Writes: the receipt and its ledger charge (storage), then clears
`ctx.reservation`. It wraps dispatch and acts on the way out: at the response's final
body message, so the books are closed before the client has the last byte, or after
dispatch returns when the response never finished (client gone). A request with no
billable outcome (an error) has its hold released in full instead. The charge never
exceeds the hold.
"""

from __future__ import annotations

import hashlib
import logging
import time

import anyio

from gateway.metering import Meter
from pipeline.context import RequestContext, context_of
from storage import ReceiptRecord

log = logging.getLogger("gateway.metering")

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _receipt(ctx: RequestContext, cost: int, reservation) -> ReceiptRecord:
    pricing = ctx.endpoint.pricing
    return ReceiptRecord(
        id=ctx.receipt_id,
        reservation_id=reservation.id,
        project_id=reservation.project_id,
        key_id=reservation.key_id,
        request_id=ctx.request_id,
        kind=pricing.kind,
        endpoint=ctx.endpoint.path,
        model_or_runtime=pricing.subject(ctx),
        status=ctx.outcome,
        usage=ctx.usage or {},
        cost=cost,
        month=reservation.month,
        created_at=time.time_ns() // 1000,
        request_sha256=hashlib.sha256(ctx.body).hexdigest(),
        response_sha256=ctx.response_sha256 or _EMPTY_SHA256,
    )


class Settle:
    def __init__(self, app, *, meter: Meter) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        if ctx.reservation is None:
            await self.app(scope, receive, send)
            return

        async def send_settled(message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await self._settle(ctx)
            await send(message)

        await self.app(scope, receive, send_settled)
        await self._settle(ctx)

    async def _settle(self, ctx: RequestContext) -> None:
        reservation = ctx.reservation
        if reservation is None:
            return
        ctx.reservation = None
        with anyio.CancelScope(shield=True):
            if ctx.outcome is None:
                await self.meter.release(reservation)
                return
            cost = ctx.endpoint.pricing.cost(ctx)
            if cost > reservation.amount:
                log.warning("request_id=%s cost %d above its hold", ctx.request_id, cost)
            await self.meter.settle(_receipt(ctx, min(cost, reservation.amount), reservation))
