"""Settle: charges what the request actually cost, in the same step that frees its hold.

Reads: `ctx.billing` (written by the handler), `ctx.hold`. Writes: the charge and its
receipt, through the hold. It wraps dispatch and acts on the way out: at the response's
final body message, so the books are closed before the client has the last byte, or
after dispatch returns when the response never finished (client gone). A request with no
billing (an error) is left to the reservation stage, which releases its hold in full.
The charge never exceeds the hold. A settlement that fails raises: the hold stays open
and the reservation stage releases it, never a request both unbilled and still holding
money. A whole response (its length known) goes out head and body together once
settled, so that the commit does not split them into two sends a client wakes up for;
a failed settlement then leaves it unstarted, answered 500 internal_error by the request
id stage. A stream goes out as it comes, and is cut.
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import RequestContext, Settlement, request_context

log = logging.getLogger("gateway.metering")


def settlement_of(ctx: RequestContext) -> Settlement | None:
    """The settlement of a request whose handler reported billing, or None."""
    billing, hold = ctx.billing, ctx.hold
    if billing is None or hold is None or ctx.receipt_id is None:
        return None
    assert ctx.endpoint is not None and ctx.endpoint.pricing is not None
    pricing = ctx.endpoint.pricing
    cost = pricing.cost(ctx)
    if cost > hold.amount:
        log.warning("request_id=%s cost %d above its hold", ctx.request_id, cost)
    return Settlement(
        receipt_id=ctx.receipt_id,
        request_id=ctx.request_id,
        kind=pricing.kind,
        endpoint=ctx.endpoint.path,
        subject=pricing.subject(ctx),
        status=billing.outcome,
        usage=billing.usage,
        cost=min(cost, hold.amount),
        request_body=ctx.body,
        response_sha256=billing.response_sha256,
        usage_source=billing.usage_source,
        provider=ctx.provider,
    )


class Settle:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        if ctx.hold is None:
            await self.app(scope, receive, send)
            return

        head: Message | None = None  # a whole response's start, sent with its body

        async def send_settled(message: Message) -> None:
            nonlocal head
            if message["type"] == "http.response.start" and _whole(message):
                head = message
                return
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await _settle(ctx)
            if head is not None:
                await send(head)
                head = None
            await send(message)

        await self.app(scope, receive, send_settled)
        await _settle(ctx)


def _whole(start: Message) -> bool:
    """A response of known length: its body comes in one message (Starlette's Response)."""
    return any(name == b"content-length" for name, _ in start.get("headers", ()))


async def _settle(ctx: RequestContext) -> None:
    if ctx.hold is None or ctx.hold.state != "open":
        return  # settled at the final body already (or released): nothing to price again
    if ctx.client_left and ctx.billing is not None:
        # The client left before its whole answer went out (it was ready): never
        # `succeeded`; billed what ran, as a cancel is.
        ctx.billing.outcome = "cancelled"
    settlement = settlement_of(ctx)
    if settlement is not None:
        await ctx.hold.settle(settlement)
