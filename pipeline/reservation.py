"""Reservation: holds the most a request can cost before it runs.

Not metered yet (the metering issue fills this stage in); its place in the chain is
fixed: after the rate limit, before settle and dispatch.
"""

from __future__ import annotations


class Reservation:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)
