"""Settle: charges what a request actually cost once dispatch is done, and frees the rest.

Not metered yet (the metering issue fills this stage in). It wraps dispatch, so it acts
on the way out, after the handler's response has been sent.
"""

from __future__ import annotations


class Settle:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)
