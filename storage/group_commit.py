"""Group commit for SQLite: single-statement writes queued by concurrent requests run
together in one transaction on one writer thread, and each caller resumes after the commit.

Every statement stays atomic on its own (a trigger's RAISE(ABORT) undoes only its
statement), so batching changes nothing but the cost: one commit for a batch instead of
one per write. A caller that is cancelled still has its statement run; callers that must
know the outcome (a reservation) shield themselves.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MAX_BATCH = 256


class GroupCommitWriter:
    def __init__(self, path: Path, pragmas: tuple[str, ...]) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        self._conn = self._thread.submit(self._connect, path, pragmas).result()
        self._pending: list[tuple[str, tuple, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    @staticmethod
    def _connect(path: Path, pragmas: tuple[str, ...]) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in pragmas:
            conn.execute(f"PRAGMA {pragma}")
        return conn

    async def execute(self, sql: str, params: tuple) -> int:
        """Run one statement in the next batch; its rowcount, or its sqlite3 error."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((sql, params, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    outcomes = await loop.run_in_executor(self._thread, self._run, batch)
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

    def _run(self, batch: list[tuple[str, tuple, asyncio.Future]]) -> list:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        outcomes: list = []
        try:
            for sql, params, _ in batch:
                try:
                    outcomes.append(conn.execute(sql, params).rowcount)
                except sqlite3.IntegrityError as exc:  # this statement only was undone
                    outcomes.append(exc)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return outcomes

    async def close(self) -> None:
        if self._flusher is not None:
            await self._flusher
        await asyncio.get_running_loop().run_in_executor(self._thread, self._conn.close)
        self._thread.shutdown()
