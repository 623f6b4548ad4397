"""A hold: one reservation, owned by whoever took it, closed exactly once.

The reservation stage owns a request's hold; the agents' run engine owns its steps'
holds the same way, without ASGI. `settle` and `release` are idempotent; a settle that
raises leaves the hold open, so the owner's `release` (in its `finally`, or `async with`)
still frees the money. The meter's calls run to their end even when the caller is
cancelled, the anyio way or the asyncio way (`task.cancel()`, which anyio's shielded
scopes do not stop): a cancelled request still closes its hold, once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import Literal, TypeVar

from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.ports import Meter, Reserved

T = TypeVar("T")


async def _to_the_end(work: Awaitable[T]) -> tuple[T, bool]:
    """Await `work` to its end whatever cancels the caller meanwhile; its result, and
    whether the caller was cancelled (the caller re-raises once it has recorded it)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled, or ended as we were
                return task.result(), True
            cancelled = True


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
        reservation, cancelled = await _to_the_end(meter.reserve(project_id, key_id, amount))
        hold = cls(meter, reservation)
        if cancelled:
            await hold.release()
            raise asyncio.CancelledError
        return hold

    @property
    def amount(self) -> int:
        return self.reservation.amount

    async def settle(self, settlement: Settlement) -> None:
        """Charge and receipt; a no-op once closed. Raises, hold still open, on failure."""
        if self.state != "open":
            return
        _, cancelled = await _to_the_end(self._meter.settle(self.reservation, settlement))
        self.state = "settled"
        self.settlement = settlement
        if cancelled:
            raise asyncio.CancelledError

    async def release(self) -> None:
        """Free the whole amount; a no-op once closed."""
        if self.state != "open":
            return
        self.state = "released"
        _, cancelled = await _to_the_end(self._meter.release(self.reservation))
        if cancelled:
            raise asyncio.CancelledError

    async def __aenter__(self) -> Hold:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
