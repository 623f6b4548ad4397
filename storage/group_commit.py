"""Group commit for SQLite: single-statement writes queued by concurrent requests run
together in one transaction (storage/batching.py), and each caller resumes after the
commit.

Every statement stays atomic on its own (a trigger's RAISE(ABORT) undoes only its
statement), so batching changes nothing but the cost: one commit for a batch instead of
one per write. A write may also be a unit of several statements (the log's leaves and
tree head), made atomic by a savepoint. All of the process's writes on the request's side
go through here: a second writing connection would be starved by batches that follow one
another without a gap.

The batch runs on the event loop itself: a few single-row statements take tens of
microseconds, while a hop to a worker thread and back measured 200-350 us on the 2-core
machines we run on. The loop never waits on a lock: the connection's busy timeout is 0,
and a batch that finds the database locked (the CLI, an admin transaction) backs off
asynchronously and is retried whole; nothing of it ran. After the storage's busy timeout
it gives up: every write of the batch fails with the SQLITE_BUSY error, so no caller waits
forever and a settlement's hold stays open for its owner to release. (A write queued
while a batch waits joins the next batch, with a deadline of its own: it may wait up to
twice the timeout.) WAL checkpoints, the
only writes that fsync, are left to `checkpoint()` on another thread (autocheckpoint is
off here).

An error that belongs to one statement (a constraint, a trigger's abort, a value SQLite
cannot bind) is that write's outcome alone; any other error fails the whole batch, which
then ran not at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import TypeAlias

from model_gateway.storage.batching import LOCKSTEP_BATCH, Batcher, Outcome

MAX_BATCH = 256
BUSY_RETRY_S = 0.001

Params: TypeAlias = tuple[object, ...]
Unit: TypeAlias = list[tuple[str, list[Params]]]
_Write: TypeAlias = tuple[str, "Params | Unit"]

_UNIT = "-- several statements, all or nothing"
# Errors SQLite raises for one statement, which undo that statement only (or that happen
# before it runs: a parameter it cannot bind). Anything else (OperationalError: busy, I/O,
# disk full) concerns the transaction, and fails the batch.
_STATEMENT_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.ProgrammingError,
    sqlite3.DataError,
    OverflowError,
)


class GroupCommitWriter:
    def __init__(self, path: Path, pragmas: tuple[str, ...], busy_timeout_s: float) -> None:
        self._give_up_after_s = busy_timeout_s
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            for pragma in (*pragmas, "busy_timeout = 0", "wal_autocheckpoint = 0"):
                self._conn.execute(f"PRAGMA {pragma}")
        except BaseException:
            self._conn.close()
            raise
        self._batches: Batcher[_Write, int] = Batcher(
            self._run_when_unlocked, MAX_BATCH, LOCKSTEP_BATCH
        )

    async def execute(self, sql: str, params: Params) -> int:
        """Run one statement in the next batch; its rowcount, or its sqlite3 error."""
        return await self._batches.submit((sql, params))

    async def execute_unit(self, statements: Unit) -> None:
        """Run each statement over its parameter rows, all or nothing, in the next batch."""
        await self._batches.submit((_UNIT, statements))

    async def _run_when_unlocked(self, batch: list[_Write]) -> list[Outcome[int]]:
        deadline = time.monotonic() + self._give_up_after_s
        while True:
            try:
                return self._run(batch)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(BUSY_RETRY_S)

    def _run(self, batch: list[_Write]) -> list[Outcome[int]]:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        outcomes: list[Outcome[int]] = []
        try:
            for sql, params in batch:
                try:
                    if sql is _UNIT:
                        assert isinstance(params, list)
                        outcomes.append(self._run_unit(params))
                    else:
                        assert isinstance(params, tuple)
                        outcomes.append(conn.execute(sql, params).rowcount)
                except _STATEMENT_ERRORS as exc:  # this statement (or unit) only was undone
                    outcomes.append(exc)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return outcomes

    def _run_unit(self, statements: Unit) -> int:
        conn = self._conn
        conn.execute("SAVEPOINT unit")
        try:
            for sql, rows in statements:
                conn.executemany(sql, rows)
        except _STATEMENT_ERRORS:
            conn.execute("ROLLBACK TO unit")
            conn.execute("RELEASE unit")
            raise
        conn.execute("RELEASE unit")
        return 0

    @property
    def idle(self) -> bool:
        return self._batches.idle

    async def close(self) -> None:
        await self._batches.close()
        self._conn.close()
