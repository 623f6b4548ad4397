"""Rate limit: requests per minute per key and per project, for every authenticated call.

Reads: `ctx.key.rpm`, `ctx.project.rpm` (defaults from [limits]). Rejects: 429
rate_limit_exceeded with `retry-after` (whole seconds, at least 1), mirrored in
`error.retry_after_seconds`. A request refused by one bucket takes nothing from the other.
"""

from __future__ import annotations

from gateway.errors import RateLimitExceeded, send_error
from gateway.ratelimit import Gcra
from pipeline.context import context_of


class RateLimit:
    def __init__(
        self, app, *, limiter: Gcra, default_key_rpm: int, default_project_rpm: int
    ) -> None:
        self.app = app
        self.limiter = limiter
        self.default_key_rpm = default_key_rpm
        self.default_project_rpm = default_project_rpm

    async def __call__(self, scope, receive, send) -> None:
        ctx = context_of(scope)
        project = ctx.project
        buckets = [(project.id, project.rpm or self.default_project_rpm)]
        if ctx.key is not None:
            buckets.append((ctx.key.id, ctx.key.rpm or self.default_key_rpm))
        wait = self.limiter.acquire(buckets)
        if wait:
            await send_error(send, RateLimitExceeded(retry_after=wait), ctx.request_id)
            return
        await self.app(scope, receive, send)
