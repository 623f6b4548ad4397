"""A shared rate-limit store's health: one log line when it stops answering and one when it
is back, and the refusal keyed requests get meanwhile."""

from __future__ import annotations

import logging

from model_gateway.pipeline.errors import ServiceUnavailable

log = logging.getLogger("gateway")

RETRY_AFTER_S = 1


class StoreHealth:
    """One log line when a shared store stops answering and one when it is back, not one
    per request; the refusal the client gets meanwhile."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.failing = False

    def failed(self, reason: object) -> ServiceUnavailable:
        if not self.failing:
            log.warning(
                "rate limits: %s is not answering (%s); keyed requests get 503 until it is",
                self.store,
                reason,
            )
            self.failing = True
        return ServiceUnavailable(
            "Rate limits cannot be checked right now.", retry_after=RETRY_AFTER_S
        )

    def answered(self) -> None:
        if self.failing:
            log.warning("rate limits: %s answers again", self.store)
            self.failing = False
