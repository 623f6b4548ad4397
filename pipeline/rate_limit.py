"""Rate limit: requests per minute per key and per project, for every authenticated call.

Reads: `ctx.key.rpm`, `ctx.project.rpm` (defaults from [limits]). Rejects: 429
rate_limit_exceeded with `retry-after` (whole seconds, at least 1), mirrored in
`error.retry_after_seconds`. A request refused by one bucket takes nothing from the other.
A limiter whose shared store does not answer raises its error (503 service_unavailable):
it is answered as such, never as a 500 and never by letting the request through.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.errors import GatewayError, RateLimitExceeded, send_error
from model_gateway.pipeline.ports import RateLimiter


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
        project = ctx.project
        assert project is not None
        buckets = [(project.id, project.rpm or self.default_project_rpm)]
        if ctx.key is not None:
            buckets.append((ctx.key.id, ctx.key.rpm or self.default_key_rpm))
        try:
            wait = await self.limiter.acquire(buckets)
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        if wait:
            await send_error(send, RateLimitExceeded(retry_after=wait), ctx.request_id)
            return
        await self.app(scope, receive, send)
