"""The SQLite backend's connections and their life cycle, which every domain module
(accounts.py, ledger.py, log.py, console.py, agents.py, cluster.py) builds on.

Which connection writes what (the rule; keep every new write to it)
-------------------------------------------------------------------
- Group commit (`GroupCommitWriter`, storage/group_commit.py) takes every write whose
  outcome SQL decides alone: one statement with its triggers (a hold, a settlement, a
  release, a lease renewal, a credit, a new project or sandbox), or a unit of statements
  whose rows are all known before it starts (the log's leaves and their tree head). These
  are the request path's writes and the writes of its housekeeping. Why: they come
  concurrently and often, they are the largest part of what metering costs a request
  (docs/speed.md: at one connection the settlement's write and what follows it, about
  210 of metering's 300 µs of CPU), and a commit per write is what they would cost
  otherwise. The writer runs the statements queued during one turn of the event loop in
  one transaction, on the loop itself, because a hop to a worker thread and back
  (200-350 us measured on our 2-core VMs) costs more than a whole batch of single-row
  statements (reserve alone: 306 -> 79 us; 32 concurrent reserve+settle pairs: 10.4k ->
  14.3k/s). A statement that
  fails is undone alone (its trigger aborts only it), so batching changes no outcome.
  It is the process's one writer on the request's side: a second writing connection
  starves behind batches that follow one another (the log's appends did, under load).
- aiosqlite (its own thread) takes the transactions in which Python must read and decide
  between statements: the migrations, archiving a project, revoking a key (both then bump
  the admin epoch), creating a key (its project must exist: RecordNotFound). The
  group-commit writer cannot await inside its transaction without stalling every other
  request's write, and these are rare administrative changes. They wait for the lock on
  aiosqlite's thread, never on the loop, and may lose the race for it under unbroken
  request load: StorageError (SQLITE_BUSY) after the busy timeout, to be retried.
- Reads go through aiosqlite too (not on the loop: an audit or the log's leaves may take
  a while; in WAL mode they never wait for a writer), but for the few small ones that the
  log and the lease meter take several times a second: those run on the loop, on a
  read-only connection that never waits for a lock (`_glance`); so a storage is used on
  the thread that opened it (its loop's). WAL checkpoints run on a
  short-lived connection of their own on a worker thread: they fsync and wait for readers.
- Locks: every connection gives up after the same busy timeout (`open(busy_timeout_s=)`,
  5 s by default). aiosqlite's through SQLite's busy handler on its thread; the
  group-commit writer, whose own busy timeout is 0 so the loop never sleeps in SQLite,
  by retrying the batch asynchronously until that deadline, then failing every write of
  the batch with SQLITE_BUSY (nothing of it ran). A settlement that fails so leaves its
  hold open for its owner to release.
- Driver errors are translated once, by the `Storage` base class (`translate_error`
  below maps triggers' reasons and constraints); no method here catches them.

Files are private: the data folder is created 0700, the database 0600 before SQLite
opens it (SQLite gives its -wal and -shm files the database's mode), the epoch file 0600.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import ClassVar, Self, TypeVar

import aiosqlite

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.base import Storage, log_migration_notes
from model_gateway.storage.errors import (
    AmountOverflow,
    LimitReached,
    RecordNotFound,
    StateConflict,
    StorageError,
)
from model_gateway.storage.files import (
    make_private,
    make_private_dirs,
    restrict_if_present,
    write_private,
)
from model_gateway.storage.group_commit import GroupCommitWriter
from model_gateway.storage.sqlite.rows import _response_commitment, _usage_part

_LIMIT_REASONS = frozenset({"budget_exceeded", "insufficient_balance"})
_OVERFLOW_REASON = "amount_overflow"  # migration 0016's trigger

R = TypeVar("R")

_PREFIX = "sqlite:///"
# What a migration changed in the operator's data, kept and logged (`log_migration_notes`).
_MIGRATION_NOTES = (
    "CREATE TABLE IF NOT EXISTS migration_notes (version INTEGER NOT NULL, note TEXT NOT NULL)"
)


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files("model_gateway.storage") / "migrations" / "sqlite"
    scripts = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(int(p.name.split("_", 1)[0]), p.read_text()) for p in scripts]


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements the way SQLite's own tokenizer sees them."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""


class AdminEpoch:
    """A sidecar file replaced after every admin change, so any process can notice it by a stat.

    A stat costs about a microsecond, so the key cache can be checked on every request and
    a revocation made by the CLI in another process counts from the very next request.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".epoch")

    def current(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return (0, 0)
        return (st.st_ino, st.st_mtime_ns)

    def bump(self) -> None:
        # A new inode each time: unambiguous even when two bumps share an mtime tick.
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        write_private(tmp, os.urandom(8))
        os.replace(tmp, self.path)


_NO_WAIT = contextlib.nullcontext()  # a read with no transaction to wait out
# The most rows a read on the loop's thread takes (about 1 us each): the log's batch of
# ids, and a few it skipped.
_GLANCE_ROWS = 1024

_WAL_SIZE_LIMIT = 64 * 2**20  # a restarted WAL is truncated back to this

BUSY_TIMEOUT_S = 5.0


# Page cache per connection (the writer's and the reader's) and memory map, measured with
# bench/storage_backends.py --prefill and bench/soak.py: reserve + settle is about as much
# slower at a million receipts with a 16 MiB cache or a 1 GiB map as with SQLite's default
# 2 MB (the slope came from the receipt ids' index, not from cache misses, while the ids
# were random: they grow with time since, pipeline/reservation.py), while
# a bigger cache makes RSS climb until it is full (+15 MiB in a slowed soak) and a map's
# touched pages count in RSS as the file grows. So: the default size, stated, and no map.
CACHE_SIZE_KIB = 2000
MMAP_SIZE_BYTES = 0
# Pages of a new database (an existing one keeps its own: WAL mode cannot change it). A
# commit writes and checksums every page it changed into the WAL, and a request's rows
# change a few pages each: half-size pages halve those bytes (a hold and its settlement,
# each committed alone: 49.9 KB of WAL with 4096, 25.4 KB with 2048). Against 4096, the
# default, in paired rounds: 1.02-1.06x req/s at 32 connections, within the noise at one,
# the same bytes stored per request; 1024 gained less (deeper trees).
PAGE_SIZE_BYTES = 2048


def _pragmas(busy_timeout_s: float) -> tuple[str, ...]:
    return (
        f"page_size = {PAGE_SIZE_BYTES}",  # first: before WAL mode writes the header
        "journal_mode = WAL",
        "synchronous = NORMAL",  # durable at checkpoints; safe from corruption in WAL
        "foreign_keys = ON",
        f"busy_timeout = {round(busy_timeout_s * 1000)}",
        f"journal_size_limit = {_WAL_SIZE_LIMIT}",
        f"cache_size = -{CACHE_SIZE_KIB}",
        f"mmap_size = {MMAP_SIZE_BYTES}",
    )


def _private_files(path: Path) -> None:
    """The data folder 0700 if we create it; the database 0600 before SQLite opens it, so
    its -wal and -shm files get that mode too; existing ones made private as well."""
    make_private_dirs(path.parent)
    make_private(path)
    for suffix in ("-wal", "-shm"):
        restrict_if_present(path.with_name(path.name + suffix))


def _read_unless_busy(
    conn: sqlite3.Connection, sql: str, params: tuple[object, ...]
) -> list[sqlite3.Row] | None:
    """Every row of a read, or None when SQLite is busy (not an error: the caller reads
    elsewhere; every other error is raised, for the base class to translate)."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return None
        raise


class SQLiteBase(Storage):
    """The connections of a SQLite storage and their life cycle; the domain classes
    (accounts.py, ledger.py, ...) build on it, and SQLiteStorage is their union."""

    # ValueError: aiosqlite's "no active connection"; OverflowError: an integer SQLite
    # cannot store (sqlite3 raises it while binding); OSError: the files themselves.
    base_exceptions: ClassVar[tuple[type[BaseException], ...]] = (
        sqlite3.Error,
        ValueError,
        OverflowError,
        OSError,
    )

    def __init__(
        self,
        conn: aiosqlite.Connection,
        path: Path,
        writer: GroupCommitWriter,
        reader: sqlite3.Connection,
    ) -> None:
        self._conn = conn
        self._reader = reader  # small reads on the loop's thread (`_glance`)
        self._path = path
        self._epoch = AdminEpoch(path)
        self._sequencer_lock: int | None = None  # the lock file's descriptor, while held
        # aiosqlite shares one connection: a transaction must not interleave with another's.
        self._write_lock = asyncio.Lock()
        self._writer = writer
        self._shapes: set[tuple[str | None, ...]] = set()  # labels known in receipt_shapes

    @classmethod
    def translate_error(cls, exc: BaseException, operation: str) -> StorageError:
        """The one place where SQLite's errors get their meaning. Messages carry SQLite's
        error name, a trigger's reason (our own words) or the OS error, never SQL text."""
        where = f"SQLite {operation}"
        if isinstance(exc, sqlite3.Error):
            name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
            if isinstance(exc, sqlite3.IntegrityError):
                if name == "SQLITE_CONSTRAINT_TRIGGER":  # RAISE(ABORT, '<reason>')
                    reason = str(exc)
                    if reason in _LIMIT_REASONS:
                        return LimitReached(reason)
                    if reason == _OVERFLOW_REASON:
                        return AmountOverflow(f"{where}: a balance would pass 2^63-1 micro-units")
                    return StateConflict(f"{where}: {reason}")
                return StateConflict(f"{where}: {name}")
            return StorageError(f"{where}: {name}")
        if isinstance(exc, OSError):
            about = f" ({exc.filename})" if exc.filename else ""
            return StorageError(f"{where}: {exc.strerror or type(exc).__name__}{about}")
        return StorageError(f"{where}: {type(exc).__name__}")

    @classmethod
    async def open(cls, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Self:
        if not url.startswith(_PREFIX):
            raise StorageError(
                "a SQLite URL looks like sqlite:///relative/path or sqlite:////abs/path"
            )
        path = Path(url[len(_PREFIX) :])
        _private_files(path)
        pragmas = _pragmas(busy_timeout_s)
        conn = await aiosqlite.connect(path, isolation_level=None)
        try:
            conn.row_factory = sqlite3.Row
            for pragma in pragmas:
                await conn.execute(f"PRAGMA {pragma}")
            writer = GroupCommitWriter(path, pragmas, busy_timeout_s)
            reader = sqlite3.connect(path, isolation_level=None)
            reader.row_factory = sqlite3.Row
            for pragma in (*pragmas, "busy_timeout = 0", "query_only = ON"):
                reader.execute(f"PRAGMA {pragma}")
        except BaseException:
            await conn.close()  # its thread would otherwise keep the process alive
            raise
        storage = cls(conn, path, writer, reader)
        try:
            await storage._migrate()
        except BaseException:
            await storage.close()
            raise
        return storage

    async def _migrate(self) -> None:
        # Foreign keys off while migrating (it only takes effect outside a transaction): a
        # table rebuild (SQLite's 12-step procedure) drops a table others point at. Each
        # migration must leave them consistent, checked before its commit.
        await self._conn.execute("PRAGMA foreign_keys = OFF")
        # What migration 0011 converts existing receipts with: the boundary's own functions.
        await self._conn.create_function("gateway_pack", 2, _pack, deterministic=True)
        await self._conn.create_function("gateway_usage", 2, _usage_part, deterministic=True)
        await self._conn.create_function(
            "gateway_response_commitment", 2, _response_commitment, deterministic=True
        )
        try:
            for number, script in _migrations():
                async with self._transaction() as db:
                    # Re-read inside the write transaction: another process may have migrated.
                    version = await self._scalar(db, "PRAGMA user_version")
                    if number <= version:
                        continue
                    await db.execute(_MIGRATION_NOTES)
                    for statement in _statements(script):
                        await db.execute(statement)
                    if await self._scalar(db, "SELECT count(*) FROM pragma_foreign_key_check"):
                        raise StorageError(f"migration {number} breaks a foreign key")
                    await db.execute(f"PRAGMA user_version = {number}")
                    notes = await db.execute_fetchall(
                        "SELECT note FROM migration_notes WHERE version = ? ORDER BY note",
                        (number,),
                    )
                log_migration_notes(number, [row["note"] for row in notes])
        finally:
            await self._conn.execute("PRAGMA foreign_keys = ON")

    @staticmethod
    async def _scalar(db: aiosqlite.Connection, sql: str) -> int:
        async with db.execute(sql) as cursor:
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """A read-then-decide write transaction on the aiosqlite connection."""
        async with self._write_lock:
            await self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                await self._conn.rollback()
                raise
            await self._conn.commit()

    async def _write(self, sql: str, params: tuple[object, ...] = ()) -> int:
        """One atomic statement (its triggers included), group-committed; its rowcount."""
        return await self._writer.execute(sql, params)

    async def _fetchall(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        """Every row of a read, stepped to its end in one call on the connection's thread.
        A read left open across awaits would hold its snapshot, and a read of another
        coroutine started meanwhile would share it: a write committed in between would be
        missed. A read also waits out a transaction open on the shared connection, so it
        never sees what that transaction has not committed."""
        async with self._write_lock if self._write_lock.locked() else _NO_WAIT:
            return list(await self._conn.execute_fetchall(sql, params))

    async def _glance(self, sql: str, params: tuple[object, ...] = ()) -> list[sqlite3.Row]:
        """Every row of a small read, bounded by a key or a LIMIT, run at once on the loop's
        thread: the reads the log and the lease meter take several times a second. Through
        aiosqlite's thread, every row stepped there takes the GIL back from the busy loop:
        the log's read of 256 ids cost 1.6 ms of that thread's CPU against 0.26 ms here.
        This connection never waits for a lock (its busy timeout is 0): when SQLite is
        busy (rare in WAL mode: a recovery, an exclusive lock), the read goes to the thread
        and waits there."""
        rows = _read_unless_busy(self._reader, sql, params)
        return await self._fetchall(sql, params) if rows is None else rows

    async def _fetchone(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Row | None:
        """The one row of a read by a unique key or an aggregate (never the first of many)."""
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    async def _one(
        self, record: Callable[[sqlite3.Row], R], sql: str, params: tuple[object, ...] = ()
    ) -> R | None:
        """The first row of a read as its record, or None."""
        row = await self._fetchone(sql, params)
        return None if row is None else record(row)

    async def _all(
        self, record: Callable[[sqlite3.Row], R], sql: str, params: tuple[object, ...] = ()
    ) -> list[R]:
        """Every row of a read as its record."""
        return [record(row) for row in await self._fetchall(sql, params)]

    @staticmethod
    async def _found(lookup: Awaitable[R | None], missing: str) -> R:
        """The record a lookup finds, or RecordNotFound (deleted meanwhile)."""
        record = await lookup
        if record is None:
            raise RecordNotFound(missing)
        return record

    async def checkpoint(self) -> None:
        """Fold the WAL into the database file and let it start over.

        On a connection and thread of its own: it fsyncs, and waits for readers. PASSIVE
        first: it copies the WAL while writers go on. Then RESTART: under unbroken writes
        a passive checkpoint alone never lets the WAL start over (6.7 GB after a 10-minute
        soak), and a RESTART blocks writers while it runs; after the passive pass it only
        has the frames written meanwhile to copy, and the fsync (a passive pass that
        writers overtook does not sync). A RESTART alone held every write for the whole
        copy and fsync: p99 19.5 ms at one connection, 3.7 ms now. The request path's
        writer finds the database busy and retries asynchronously; the loop never waits.
        (The file is never opened here but through SQLite: closing any descriptor of it
        would drop the process's locks on it.)
        """

        def fold() -> None:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=2.0)
            try:
                conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                conn.execute("PRAGMA wal_checkpoint(RESTART)")
            finally:
                conn.close()

        await asyncio.to_thread(fold)

    async def close(self) -> None:
        try:
            await self._writer.close()
        finally:
            if self._sequencer_lock is not None:
                os.close(self._sequencer_lock)  # the lock goes with its descriptor
                self._sequencer_lock = None
            self._reader.close()
            await self._conn.close()

    def writes_idle(self) -> bool:
        return self._writer.idle

    async def health(self) -> None:
        await self._fetchone("SELECT 1")
