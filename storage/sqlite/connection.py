"""The embedded backend: one SQLite file in WAL mode.

One gateway process per database file: several processes may read and administer it
(the CLI does), but the metering counters assume a single serving process. Use the
PostgreSQL backend for several gateway instances.

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
import fcntl
import functools
import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

import aiosqlite
import msgspec
import orjson

from model_gateway.storage._batch import pack as _pack
from model_gateway.storage.base import (
    Account,
    AgentRecord,
    AmountOverflow,
    Audit,
    InstanceRecord,
    KeyListing,
    KeyRecord,
    LedgerEntry,
    LimitReached,
    LogEntry,
    LogLeaf,
    LogTile,
    PayerAddressTaken,
    PaymentRecord,
    ProjectRecord,
    PurchaseRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    RunRecord,
    SandboxRecord,
    StateConflict,
    StepRecord,
    Storage,
    StorageError,
    TreeHeadRecord,
    UserRecord,
    account,
    ledger_entry,
    log_migration_notes,
    now_s,
)
from model_gateway.storage.files import (
    make_private,
    make_private_dirs,
    restrict_if_present,
    write_private,
)
from model_gateway.storage.group_commit import GroupCommitWriter

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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements the way SQLite's own tokenizer sees them."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""


def _json_list(value: list[str] | frozenset[str] | None) -> str | None:
    return None if value is None else orjson.dumps(sorted(value)).decode()


# `_pack(prefix, value)`: an id of the gateway's form (prefix + lowercase hex), or a hex
# digest (prefix ''), as the bytes of its hex part; anything else unchanged (migration
# 0011). In C (storage/_batch.c): a receipt packs 13 values, about 0.5 µs each in Python
# against 0.1; tests/storage/test_id_packing.py holds it to the Python definition.


def _unpack(prefix: str, value: str | bytes | None) -> str | None:
    return prefix + value.hex() if isinstance(value, bytes) else value


def _is_int64(value: object) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


def _split_usage(usage: dict[str, int]) -> tuple[int | None, int | None, str | None]:
    """Input and output tokens as integers, any other count as JSON (None: no other)."""
    if len(usage) == 2:  # a chat's usage, every settlement: 0.4 µs against 1.4 below
        input_tokens, output_tokens = usage.get("input_tokens"), usage.get("output_tokens")
        if _is_int64(input_tokens) and _is_int64(output_tokens):
            return input_tokens, output_tokens, None
    rest = dict(usage)
    counts = [rest.pop(n) if _is_int64(rest.get(n)) else None for n in _TOKEN_COUNTS]
    return counts[0], counts[1], orjson.dumps(rest).decode() if rest else None


_TOKEN_COUNTS = ("input_tokens", "output_tokens")
_MAX_INT = 2**63 - 1


def _usage_part(usage: str | None, part: str | None) -> int | str | None:
    """Migration 0011's `gateway_usage(usage, part)`: a token count, or (part NULL) the rest."""
    if usage is None:
        return None
    split = _split_usage(orjson.loads(usage))
    return split[2] if part is None else split[_TOKEN_COUNTS.index(part)]


def _response_commitment(salt: str | None, response_sha256: str | None) -> str | None:
    """SHA-256(salt || digest) from their hex: what every receipt the gateway issues
    commits to (gateway/proofs/commitments.py), so it is rebuilt rather than stored."""
    salt_bytes, digest = _pack("", salt), _pack("", response_sha256)
    if not isinstance(salt_bytes, bytes) or not isinstance(digest, bytes):
        return None
    return hashlib.sha256(salt_bytes + digest).hexdigest()


