"""Batches of writes from concurrent requests: each caller queues one item and awaits its
outcome; the items queued while the event loop runs one turn (and while the batch before
them runs) go together, so that they share one transaction and one commit.

How many go together depends on how busy the event loop's thread is, and on how many wait.
Busy (its CPU the limit), or with a backlog waiting, a batch takes up to `max_batch`: one
commit for more requests is worth most. With time to spare, a batch takes at most
`lockstep_batch`, and its callers go on before the
next batch runs: requests that move in lockstep (32 answers arriving together) then go
on in groups, instead of each waiting for the whole group's work at every commit. More
commits cost CPU the loop has to spare. Against a mock answering in 20 ms at 32
connections, paired with one batch for all: 1.13x and 1.08x req/s; against one answering
at once, where the CPU is the limit, within the noise (docs/speed.md).

At most one batch runs at a time. Every caller's future is resolved, whatever happens: the
batch's runner answers one outcome per item (a value, or the exception that belongs to
that item alone); an exception it raises is every item's outcome. A caller that is
cancelled still has its item run; callers that must know the outcome shield themselves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeAlias, TypeVar

I = TypeVar("I")  # noqa: E741 - an item of a batch
O = TypeVar("O")  # noqa: E741 - an item's outcome
# An item's outcome, or the exception that is that item's alone.
Outcome: TypeAlias = "O | Exception"


# Above this share of the wall time in CPU, the event loop's thread counts as busy.
BUSY_SHARE = 0.8
BUSY_WINDOW_S = 0.1  # how often that share is measured
# The batch size while the loop has time to spare. With every batch this size, against a
# mock answering in 20 ms at 32 connections: 8 gave 1.08-1.12x req/s for 1.13-1.26x the CPU
# a request, 4 gave 1.18x for 1.43x, 16 nothing; against one answering at once, 8 gave 0.84x.
LOCKSTEP_BATCH = 8
# More items waiting than this many lockstep batches are a backlog, not a group of requests
# moving in lockstep: with hundreds of requests in flight behind a slow upstream the loop has
# time to spare (they wait on the upstream), yet writes come faster than batches of 8, one a
# loop turn, drain them, and each request waits behind the queue before its provider call.
# A backlog goes in the largest batches (bench/realistic.py, chat behind a 300 ms upstream
# at 250 in flight; docs/speed.md, "Realistic traffic").
BACKLOG_BATCHES = 4


class LoopLoad:
    """The share of wall time the calling thread (the event loop's) spent on CPU over the
    last window: busy until a first window has been measured."""

    def __init__(self) -> None:
        self._wall = time.monotonic()
        self._cpu = time.thread_time()
        self.share = 1.0

    def busy(self) -> bool:
        now = time.monotonic()
        if now - self._wall >= BUSY_WINDOW_S:
            cpu = time.thread_time()
            self.share = (cpu - self._cpu) / (now - self._wall)
            self._wall, self._cpu = now, cpu
        return self.share >= BUSY_SHARE


class Batcher(Generic[I, O]):
    def __init__(
        self,
        run: Callable[[list[I]], Awaitable[list[Outcome[O]]]],
        max_batch: int,
        lockstep_batch: int | None = None,
    ) -> None:
        """`lockstep_batch`: the batch size while the loop has time to spare (None: always
        `max_batch`)."""
        self._run = run
        self._max_batch = max_batch
        self._lockstep_batch = lockstep_batch
        self._load = LoopLoad()
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
                size = self._batch_size()
                batch, self._pending = self._pending[:size], self._pending[size:]
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

    def _batch_size(self) -> int:
        lockstep = self._lockstep_batch
        if lockstep is None or len(self._pending) > BACKLOG_BATCHES * lockstep:
            return self._max_batch
        return self._max_batch if self._load.busy() else min(lockstep, self._max_batch)

    @property
    def idle(self) -> bool:
        """No batch runs or waits: an item submitted now runs alone."""
        return self._flusher is None

    async def close(self) -> None:
        """Wait for the batches queued so far (a cancelled close leaves them running)."""
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
