"""Batches of writes from concurrent requests: each caller queues one item and awaits its
outcome; the items queued while the event loop runs one turn (and while the batch before
them runs) go together, up to `max_batch`, so that they share one transaction and one
commit. When more wait than a batch takes, the callers of one batch resume before the
next batch runs: a smaller `max_batch` costs more commits, but lets requests that move in
lockstep (all answered by their upstream at once) go on in groups rather than together.

At most one batch runs at a time. Every caller's future is resolved, whatever happens: the
batch's runner answers one outcome per item (a value, or the exception that belongs to
that item alone); an exception it raises is every item's outcome. A caller that is
cancelled still has its item run; callers that must know the outcome shield themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeAlias, TypeVar

I = TypeVar("I")  # noqa: E741 - an item of a batch
O = TypeVar("O")  # noqa: E741 - an item's outcome
# An item's outcome, or the exception that is that item's alone.
Outcome: TypeAlias = "O | Exception"


class Batcher(Generic[I, O]):
    def __init__(
        self, run: Callable[[list[I]], Awaitable[list[Outcome[O]]]], max_batch: int
    ) -> None:
        self._run = run
        self._max_batch = max_batch
        self._pending: list[tuple[I, asyncio.Future[O]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: I) -> O:
        """Run `item` in the next batch: its outcome, or its exception raised."""
        future: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        batch: list[tuple[I, asyncio.Future[O]]] = []
        try:
            # One turn of the loop first, so the items of concurrent requests join the batch.
            await asyncio.sleep(0)
            while self._pending:
                batch = self._pending[: self._max_batch]
                self._pending = self._pending[self._max_batch :]
                outcomes: list[Outcome[O]]
                try:
                    outcomes = await self._run([item for item, _ in batch])
                except Exception as exc:  # the batch itself failed: so did every item
                    outcomes = [exc] * len(batch)
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
                if self._pending:
                    await asyncio.sleep(0)  # this batch's callers go on first
        finally:
            self._flusher = None
            # Cancelled (the loop is closing): no caller waits forever. The batch that ran
            # may have committed or not: its callers cannot tell, as for a statement alone.
            for _, future in [*batch, *self._pending]:
                future.cancel()
            self._pending = []

    @property
    def idle(self) -> bool:
        """No batch runs or waits: an item submitted now runs alone."""
        return self._flusher is None

    async def close(self) -> None:
        """Wait for the batches queued so far (a cancelled close leaves them running)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
