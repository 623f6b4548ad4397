"""Group commit for SQLite: single-statement writes queued by concurrent requests run
together in one transaction, and each caller resumes after the commit.

Every statement stays atomic on its own (a trigger's RAISE(ABORT) undoes only its
statement), so batching changes nothing but the cost: one commit for a batch instead of
one per write. A caller that is cancelled still has its statement run; callers that must
know the outcome (a reservation) shield themselves. A write may also be a unit of several
statements (the log's leaves and tree head), made atomic by a savepoint. All of the
process's writes on the request's side go through here: a second writing connection
would be starved by batches that follow one another without a gap.

The batch runs on the event loop itself: a few single-row statements take tens of
microseconds, while a hop to a worker thread and back measured 200-350 us on the 2-core
machines we run on. The loop never waits on a lock: the connection's busy timeout is 0,
and a batch that finds the database locked (the CLI, an admin transaction) backs off
asynchronously and is retried whole; nothing of it ran. WAL checkpoints, the only writes
that fsync, are left to `checkpoint()` on another thread (autocheckpoint is off here).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

MAX_BATCH = 256
_UNIT = "-- several statements, all or nothing"
BUSY_RETRY_S = 0.001
BUSY_GIVE_UP_S = 5.0


class GroupCommitWriter:
    def __init__(self, path: Path, pragmas: tuple[str, ...]) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in (*pragmas, "busy_timeout = 0", "wal_autocheckpoint = 0"):
            self._conn.execute(f"PRAGMA {pragma}")
        self._pending: list[tuple[str, tuple | list[tuple], asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def execute(self, sql: str, params: tuple) -> int:
        """Run one statement in the next batch; its rowcount, or its sqlite3 error."""
        return await self._queue(sql, params)

    async def execute_unit(self, statements: list[tuple[str, list[tuple]]]) -> None:
        """Run each statement over its parameter rows, all or nothing, in the next batch."""
        await self._queue(_UNIT, statements)

    async def _queue(self, sql: str, params) -> int:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((sql, params, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            # One turn of the loop first, so the writes of concurrent requests join the batch.
            await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    outcomes = await self._run_when_unlocked(batch)
                except sqlite3.Error as exc:  # the transaction itself failed: so did every write
                    outcomes = [exc] * len(batch)
                for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(outcome)
                    else:
                        future.set_result(outcome)
        finally:
            self._flusher = None

    async def _run_when_unlocked(self, batch) -> list:
        deadline = time.monotonic() + BUSY_GIVE_UP_S
        while True:
            try:
                return self._run(batch)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(BUSY_RETRY_S)

    def _run(self, batch: list[tuple[str, tuple, asyncio.Future]]) -> list:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        outcomes: list = []
        try:
            for sql, params, _ in batch:
                try:
                    if sql is _UNIT:
                        outcomes.append(self._run_unit(params))
                    else:
                        outcomes.append(conn.execute(sql, params).rowcount)
                except sqlite3.IntegrityError as exc:  # this statement (or unit) only was undone
                    outcomes.append(exc)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return outcomes

    def _run_unit(self, statements: list[tuple[str, list[tuple]]]) -> int:
        conn = self._conn
        conn.execute("SAVEPOINT unit")
        try:
            for sql, rows in statements:
                conn.executemany(sql, rows)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO unit")
            conn.execute("RELEASE unit")
            raise
        conn.execute("RELEASE unit")
        return 0

    async def close(self) -> None:
        if self._flusher is not None:
            await self._flusher
        self._conn.close()
