"""A hold: one reservation, owned by whoever took it, closed exactly once.

The reservation stage owns a request's hold; the agents' run engine owns its steps'
holds the same way, without ASGI. `settle` and `release` are idempotent; a settle that
raises leaves the hold to be released, so the owner's `release` (in its `finally`, or
`async with`) still frees the money, and is never tried again: its receipt may have been
stored, or offered to the log, and a second one would differ (fresh salts and time).
The meter's calls run to their end even when the caller is cancelled, the anyio way or
the asyncio way (`task.cancel()`, which anyio's shielded scopes do not stop): a cancelled
request still closes its hold, once.

A meter call runs in a task of its own, shielded, which the caller's cancel cannot reach.
(Stepping the call in the caller's task instead, with asyncio's private task protocol,
saved 5.5% of a metered request's instructions one at a time but 1.4% at 32 at a time,
bench/instructions.py: not worth private asyncio in the package hosts embed.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import Literal, TypeVar

from model_gateway.pipeline.context import Settlement
from model_gateway.pipeline.ports import Meter, Reserved

T = TypeVar("T")


Cancel = asyncio.CancelledError | None


async def _to_the_end(work: Awaitable[T]) -> tuple[T, Cancel]:
    """Await `work` (a call of `meter`) to its end whatever cancels the caller meanwhile;
    its result, and the cancel of the caller if there was one, which the caller raises
    once it has recorded the result (the same exception: an anyio scope knows its own).
    When `work` fails after such a cancel, the cancel is raised, the failure its context:
    the cancel wins, as for a task cancelled while it awaits a future, whose outcome then
    never reaches it. (KeyboardInterrupt and SystemExit are not failures: they go on.)"""
    task = asyncio.ensure_future(work)
    cancelled: Cancel = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as cancel:  # ours, or the work's own (its result's)
            cancelled = cancelled or cancel
        except BaseException:
            if not task.done():  # not the work's outcome (this coroutine closed): goes on
                raise
    try:
        return task.result(), cancelled
    except (Exception, asyncio.CancelledError):
        _cancel_wins(cancelled)
        raise


def _cancel_wins(cancelled: Cancel) -> None:
    """Raise the caller's recorded cancel, if any, over the failure being handled (which
    becomes its context)."""
    if cancelled is not None:
        raise cancelled


class Hold:
    __slots__ = ("_meter", "reservation", "settlement", "state")

    def __init__(self, meter: Meter, reservation: Reserved) -> None:
        self._meter = meter
        self.reservation = reservation
        # "failed": a settle raised; only a release is left.
        self.state: Literal["open", "failed", "settled", "released"] = "open"
        self.settlement: Settlement | None = None  # what was charged, once settled

    @classmethod
    async def take(
        cls,
        meter: Meter,
        project_id: str,
        key_id: str | None,
        amount: int,
        *,
        watched: bool = False,
    ) -> Hold:
        """Reserve `amount` (`watched`: see `Meter.reserve`); a reservation made while the
        caller was cancelled is released."""
        reserving = meter.reserve(project_id, key_id, amount, watched=watched)
        reservation, cancelled = await _to_the_end(reserving)
        hold = cls(meter, reservation)
        if cancelled:
            try:
                await hold.release()
            except (Exception, asyncio.CancelledError):
                _cancel_wins(cancelled)
            raise cancelled
        return hold

    @property
    def amount(self) -> int:
        return self.reservation.amount

    async def settle(self, settlement: Settlement) -> None:
        """Charge and receipt, tried once; a no-op once closed or tried. Raises on failure,
        leaving the hold to its release."""
        if self.state != "open":
            return
        try:
            _, cancelled = await _to_the_end(self._meter.settle(self.reservation, settlement))
        except BaseException:
            self.state = "failed"
            raise
        self.state = "settled"
        self.settlement = settlement
        if cancelled:
            raise cancelled

    async def release(self) -> None:
        """Free the whole amount; a no-op once closed."""
        if self.state not in ("open", "failed"):
            return
        self.state = "released"
        _, cancelled = await _to_the_end(self._meter.release(self.reservation))
        if cancelled:
            raise cancelled

    async def __aenter__(self) -> Hold:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
