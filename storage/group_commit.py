"""Group commit for SQLite: single-statement writes queued by concurrent requests run
together in one transaction (storage/batching.py), and each caller resumes after the
commit.

Every statement stays atomic on its own (a trigger's RAISE(ABORT) undoes only its
statement), so batching changes nothing but the cost: one commit for a batch instead of
one per write. A write may also be a unit of several statements (the log's leaves and
tree head), made atomic by a savepoint. All of the process's writes on the request's side
go through here: a second writing connection would be starved by batches that follow one
another without a gap.

The batch runs on the event loop itself, in C (storage/_batch.c, its `Writer`): the values
are copied while the GIL is held, then BEGIN, the statements and COMMIT run with it
released, once. Through Python's sqlite3 module every statement gave the GIL up and took
it back around its step, letting aiosqlite's reading thread in each time; against that,
0.951x the event loop's instructions a request at 32 requests at a time (docs/speed.md).
A hop to a worker thread and back measured 200-350 us on the 2-core machines we run on,
and running the C batches on a thread of their own measured below running them on the
loop. Its connection writes the WAL through storage/_walbuf.c, which hands a commit's
frames to the kernel in one write instead of two a page.

The loop never waits on a lock: the connection's busy timeout is 0, and a batch that
finds the database locked (the CLI, an admin transaction) backs off asynchronously and is
retried whole; nothing of it ran. After the storage's busy timeout it gives up: every
write of the batch fails with the SQLITE_BUSY error, so no caller waits forever and a
settlement's hold stays open for its owner to release. (A write queued while a batch
waits joins the next batch, with a deadline of its own: it may wait up to twice the
timeout.) WAL checkpoints, the only writes that fsync, are left to `checkpoint()` on
another thread (autocheckpoint is off here).

An error that belongs to one statement (a constraint, a trigger's abort, a value SQLite
cannot bind) is that write's outcome alone, as Python's sqlite3 would raise it; an error
that ended the transaction (RAISE(ROLLBACK)), or any other, fails the whole batch, which
then ran not at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import TypeAlias

from model_gateway.storage._batch import Writer
from model_gateway.storage.batching import LOCKSTEP_BATCH, Batcher, Outcome

MAX_BATCH = 256
BUSY_RETRY_S = 0.001

Params: TypeAlias = tuple[object, ...]
Unit: TypeAlias = list[tuple[str, list[Params]]]
_Write: TypeAlias = tuple[str, "Params | Unit"]

_UNIT = "-- several statements, all or nothing"

# The exception class Python's sqlite3 raises for each primary result code (its
# _pysqlite_seterror), and the names it gives the codes (`sqlite_errorname`).
_ERROR_CLASSES: dict[int, type[sqlite3.Error]] = {
    sqlite3.SQLITE_INTERNAL: sqlite3.InternalError,
    sqlite3.SQLITE_NOTFOUND: sqlite3.InternalError,
    **dict.fromkeys(
        (
            sqlite3.SQLITE_ERROR, sqlite3.SQLITE_PERM, sqlite3.SQLITE_ABORT,
            sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_READONLY,
            sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL,
            sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_EMPTY,
            sqlite3.SQLITE_SCHEMA,
        ),
        sqlite3.OperationalError,
    ),
    sqlite3.SQLITE_TOOBIG: sqlite3.DataError,
    sqlite3.SQLITE_CONSTRAINT: sqlite3.IntegrityError,
    sqlite3.SQLITE_MISMATCH: sqlite3.IntegrityError,
    sqlite3.SQLITE_MISUSE: sqlite3.InterfaceError,
    sqlite3.SQLITE_RANGE: sqlite3.InterfaceError,
}  # fmt: skip
_ERROR_NAMES: dict[int, str] = {
    getattr(sqlite3, name): name
    for name in dir(sqlite3)
    if name.startswith("SQLITE_") and name.split("_")[1] in {
        "ERROR", "INTERNAL", "PERM", "ABORT", "BUSY", "LOCKED", "NOMEM", "READONLY",
        "INTERRUPT", "IOERR", "CORRUPT", "NOTFOUND", "FULL", "CANTOPEN", "PROTOCOL", "EMPTY",
        "SCHEMA", "TOOBIG", "CONSTRAINT", "MISMATCH", "MISUSE", "NOLFS", "AUTH", "FORMAT",
        "RANGE", "NOTADB", "NOTICE", "WARNING",
    }
}  # fmt: skip


class GroupCommitWriter:
    def __init__(self, path: Path, pragmas: tuple[str, ...], busy_timeout_s: float) -> None:
        self._give_up_after_s = busy_timeout_s
        try:
            self._native = Writer(
                str(path), (*pragmas, "busy_timeout = 0", "wal_autocheckpoint = 0")
            )
        except RuntimeError as exc:
            raise _sqlite_error(*exc.args) from None
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
                return [_outcome(outcome) for outcome in self._native.run(batch)]
            except RuntimeError as exc:  # (extended result code, message) of the batch
                if exc.args[0] & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise _sqlite_error(*exc.args) from None
            await asyncio.sleep(BUSY_RETRY_S)

    @property
    def idle(self) -> bool:
        return self._batches.idle

    async def close(self) -> None:
        await self._batches.close()
        self._native.close()


def _outcome(outcome: object) -> Outcome[int]:
    if isinstance(outcome, int):
        return outcome
    if isinstance(outcome, tuple):  # (extended result code, message): one statement's error
        return _sqlite_error(*outcome)
    if isinstance(outcome, OverflowError | UnicodeEncodeError):  # as sqlite3 raises them
        return outcome
    assert isinstance(outcome, Exception)  # a value that could not be bound
    return sqlite3.ProgrammingError(str(outcome))


def _sqlite_error(extended: int, message: str) -> sqlite3.Error:
    """The exception Python's sqlite3 raises for this (extended) result code."""
    code = extended & 0xFF  # the primary code
    error = _ERROR_CLASSES.get(code, sqlite3.DatabaseError)(message)
    error.sqlite_errorcode = extended
    error.sqlite_errorname = _ERROR_NAMES.get(extended) or _ERROR_NAMES.get(code, "SQLITE_ERROR")
    return error