def _month_of(created_at_us: int) -> str:
    return _month_of_day(created_at_us // 86_400_000_000)


@functools.lru_cache(maxsize=4)
def _month_of_day(unix_day: int) -> str:
    return time.strftime("%Y-%m", time.gmtime(unix_day * 86_400))


def _project(row: sqlite3.Row) -> ProjectRecord:
    allow = row["allow_models"]
    return ProjectRecord(
        id=row["id"],
        name=row["name"],
        state=row["state"],
        monthly_budget=row["monthly_budget"],
        rpm=row["rpm"],
        allow_models=None if allow is None else orjson.loads(allow),
        exclude_models=orjson.loads(row["exclude_models"]),
        created_at=row["created_at"],
    )


def _receipt(row: sqlite3.Row) -> ReceiptRecord:
    """A row of the `receipts` view (migration 0011) as the record it was settled as."""
    fields = {name: row[name] for name in ReceiptRecord.__struct_fields__}
    fields["usage"] = orjson.loads(row["usage"])
    if fields["response_commitment"] is None and fields["response_salt"] is not None:
        fields["response_commitment"] = _response_commitment(
            fields["response_salt"], fields["response_sha256"]
        )
    return ReceiptRecord(**fields)


def _key(row: sqlite3.Row) -> KeyRecord:
    models = row["models"]
    return KeyRecord(
        id=row["id"],
        prefix=row["prefix"],
        key_hash=bytes(row["key_hash"]),
        project_id=row["project_id"],
        scopes=frozenset(orjson.loads(row["scopes"])),
        models=None if models is None else orjson.loads(models),
        monthly_limit=row["monthly_limit"],
        expires_at=row["expires_at"],
        rpm=row["rpm"],
        state=row["state"],
        created_at=row["created_at"],
    )


def _try_lock(path: Path) -> int | None:
    """An exclusive flock on `path`, held by the returned descriptor; None if another holds
    it. One holder among every handle of every process on the file (the log's sequencer:
    gateway serve and its log process), and the kernel frees it when its holder's process
    dies, however it dies."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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


class SQLiteStorage(Storage):
    """Reads (but the log's and the lease meter's small ones) and read-then-decide admin
    transactions through aiosqlite; every other write through the group-commit writer (the
    rules at the top of this module)."""

    # ValueError: aiosqlite's "no active connection"; OverflowError: an integer SQLite
    # cannot store (sqlite3 raises it while binding); OSError: the files themselves.
    base_exceptions: ClassVar[tuple[type[BaseException], ...]] = (
        sqlite3.Error,
        ValueError,
        OverflowError,
        OSError,
    )
    # Writes await the group commit's futures, reads aiosqlite's: no call has a timeout.
    self_cancelling: ClassVar[bool] = False

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
    async def open(cls, url: str, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> SQLiteStorage:
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

    def admin_epoch(self) -> tuple[int, int]:
        return self._epoch.current()

    # Instances: the registry leases the one serving process (and fences it); nothing waits
    # for acknowledgements, since every change is seen at the next request (the epoch file).
    instances_acknowledge_changes: ClassVar[bool] = False

    async def admin_change(self) -> int:
        row = await self._fetchone("SELECT n FROM admin_changes")
        return 0 if row is None else int(row["n"])

    async def renew_instance(self, instance_id: str, lease_ms: int, acked: int) -> int:
        now = _now_ms()
        await self._write(
            "INSERT INTO instances (id, started_at, lease_until, acked) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until,"
            " acked = max(acked, excluded.acked)",
            (instance_id, now, now + lease_ms, acked),
        )
        return await self.admin_change()

    async def acknowledge_admin(self, instance_id: str, change: int) -> None:
        await self._write(
            "UPDATE instances SET acked = ? WHERE id = ? AND acked < ?",
            (change, instance_id, change),
        )

    async def deregister_instance(self, instance_id: str) -> None:
        await self._write("DELETE FROM instances WHERE id = ?", (instance_id,))

    async def list_instances(self) -> list[InstanceRecord]:
        rows = await self._fetchall(
            "SELECT id, started_at, lease_until, acked, lease_until >= ? AS live"
            " FROM instances ORDER BY id",
            (_now_ms(),),
        )
        return [InstanceRecord(**{**dict(row), "live": bool(row["live"])}) for row in rows]

    async def forget_instances(self, expired_for_ms: int) -> int:
        return await self._write(
            "DELETE FROM instances WHERE lease_until < ?", (_now_ms() - expired_for_ms,)
        )

    async def create_project(self, project: ProjectRecord) -> ProjectRecord:
        await self._write(
            "INSERT INTO projects (id, name, state, monthly_budget, rpm, allow_models,"
            " exclude_models, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                project.id,
                project.name,
                project.state,
                project.monthly_budget,
                project.rpm,
                _json_list(project.allow_models),
                _json_list(project.exclude_models),
                project.created_at,
            ),
        )
        return project

    async def get_project(self, project_id: str) -> ProjectRecord | None:
        return await self._one(_project, "SELECT * FROM projects WHERE id = ?", (project_id,))

    async def archive_project(self, project_id: str) -> ProjectRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM projects WHERE id = ?", (project_id,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no project {project_id}")
            if row["state"] == "archived":
                raise StateConflict(f"project {project_id} is already archived")
            await db.execute("UPDATE projects SET state = 'archived' WHERE id = ?", (project_id,))
        self._epoch.bump()
        archived = await self.get_project(project_id)
        if archived is None:  # projects are never deleted; this would be a broken database
            raise RecordNotFound(f"no project {project_id}")
        return archived

    async def create_key(self, key: KeyRecord) -> KeyRecord:
        async with self._transaction() as db:
            found = await (
                await db.execute("SELECT 1 FROM projects WHERE id = ?", (key.project_id,))
            ).fetchone()
            if found is None:
                raise RecordNotFound(f"no project {key.project_id}")
            await db.execute(
                "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, models,"
                " monthly_limit, expires_at, rpm, state, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.id,
                    key.prefix,
                    key.key_hash,
                    key.project_id,
                    _json_list(key.scopes),
                    _json_list(key.models),
                    key.monthly_limit,
                    key.expires_at,
                    key.rpm,
                    key.state,
                    key.created_at,
                ),
            )
        return key

    async def get_key(self, prefix: str) -> KeyRecord | None:
        return await self._one(_key, "SELECT * FROM api_keys WHERE prefix = ?", (prefix,))

    async def revoke_key(self, prefix: str) -> KeyRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM api_keys WHERE prefix = ?", (prefix,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no key {prefix}")
            if row["state"] == "revoked":
                raise StateConflict(f"key {prefix} is already revoked")
            await db.execute("UPDATE api_keys SET state = 'revoked' WHERE prefix = ?", (prefix,))
        self._epoch.bump()
        revoked = await self.get_key(prefix)
        if revoked is None:  # keys are never deleted; this would be a broken database
            raise RecordNotFound(f"no key {prefix}")
        return revoked

    async def add_credit(self, project_id: str, amount: int, month: str) -> None:
        if await self.get_project(project_id) is None:
            raise RecordNotFound(f"no project {project_id}")
        await self._write(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES (?, 'credit', ?, ?, ?)",
            (project_id, amount, month, now_s()),
        )

    async def reserve(self, reservation: ReservationRecord) -> None:
        r = reservation
        await self._write(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.project_id, r.key_id, r.amount, r.month, r.owner, r.lease_until, r.created_at),
        )

    async def settle(self, receipt: ReceiptRecord) -> bool:
        r = receipt
        labels = (r.kind, r.endpoint, r.model_or_runtime, r.status, r.usage_source, r.provider)
        await self._add_shape(labels)
        input_tokens, output_tokens, usage_rest = _split_usage(r.usage)
        rebuilt = _response_commitment(r.response_salt, r.response_sha256)
        # Inserted only while its hold is open and covers the cost, in the one statement:
        # no row (False) when the hold is gone. The `receipt_needs_hold` trigger enforces
        # the same rule for every other writer (it aborts with reservation_gone).
        inserted = await self._write(
            "INSERT INTO receipt_rows (id, reservation_id, project_id, key_id, request_id,"
            " shape, input_tokens, output_tokens, usage_rest, cost, month, created_at,"
            " request_sha256, response_sha256, request_salt, response_salt,"
            " request_commitment, response_commitment)"
            " SELECT ?, ?, ?, ?, ?, s.id, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
            " FROM receipt_shapes s WHERE s.kind = ? AND s.endpoint = ?"
            " AND s.model_or_runtime = ? AND s.status = ? AND s.usage_source = ?"
            " AND s.provider IS ?"
            " AND EXISTS (SELECT 1 FROM reservations"
            "  WHERE id = ? AND project_id = ? AND amount >= ?)",
            (
                _pack("rcpt_", r.id),
                _pack("rsv_", r.reservation_id),
                _pack("prj_", r.project_id),
                _pack("key_", r.key_id),
                _pack("req_", r.request_id),
                input_tokens,
                output_tokens,
                usage_rest,
                r.cost,
                None if r.month == _month_of(r.created_at) else r.month,
                r.created_at,
                _pack("", r.request_sha256),
                _pack("", r.response_sha256),
                _pack("", r.request_salt),
                _pack("", r.response_salt),
                _pack("", r.request_commitment),
                None if r.response_commitment == rebuilt else _pack("", r.response_commitment),
                *labels,
                r.reservation_id,
                r.project_id,
                r.cost,
            ),
        )
        return inserted == 1

    async def _add_shape(self, labels: tuple[str | None, ...]) -> None:
        """The receipt's labels in receipt_shapes, the first time this process meets them
        (a write SQL decides alone: group-committed, before the receipt that needs them)."""
        if labels not in self._shapes:
            await self._write(
                "INSERT INTO receipt_shapes (kind, endpoint, model_or_runtime, status,"
                " usage_source, provider) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                labels,
            )
            self._shapes.add(labels)

    async def release(self, reservation_id: str) -> None:
        await self._write("DELETE FROM reservations WHERE id = ?", (reservation_id,))

    async def renew_leases(self, owner: str, lease_until: int) -> None:
        await self._write(
            "UPDATE reservations SET lease_until = ? WHERE owner = ?", (lease_until, owner)
        )

    async def release_abandoned(self, owner_alive: Callable[[str], bool | None]) -> int:
        rows = await self._fetchall("SELECT DISTINCT owner FROM reservations")
        released = await self._write("DELETE FROM reservations WHERE lease_until < ?", (now_s(),))
        for row in rows:
            if owner_alive(row["owner"]) is False:
                released += await self._write(
                    "DELETE FROM reservations WHERE owner = ?", (row["owner"],)
                )
        return released

    async def project_account(self, project_id: str, month: str) -> Account:
        row = await self._fetchone(
            "SELECT p.balance, p.reserved, p.leased, COALESCE(m.spent, 0) AS spent,"
            " (SELECT COALESCE(SUM(min(in_use, amount)), 0) FROM reservations"
            "  WHERE project_id = p.id AND lease = 1) AS in_use"
            " FROM projects p"
            " LEFT JOIN month_spend m ON m.subject = p.id AND m.month = ? WHERE p.id = ?",
            (month, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return account(row)

    async def key_month_spend(self, key_id: str, month: str) -> int:
        row = await self._fetchone(
            "SELECT spent FROM month_spend WHERE subject = ? AND month = ?", (key_id, month)
        )
        return 0 if row is None else int(row["spent"])

    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        row = await self._fetchone(
            "SELECT * FROM receipts WHERE seq = (SELECT seq FROM receipt_rows WHERE id = ?)",
            (_pack("rcpt_", receipt_id),),
        )
        return None if row is None else _receipt(row)

    async def audit(self, project_id: str, month: str) -> Audit:
        # Charges are whole ledger rows, or rows that name their receipt (migration 0011).
        row = await self._fetchone(
            "SELECT p.balance, p.reserved,"
            " (SELECT COALESCE(SUM(CASE kind WHEN 'credit' THEN amount ELSE -amount END), 0)"
            "  FROM ledger WHERE project_id = p.id)"
            " - (SELECT COALESCE(SUM(r.cost), 0) FROM receipt_rows r"
            "  JOIN ledger l ON l.receipt = r.seq WHERE r.project_id = ?1) AS ledger_sum,"
            " (SELECT COALESCE(SUM(amount), 0) FROM reservations WHERE project_id = p.id) AS held,"
            " (SELECT COALESCE(SUM(spent), 0) FROM month_spend WHERE subject = p.id AND month = ?2)"
            "  AS month_spend,"
            " (SELECT COALESCE(SUM(amount), 0) FROM ledger"
            "  WHERE project_id = p.id AND kind = 'charge' AND month = ?2)"
            " + (SELECT COALESCE(SUM(r.cost), 0) FROM receipt_rows r"
            "  JOIN ledger l ON l.receipt = r.seq WHERE r.project_id = ?1 AND ?2 ="
            "  coalesce(r.month, strftime('%Y-%m', r.created_at / 1000000, 'unixepoch')))"
            "  AS month_charges"
            " FROM projects p WHERE p.id = ?3",
            (_pack("prj_", project_id), month, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return Audit(
            balance=row["balance"],
            ledger_sum=row["ledger_sum"],
            reserved=row["reserved"],
            open_reservations_sum=row["held"],
            month_spend=row["month_spend"],
            month_charges_sum=row["month_charges"],
        )

    async def create_sandbox(self, sandbox: SandboxRecord) -> SandboxRecord:
        if await self.get_project(sandbox.project_id) is None:
            raise RecordNotFound(f"no project {sandbox.project_id}")
        b = sandbox
        await self._write(
            "INSERT INTO sandboxes (id, project_id, runtime, timeout_s, memory_mb, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (b.id, b.project_id, b.runtime, b.timeout_s, b.memory_mb, b.created_at),
        )
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        row = await self._fetchone("SELECT * FROM sandboxes WHERE id = ?", (sandbox_id,))
        return None if row is None else SandboxRecord(**dict(row))

    async def unlogged_receipts(self, limit: int) -> list[ReceiptRecord]:
        # Whole receipts (read back after a restart, or settled by another process): rows
        # too long for the loop, on the thread.
        return [_receipt(row) for row in await self._unlogged("v.*", limit, self._fetchall)]

    async def unlogged_receipt_ids(self, limit: int) -> list[tuple[str, int]]:
        # Read several times a second: on the loop, unless the list is long (receipts the
        # log had to skip).
        fetch = self._glance if limit <= _GLANCE_ROWS else self._fetchall
        rows = await self._unlogged("v.id, v.created_at", limit, fetch)
        return [(row[0], row[1]) for row in rows]

    async def skip_unloggable(self, receipt_ids: list[str]) -> None:
        """Nothing to write: unlogged receipts are those after the last logged one, so the
        next receipt logged passes them."""

    async def _unlogged(
        self,
        columns: Literal["v.*", "v.id, v.created_at"],
        limit: int,
        fetch: Callable[[str, tuple[object, ...]], Awaitable[list[sqlite3.Row]]],
    ) -> list[sqlite3.Row]:
        # Leaves follow receipts' issue order, so the search starts after the last logged
        # one (with tiles, else before them) instead of scanning every receipt ever issued.
        last_leaf = await self._glance(
            "SELECT receipt_id FROM log_leaves ORDER BY leaf_index DESC LIMIT 1"
        )
        return await fetch(
            f"SELECT {columns} FROM receipt_rows r JOIN receipts v ON v.seq = r.seq"  # noqa: S608
            " WHERE r.seq > max("
            "  COALESCE((SELECT receipt FROM log_entries ORDER BY leaf_index DESC LIMIT 1), 0),"
            "  COALESCE((SELECT seq FROM receipt_rows WHERE id = ?), 0))"
            " AND NOT EXISTS (SELECT 1 FROM log_entries e WHERE e.receipt = r.seq)"
            " AND NOT EXISTS (SELECT 1 FROM log_leaves l WHERE l.receipt_id = v.id)"
            " ORDER BY r.seq LIMIT ?",
            (_pack("rcpt_", last_leaf[0][0]) if last_leaf else None, limit),
        )

    async def log_leaves(self, start: int = 0, limit: int | None = None) -> list[LogLeaf]:
        rows = await self._fetchall(
            "SELECT * FROM log_leaves WHERE leaf_index >= ? ORDER BY leaf_index LIMIT ?",
            (start, -1 if limit is None else limit),
        )
        return [
            LogLeaf(**{**dict(row), "public_receipt": bytes(row["public_receipt"])}) for row in rows
        ]

    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        row = await self._fetchone("SELECT * FROM log_leaves WHERE receipt_id = ?", (receipt_id,))
        if row is None:
            return None
        return LogLeaf(**{**dict(row), "public_receipt": bytes(row["public_receipt"])})

    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        if size is None:
            rows = await self._glance("SELECT * FROM tree_heads ORDER BY size DESC LIMIT 1")
        else:
            rows = await self._glance("SELECT * FROM tree_heads WHERE size = ?", (size,))
        return TreeHeadRecord(**dict(rows[0])) if rows else None

    # The console (migration 0005).

    async def create_user(self, user: UserRecord, role: str | None) -> UserRecord:
        async with self._transaction() as db:
            if role is None:
                row = await (await db.execute("SELECT 1 FROM users LIMIT 1")).fetchone()
                role = "member" if row is not None else "owner"
            await db.execute(
                "INSERT INTO users (id, email, password_hash, role, disabled, created_at)"
                " VALUES (?, ?, ?, ?, 0, ?)",
                (user.id, user.email, user.password_hash, role, user.created_at),
            )
        return msgspec.structs.replace(user, role=role)

    async def get_user(self, email: str) -> UserRecord | None:
        return await self._one(_user, "SELECT * FROM users WHERE email = ?", (email,))

    async def list_users(self) -> list[UserRecord]:
        return [_user(row) for row in await self._fetchall("SELECT * FROM users ORDER BY rowid")]

    async def disable_user(self, email: str) -> UserRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT id FROM users WHERE email = ?", (email,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no user {email}")
            await db.execute("UPDATE users SET disabled = 1 WHERE id = ?", (row["id"],))
            await db.execute("DELETE FROM sessions WHERE user_id = ?", (row["id"],))
        return await self._found(self.get_user(email), f"no user {email}")

    async def grant_project(self, email: str, project_id: str) -> None:
        async with self._transaction() as db:
            user = await (
                await db.execute("SELECT id FROM users WHERE email = ?", (email,))
            ).fetchone()
            if user is None:
                raise RecordNotFound(f"no user {email}")
            found = await (
                await db.execute("SELECT 1 FROM projects WHERE id = ?", (project_id,))
            ).fetchone()
            if found is None:
                raise RecordNotFound(f"no project {project_id}")
            await db.execute(
                "INSERT OR IGNORE INTO grants (user_id, project_id, created_at) VALUES (?, ?, ?)",
                (user["id"], project_id, now_s()),
            )

    async def granted_projects(self, user_id: str) -> set[str]:
        rows = await self._fetchall("SELECT project_id FROM grants WHERE user_id = ?", (user_id,))
        return {row["project_id"] for row in rows}

    async def create_session(self, id_hash: bytes, user_id: str, now: int) -> None:
        await self._write(
            "INSERT INTO sessions (id_hash, user_id, created_at, seen_at) VALUES (?, ?, ?, ?)",
            (id_hash, user_id, now, now),
        )

    async def session_user(self, id_hash: bytes, idle_since: int) -> UserRecord | None:
        return await self._one(
            _user,
            "SELECT u.* FROM sessions s JOIN users u ON u.id = s.user_id"
            " WHERE s.id_hash = ? AND s.seen_at >= ? AND u.disabled = 0",
            (id_hash, idle_since),
        )

    async def touch_session(self, id_hash: bytes, now: int) -> None:
        await self._write("UPDATE sessions SET seen_at = ? WHERE id_hash = ?", (now, id_hash))

    async def delete_session(self, id_hash: bytes) -> None:
        await self._write("DELETE FROM sessions WHERE id_hash = ?", (id_hash,))

    async def purge_console(self, sessions_seen_before: int, failures_before: int) -> None:
        await self._write("DELETE FROM sessions WHERE seen_at < ?", (sessions_seen_before,))
        await self._write("DELETE FROM login_failures WHERE at < ?", (failures_before,))

    async def record_login_failure(self, subjects: list[str], now: int) -> None:
        async with self._transaction() as db:
            await db.executemany(
                "INSERT INTO login_failures (subject, at) VALUES (?, ?)",
                [(subject, now) for subject in subjects],
            )

    async def login_failures(self, subject: str, since: int) -> list[int]:
        rows = await self._fetchall(
            "SELECT at FROM login_failures WHERE subject = ? AND at >= ? ORDER BY at",
            (subject, since),
        )
        return [row["at"] for row in rows]

    async def clear_login_failures(self, subject: str) -> None:
        await self._write("DELETE FROM login_failures WHERE subject = ?", (subject,))

    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        rows = await self._fetchall("SELECT * FROM projects ORDER BY created_at DESC, rowid DESC")
        return [_project(row) for row in rows if ids is None or row["id"] in ids]

    async def update_project(self, project_id: str, changes: dict[str, object]) -> ProjectRecord:
        columns = ("monthly_budget", "rpm", "allow_models", "exclude_models")
        await self._update_row("projects", "id", project_id, "active", columns, changes)
        return await self._found(self.get_project(project_id), f"no project {project_id}")

    async def update_key(self, prefix: str, changes: dict[str, object]) -> KeyRecord:
        columns = ("name", "models", "monthly_limit", "expires_at", "rpm")
        await self._update_row("api_keys", "prefix", prefix, "usable", columns, changes)
        return await self._found(self.get_key(prefix), f"no key {prefix}")

    @staticmethod
    async def _found(lookup: Awaitable[R | None], missing: str) -> R:
        """The record a lookup finds, or RecordNotFound (deleted meanwhile)."""
        record = await lookup
        if record is None:
            raise RecordNotFound(missing)
        return record

    async def _update_row(
        self,
        table: str,
        id_column: str,
        value: str,
        live_state: str,
        columns: tuple[str, ...],
        changes: dict[str, object],
    ) -> None:
        """Change the given columns of a row still in its live state; bump the admin epoch,
        since cached keys carry their own and their project's limits and model policy."""
        unknown = set(changes) - set(columns)
        if unknown:
            raise StorageError(f"cannot change {', '.join(sorted(unknown))}")
        values = {
            name: _json_list(new) if name.endswith("models") else new  # type: ignore[arg-type]
            for name, new in changes.items()
        }
        noun = table.rstrip("s").replace("api_", "")
        async with self._transaction() as db:
            row = await (
                await db.execute(f"SELECT state FROM {table} WHERE {id_column} = ?", (value,))  # noqa: S608
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no {noun} {value}")
            if row["state"] != live_state:
                raise StateConflict(f"{noun} {value} is {row['state']}")
            if values:
                assignments = ", ".join(f"{name} = ?" for name in values)  # names checked above
                await db.execute(
                    f"UPDATE {table} SET {assignments} WHERE {id_column} = ?",  # noqa: S608
                    (*values.values(), value),
                )
        self._epoch.bump()

    async def list_keys(self, project_id: str) -> list[KeyListing]:
        rows = await self._fetchall(
            "SELECT k.* FROM api_keys k WHERE k.project_id = ?"
            " ORDER BY k.created_at DESC, k.rowid DESC",
            (project_id,),
        )
        return [
            KeyListing(
                key=_key(row),
                name=row["name"],
                last_used_at=None if row["last_used_us"] is None else row["last_used_us"] // 10**6,
            )
            for row in rows
        ]

    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        group = {
            "day": "strftime('%Y-%m-%d', r.created_at / 1000000, 'unixepoch')",
            "model": "s.model_or_runtime",
            "key": "k.prefix",
        }[group_by]
        # Receipts (migration 0011) keep integer token counts in columns, others in usage_rest.
        rows = await self._fetchall(
            f"SELECT {group} AS grp, COUNT(*) AS requests,"  # noqa: S608 (a fixed expression)
            " COALESCE(SUM(COALESCE(r.input_tokens,"
            "  json_extract(r.usage_rest, '$.input_tokens'))), 0) AS input_tokens,"
            " COALESCE(SUM(COALESCE(r.output_tokens,"
            "  json_extract(r.usage_rest, '$.output_tokens'))), 0) AS output_tokens,"
            " COALESCE(SUM(CASE s.kind WHEN 'sandbox'"
            "  THEN json_extract(r.usage_rest, '$.duration_ms') END), 0) AS sandbox_ms,"
            " SUM(r.cost) AS cost"
            " FROM receipt_rows r JOIN receipt_shapes s ON s.id = r.shape"
            " LEFT JOIN api_keys k ON k.id = (CASE typeof(r.key_id) WHEN 'blob'"
            "  THEN 'key_' || lower(hex(r.key_id)) ELSE r.key_id END)"
            " WHERE r.project_id = ? AND r.created_at >= ? AND r.created_at < ?"
            " GROUP BY grp ORDER BY grp",
            (_pack("prj_", project_id), start_us, end_us),
        )
        return [{**dict(row), "group": row["grp"]} for row in rows]

    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        rows = await self._fetchall(
            "SELECT v.* FROM receipt_rows r JOIN receipts v ON v.seq = r.seq"
            " WHERE r.project_id = ? AND r.seq < ? ORDER BY r.seq DESC LIMIT ?",
            (_pack("prj_", project_id), _MAX_INT if before is None else before, limit),
        )
        return [(row["seq"], _receipt(row)) for row in rows]

    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        below = _MAX_INT if before is None else before
        whole = await self._fetchall(
            "SELECT l.id, l.kind, l.amount, l.key_id, l.receipt_id, l.created_at,"
            " p.reference, u.tx_hash FROM ledger l"
            " LEFT JOIN payments p ON p.ledger_id = l.id"
            " LEFT JOIN purchases u ON u.ledger_id = l.id"
            " WHERE l.project_id = ? AND l.id < ? ORDER BY l.id DESC LIMIT ?",
            (project_id, below, limit),
        )
        # Charges told by their receipt (migration 0011), found along the receipts' project
        # index: their ledger ids grow with their receipts' seqs, so those below the cursor
        # are the receipts below the first such charge at or above it.
        told = await self._fetchall(
            "SELECT l.id, 'charge' AS kind, r.cost AS amount, r.key_id, r.id AS receipt_id,"
            " r.created_at / 1000000 AS created_at, NULL AS reference, NULL AS tx_hash"
            " FROM receipt_rows r JOIN ledger l ON l.receipt = r.seq"
            " WHERE r.project_id = ? AND r.seq < COALESCE((SELECT receipt FROM ledger"
            "  WHERE id >= ? AND receipt IS NOT NULL ORDER BY id LIMIT 1), ?)"
            " ORDER BY r.seq DESC LIMIT ?",
            (_pack("prj_", project_id), below, _MAX_INT, limit),
        )
        rows = sorted([*whole, *told], key=lambda row: row["id"], reverse=True)[:limit]
        return [ledger_entry(row, _unpack) for row in rows]

    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        rows = await self._fetchall(
            "SELECT * FROM sandboxes WHERE project_id = ? ORDER BY created_at DESC, rowid DESC",
            (project_id,),
        )
        return [SandboxRecord(**dict(row)) for row in rows]

    @staticmethod
    async def _credit_once(
        db: aiosqlite.Connection,
        project_id: str,
        amount: int,
        month: str,
        created_at: int,
        seen: tuple[str, tuple[object, ...]],
        conflict: str,
    ) -> int:
        """A credit entry for money that arrived once (a payment, a purchase), inside the
        caller's transaction; StateConflict when the `seen` query finds it recorded."""
        found = await (
            await db.execute("SELECT 1 FROM projects WHERE id = ?", (project_id,))
        ).fetchone()
        if found is None:
            raise RecordNotFound(f"no project {project_id}")
        if await (await db.execute(*seen)).fetchone() is not None:
            raise StateConflict(conflict)
        cursor = await db.execute(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES (?, 'credit', ?, ?, ?)",
            (project_id, amount, month, created_at),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    async def record_payment(self, payment: PaymentRecord) -> PaymentRecord:
        p = payment
        async with self._transaction() as db:
            ledger_id = await self._credit_once(
                db,
                p.project_id,
                p.amount,
                p.month,
                p.created_at,
                (
                    "SELECT 1 FROM payments WHERE project_id = ? AND reference = ?",
                    (p.project_id, p.reference),
                ),
                f"payment {p.reference!r} is already recorded",
            )
            await db.execute(
                "INSERT INTO payments (id, project_id, reference, amount, ledger_id, recorded_by,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    p.id,
                    p.project_id,
                    p.reference,
                    p.amount,
                    ledger_id,
                    p.recorded_by,
                    p.created_at,
                ),
            )
        return payment

    async def payer_addresses(self, project_id: str) -> list[str]:
        rows = await self._fetchall(
            "SELECT address FROM payer_addresses WHERE project_id = ? ORDER BY address",
            (project_id,),
        )
        return [row["address"] for row in rows]

    async def set_payer_addresses(self, project_id: str, addresses: list[str]) -> None:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM projects WHERE id = ?", (project_id,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no project {project_id}")
            if row["state"] != "active":
                raise StateConflict(f"project {project_id} is archived")
            # Checked here for a clear refusal; the unique index (migration 0015) is the rule.
            taken = await (
                await db.execute(
                    "SELECT min(address) AS address FROM payer_addresses"
                    " WHERE address IN (SELECT value FROM json_each(?)) AND project_id <> ?",
                    (orjson.dumps(addresses).decode(), project_id),
                )
            ).fetchone()
            if taken is not None and taken["address"] is not None:
                raise PayerAddressTaken(taken["address"])
            await db.execute("DELETE FROM payer_addresses WHERE project_id = ?", (project_id,))
            await db.executemany(
                "INSERT INTO payer_addresses (project_id, address) VALUES (?, ?)"
                " ON CONFLICT (project_id, address) DO NOTHING",  # a repeated address
                [(project_id, address) for address in addresses],
            )

    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        row = await self._fetchone(
            "SELECT u.*, l.month FROM purchases u JOIN ledger l ON l.id = u.ledger_id"
            " WHERE u.tx_hash = ?",
            (tx_hash,),
        )
        if row is None:
            return None
        fields = {name: row[name] for name in PurchaseRecord.__struct_fields__}
        return PurchaseRecord(**{**fields, "token_units": int(row["token_units"])})

    async def record_purchase(self, purchase: PurchaseRecord) -> PurchaseRecord:
        p = purchase
        async with self._transaction() as db:
            ledger_id = await self._credit_once(
                db,
                p.project_id,
                p.amount,
                p.month,
                p.created_at,
                ("SELECT 1 FROM purchases WHERE tx_hash = ?", (p.tx_hash,)),
                f"transaction {p.tx_hash} is already credited",
            )
            await db.execute(
                "INSERT INTO purchases (tx_hash, project_id, sender, token_units, amount,"
                " ledger_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    p.tx_hash,
                    p.project_id,
                    p.sender,
                    str(p.token_units),
                    p.amount,
                    ledger_id,
                    p.created_at,
                ),
            )
        return purchase

    async def limit_figures(
        self, project_id: str, key_id: str | None, month: str
    ) -> dict[str, int | None]:
        row = await self._fetchone(
            "SELECT p.balance, p.reserved, p.monthly_budget,"
            " COALESCE((SELECT spent FROM month_spend WHERE subject = p.id AND month = ?), 0)"
            "  AS month_spend,"
            " k.monthly_limit AS key_monthly_limit, k.reserved AS key_reserved,"
            " COALESCE((SELECT spent FROM month_spend WHERE subject = k.id AND month = ?), 0)"
            "  AS key_month_spend"
            " FROM projects p LEFT JOIN api_keys k ON k.id = ? WHERE p.id = ?",
            (month, month, key_id, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return dict(row)

    # -- Hosted agents: the money moves in triggers (migrations/sqlite/0007_agents.sql) --

    async def create_agent(self, agent: AgentRecord) -> AgentRecord:
        if await self.get_project(agent.project_id) is None:
            raise RecordNotFound(f"no project {agent.project_id}")
        a = agent
        await self._write(
            "INSERT INTO agents (id, project_id, name, model, instructions, tools, sandbox_id,"
            " max_steps, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                a.id,
                a.project_id,
                a.name,
                a.model,
                a.instructions,
                orjson.dumps(a.tools).decode(),
                a.sandbox_id,
                a.max_steps,
                a.created_at,
            ),
        )
        return agent

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        return await self._one(_agent, "SELECT * FROM agents WHERE id = ?", (agent_id,))

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        return await self._all(
            _agent,
            "SELECT * FROM agents WHERE project_id = ? ORDER BY created_at, id",
            (project_id,),
        )

    async def create_run(self, run: RunRecord) -> RunRecord:
        r = run
        await self._write(
            "INSERT INTO agent_runs (id, agent_id, project_id, input, budget, owner, lease_until,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, r.agent_id, r.project_id, r.input, r.budget, r.owner, r.lease_until,
             r.created_at),
        )  # fmt: skip
        return run

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._one(_run, "SELECT * FROM agent_runs WHERE id = ?", (run_id,))

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        return await self._all(
            _run,
            "SELECT * FROM agent_runs WHERE agent_id = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            (agent_id, limit),
        )

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        return await self._all(
            _step, "SELECT * FROM agent_steps WHERE run_id = ? ORDER BY seq", (run_id,)
        )

    async def begin_step(self, step: StepRecord) -> None:
        s = step
        await self._write(
            "INSERT INTO agent_steps (run_id, seq, kind, subject, hold, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (s.run_id, s.seq, s.kind, s.subject, s.hold, s.created_at),
        )

    async def drop_step(self, run_id: str, seq: int) -> None:
        await self._write(
            "DELETE FROM agent_steps WHERE run_id = ? AND seq = ? AND state = 'in_flight'"
            " AND reservation_id IS NULL",
            (run_id, seq),
        )

    async def attach_step_hold(self, run_id: str, seq: int, reservation_id: str) -> None:
        await self._write(
            "UPDATE agent_steps SET reservation_id = ? WHERE run_id = ? AND seq = ?",
            (reservation_id, run_id, seq),
        )

    async def describe_step(
        self,
        run_id: str,
        seq: int,
        *,
        input_tokens: int,
        output_tokens: int,
        duration_ms: int,
        error: dict[str, object] | None,
    ) -> None:
        await self._write(
            "UPDATE agent_steps SET input_tokens = ?, output_tokens = ?, duration_ms = ?,"
            " error = ?, state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,"
            " closed_at = ? WHERE run_id = ? AND seq = ?",
            (input_tokens, output_tokens, duration_ms, _json_or_none(error), now_s(), run_id, seq),
        )

    async def finish_run(
        self, run_id: str, status: str, output: str | None, error: dict[str, object] | None
    ) -> bool:
        ended = await self._write(
            "UPDATE agent_runs SET status = ?, output = ?, error = ?, finished_at = ?"
            " WHERE id = ? AND status = 'running'",
            (status, output, _json_or_none(error), now_s(), run_id),
        )
        return ended == 1

    async def request_cancel(self, run_id: str) -> RunRecord:
        flagged = await self._write(
            "UPDATE agent_runs SET cancel_requested = 1 WHERE id = ? AND status = 'running'",
            (run_id,),
        )
        run = await self.get_run(run_id)
        if run is None:
            raise RecordNotFound(f"no run {run_id}")
        if not flagged:
            raise StateConflict(f"run {run_id} has already ended ({run.status})")
        # The shared reader may not see the write yet (a statement of another task can
        # hold its snapshot open): the flag is known to be set.
        return msgspec.structs.replace(run, cancel_requested=True)

    async def renew_run_leases(self, owner: str, lease_until: int) -> list[str]:
        await self._write(
            "UPDATE agent_runs SET lease_until = ? WHERE owner = ? AND status = 'running'",
            (lease_until, owner),
        )
        rows = await self._fetchall(
            "SELECT id FROM agent_runs WHERE owner = ? AND status = 'running'"
            " AND cancel_requested <> 0",
            (owner,),
        )
        return [row["id"] for row in rows]

    async def fail_abandoned_runs(
        self, owner_alive: Callable[[str], bool | None], error: dict[str, object]
    ) -> list[str]:
        rows = await self._fetchall(
            "SELECT id, owner, lease_until FROM agent_runs WHERE status = 'running'"
        )
        now = now_s()
        # Owners are checked once each: /proc reads, not one per run.
        alive = {row["owner"]: owner_alive(row["owner"]) for row in rows}
        abandoned = [
            row["id"] for row in rows if row["lease_until"] < now or alive[row["owner"]] is False
        ]
        failed = []
        for run_id in abandoned:
            # The status change releases the run's holds in flight (trigger agent_run_ends).
            if await self.finish_run(run_id, "failed", None, error):
                failed.append(run_id)
        return failed

    async def append_log_tiles(
        self, entries: list[LogEntry], tiles: list[LogTile], head: TreeHeadRecord | None
    ) -> None:
        heads = [] if head is None else [head]
        head_rows: list[tuple[object, ...]] = [
            (h.size, h.size - len(entries), h.root_hash, h.timestamp, h.key_id, h.signature)
            for h in heads
        ]
        await self._writer.execute_unit(
            [
                # Entries first: a writer that raced us fails here, before the tiles.
                (
                    "INSERT INTO log_entries (leaf_index, receipt)"
                    " VALUES (?, (SELECT seq FROM receipt_rows WHERE id = ?))",
                    [(e.leaf_index, _pack("rcpt_", e.receipt_id)) for e in entries],
                ),
                # The log_tiles_only_grow trigger refuses an update that is not an append.
                (
                    "INSERT INTO log_tiles (level, idx, hashes) VALUES (?, ?, ?)"
                    " ON CONFLICT (level, idx) DO UPDATE SET hashes = excluded.hashes",
                    [(t.level, t.index, t.hashes) for t in tiles],
                ),
                # Compare-and-set on the tree size: unless the latest stored head is the
                # one this append continues, the root is NULL and NOT NULL undoes the unit.
                (
                    "INSERT INTO tree_heads (size, root_hash, timestamp, key_id, signature)"
                    " VALUES (?1, CASE WHEN (SELECT coalesce(max(size), 0) FROM tree_heads)"
                    " = ?2 THEN ?3 END, ?4, ?5, ?6)",
                    head_rows,
                ),
            ]
        )

    async def claim_log_sequencer(self) -> bool:
        if self._sequencer_lock is None:
            self._sequencer_lock = _try_lock(self._path.with_name(self._path.name + ".sequencer"))
        return self._sequencer_lock is not None

    async def log_tiles(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        # One round trip for every tile a proof needs, the keys as one JSON parameter.
        rows = await self._fetchall(
            "SELECT level, idx, hashes FROM log_tiles WHERE (level, idx) IN"
            " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
            "  FROM json_each(?))",
            (orjson.dumps(sorted(set(keys))).decode(),),
        )
        return {(row[0], row[1]): bytes(row[2]) for row in rows}

    async def log_entry_index(self, receipt_id: str) -> int | None:
        row = await self._fetchone(
            "SELECT e.leaf_index FROM receipt_rows r JOIN log_entries e ON e.receipt = r.seq"
            " WHERE r.id = ?",
            (_pack("rcpt_", receipt_id),),
        )
        return None if row is None else row[0]

    async def log_entry_receipts(self, start: int, end: int) -> list[tuple[int, ReceiptRecord]]:
        rows = await self._fetchall(
            "SELECT e.leaf_index AS log_leaf_index, v.* FROM log_entries e"
            " JOIN receipts v ON v.seq = e.receipt"
            " WHERE e.leaf_index >= ? AND e.leaf_index < ? ORDER BY e.leaf_index",
            (start, end),
        )
        return [(row["log_leaf_index"], _receipt(row)) for row in rows]

    # -- Leases (migrations/sqlite/0012_leases.sql): every write one group-committed statement

    async def grant_lease(self, lease: ReservationRecord) -> None:
        r = lease
        await self._write(
            "INSERT INTO reservations (id, project_id, key_id, amount, month, owner, lease_until,"
            " created_at, lease) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            (r.id, r.project_id, r.key_id, r.amount, r.month, r.owner, r.lease_until, r.created_at),
        )

    async def return_lease(self, lease_id: str, amount: int) -> bool:
        returned = await self._write(
            "UPDATE reservations SET amount = amount - ?, recalled = 0"
            " WHERE id = ? AND lease = 1 AND amount >= ?",
            (amount, lease_id, amount),
        )
        return returned == 1

    async def mark_in_use(self, uses: list[tuple[str, int]]) -> None:
        await self._writer.execute_unit(
            [
                (
                    "UPDATE reservations SET in_use = ?2 WHERE id = ?1 AND lease = 1",
                    [(lease_id, in_use) for lease_id, in_use in uses],
                )
            ]
        )

    async def recall_leases(self, project_id: str, owner: str) -> int:
        return await self._write(
            "UPDATE reservations SET recalled = 1"
            " WHERE project_id = ? AND lease = 1 AND owner <> ? AND recalled = 0",
            (project_id, owner),
        )

    async def pending_recalls(self, project_id: str, owner: str) -> int:
        row = await self._fetchone(
            "SELECT count(*) FROM reservations"
            " WHERE project_id = ? AND lease = 1 AND owner <> ? AND recalled = 1",
            (project_id, owner),
        )
        return 0 if row is None else int(row[0])

    async def recalled_leases(self, owner: str) -> list[str]:
        rows = await self._glance(
            "SELECT id FROM reservations WHERE owner = ? AND lease = 1 AND recalled = 1", (owner,)
        )
        return [row["id"] for row in rows]

    async def lease_audit(self, project_id: str) -> tuple[int, int]:
        row = await self._fetchone(
            "SELECT p.leased, (SELECT COALESCE(SUM(amount), 0) FROM reservations"
            "  WHERE project_id = p.id AND lease = 1) AS held FROM projects p WHERE p.id = ?",
            (project_id,),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return int(row["leased"]), int(row["held"])


def _user(row: sqlite3.Row) -> UserRecord:
    return UserRecord(
        id=row["id"],
        email=row["email"],
        password_hash=row["password_hash"],
        role=row["role"],
        disabled=bool(row["disabled"]),
        created_at=row["created_at"],
    )


def _json_or_none(value: dict[str, object] | None) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def _agent(row: sqlite3.Row) -> AgentRecord:
    return AgentRecord(**{**dict(row), "tools": orjson.loads(row["tools"])})


def _run(row: sqlite3.Row) -> RunRecord:
    fields = dict(row)
    fields["cancel_requested"] = bool(fields["cancel_requested"])
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return RunRecord(**fields)


def _step(row: sqlite3.Row) -> StepRecord:
    fields = dict(row)
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return StepRecord(**fields)
