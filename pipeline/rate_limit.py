"""Rate limit: requests and tokens per minute, per key and per project.

Reads: `ctx.key` and `ctx.project`: their `rpm` (unset: the defaults from [limits]) and
`tpm` (unset: no token limit); for a billed request on a model, its token estimate
(`token_estimate`). Writes: `ctx.rate_limited` when it refuses. Rejects: 429
rate_limit_exceeded with `retry-after` (whole seconds, at least 1), mirrored in
`error.retry_after_seconds`. A request takes from all of its buckets or from none
(weighted GCRA, pipeline/gcra.py): one request from each rpm bucket, its estimate from
each tpm bucket; an estimate above a whole minute's tokens takes the whole minute, so such
a request passes once the bucket is full (docs/choices.md). On the way out, at the
response's final body message (before the client has the last byte, as settle does) or
once the response is over, the tokens a request did not use (its estimate less the input
and output its billing reports; all of them when nothing was billed) go back to its tpm
buckets, and tokens it used beyond what it took are taken. That give-back is best effort:
a store that does not answer then is logged, never the request's failure.
A limiter whose shared store does not answer at admission raises its error (503
service_unavailable): it is answered as such, never as a 500 and never by letting the
request through.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_gateway.pipeline.context import RequestContext, request_context
from model_gateway.pipeline.errors import GatewayError, RateLimitExceeded, send_error
from model_gateway.pipeline.ports import KeyInfo, ProjectInfo, RateLimiter, Take

log = logging.getLogger("gateway")

# Bucket names: a key's or project's id under the limit's name.
RPM, TPM = "rpm:", "tpm:"


def token_estimate(ctx: RequestContext) -> int:
    """The most tokens a request may use: the body's bytes / 4, rounded up (the gateway's
    own count), plus its output limit: its own clamped to the model's, or the model's
    (none for an embedding model). 0 for a request on no model or not billed."""
    model = ctx.model
    if model is None or ctx.endpoint is None or ctx.endpoint.pricing is None:
        return 0
    tokens = -(-len(ctx.body) // 4)
    if model.mode != "embedding":
        requested: int | None = getattr(ctx.payload, "output_limit", None)
        tokens += min(requested or model.max_output_tokens, model.max_output_tokens)
    return tokens


def used_tokens(ctx: RequestContext) -> int:
    """The input and output tokens the request was billed; 0 when nothing was."""
    if ctx.billing is None:
        return 0
    usage = ctx.billing.usage
    return usage.get("input_tokens", 0) + usage.get("output_tokens", 0)


def unused(taken: list[Take], used: int, elapsed_s: float) -> list[Take]:
    """What goes back to each bucket once the request used `used` tokens: what it took and
    did not use, but never more than its take still holds in the bucket (a take drains
    back at the bucket's rate: a request that ran a minute has nothing left to return,
    and returning it would admit twice the limit). Usage above the take is taken (<0)."""
    back = []
    for name, limit, units in taken:
        over = units - used
        if over > 0:
            over = min(over, max(0, units - int(elapsed_s * limit / 60)))
        if over:
            back.append((name, limit, over))
    return back


def _token_takes(ctx: RequestContext, project: ProjectInfo, key: KeyInfo | None) -> list[Take]:
    """What the request takes from the tpm buckets of its project and key that have one."""
    if not project.tpm and (key is None or not key.tpm):
        return []  # the common case: no token limit, nothing to estimate
    estimate = token_estimate(ctx)
    if not estimate:
        return []
    return [
        (TPM + owner.id, owner.tpm, min(estimate, owner.tpm))
        for owner in (project, key)
        if owner is not None and owner.tpm
    ]


class RateLimit:
    def __init__(
        self, app: ASGIApp, *, limiter: RateLimiter, default_key_rpm: int, default_project_rpm: int
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.default_key_rpm = default_key_rpm
        self.default_project_rpm = default_project_rpm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:  # not one of the chain's requests: passed on untouched
            await self.app(scope, receive, send)
            return
        project, key = ctx.project, ctx.key
        assert project is not None
        buckets: list[Take] = [(RPM + project.id, project.rpm or self.default_project_rpm, 1)]
        if key is not None:
            buckets.append((RPM + key.id, key.rpm or self.default_key_rpm, 1))
        tokens = _token_takes(ctx, project, key)
        try:
            wait, refused = await self.limiter.acquire(buckets + tokens if tokens else buckets)
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        if wait:
            ctx.rate_limited = "tpm" if refused >= len(buckets) else "rpm"
            await send_error(send, RateLimitExceeded(retry_after=wait), ctx.request_id)
            return
        if not tokens:
            await self.app(scope, receive, send)
            return
        await self._serve_giving_back(ctx, tokens, scope, receive, send)

    async def _serve_giving_back(
        self, ctx: RequestContext, taken: list[Take], scope: Scope, receive: Receive, send: Send
    ) -> None:
        settled = False
        taken_at = time.monotonic()

        async def give_back() -> None:
            nonlocal settled
            settled = True
            back = unused(taken, used_tokens(ctx), time.monotonic() - taken_at)
            if not back:
                return
            try:
                await self.limiter.give_back(back)
            except GatewayError as error:
                log.warning(
                    "request_id=%s rate limits: unused tokens not given back (%s)",
                    ctx.request_id,
                    error.message,
                )

        async def send_settled(message: Message) -> None:
            if (
                not settled
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                await give_back()
            await send(message)

        try:
            await self.app(scope, receive, send_settled)
        finally:
            if not settled:  # the response never finished (an error, the client gone)
                await give_back()
