"""A hold: one reservation, owned by whoever took it, closed exactly once.

The reservation stage owns a request's hold; the agents' run engine owns its steps'
holds the same way, without ASGI. `settle` and `release` are idempotent; a settle that
raises leaves the hold open, so the owner's `release` (in its `finally`, or `async with`)
still frees the money. Both are shielded: a cancelled request still closes its hold.
"""

from __future__ import annotations

from types import TracebackType
from typing import Literal

import anyio

from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.ports import Meter, Reserved


class Hold:
    __slots__ = ("_meter", "reservation", "settlement", "state")

    def __init__(self, meter: Meter, reservation: Reserved) -> None:
        self._meter = meter
        self.reservation = reservation
        self.state: Literal["open", "settled", "released"] = "open"
        self.settlement: Settlement | None = None  # what was charged, once settled

    @classmethod
    async def take(cls, meter: Meter, project_id: str, key_id: str | None, amount: int) -> Hold:
        """Reserve `amount`; a reservation made while the caller was cancelled is released."""
        with anyio.CancelScope(shield=True):
            reservation = await meter.reserve(project_id, key_id, amount)
        return cls(meter, reservation)

    @property
    def amount(self) -> int:
        return self.reservation.amount

    async def settle(self, settlement: Settlement) -> None:
        """Charge and receipt; a no-op once closed. Raises, hold still open, on failure."""
        if self.state != "open":
            return
        with anyio.CancelScope(shield=True):
            await self._meter.settle(self.reservation, settlement)
        self.state = "settled"
        self.settlement = settlement

    async def release(self) -> None:
        """Free the whole amount; a no-op once closed."""
        if self.state != "open":
            return
        self.state = "released"
        with anyio.CancelScope(shield=True):
            await self._meter.release(self.reservation)

    async def __aenter__(self) -> Hold:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
