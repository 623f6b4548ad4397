"""The PostgreSQL backend's pool and its life cycle, which every domain module
(accounts.py, ledger.py, log.py, console.py, agents.py, cluster.py) builds on.

Errors: driver errors are translated once, by the `Storage` base class, which wraps every
public coroutine method and calls `translate_error` here (our triggers' SQLSTATEs GWL01,
GWR01, GWA01, GWC01 and the integrity classes get their meaning there). No method catches
driver errors: `_on_connection` (module level) only reruns a deadlock or serialization
failure, which committed nothing, and re-raises everything else unchanged; and
`batch_or_each` runs a failed batch's items alone, each error
its own.
"""

from __future__ import annotations

import abc
import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

import asyncpg  # type: ignore[import-untyped]  # ships no type information

from model_gateway.storage.base import Storage, log_migration_notes
from model_gateway.storage.batching import LOCKSTEP_BATCH, Batcher, Outcome
from model_gateway.storage.errors import (
    AmountOverflow,
    LimitReached,
    RecordNotFound,
    StateConflict,
    StorageError,
)
from model_gateway.storage.records import ReceiptRecord, ReservationRecord

T = TypeVar("T")
R = TypeVar("R")
Connection = Any  # asyncpg.Connection, untyped
Row = Any  # asyncpg.Record, untyped

# pg_advisory_xact_lock key: one migrator at a time (the others are the domains').
_MIGRATION_LOCK = 0x6D67_7721
_TRANSIENT = frozenset({"40001", "40P01"})  # serialization failure, deadlock: safe to rerun
_RETRIES = 3
# Tables every request rewrites rows of: a hold is inserted and deleted, a receipt queued
# for the log and dequeued, counters updated. Their dead row versions are vacuumed by
# `checkpoint` at most this often, whether autovacuum runs or not (see there).
_CHURNED = ("reservations", "log_pending", "projects", "api_keys", "month_spend", "log_tiles")
_VACUUM_EVERY_S = 10.0

# The driver's failures: the database, the connection or the driver (never a bug of ours).
# ValueError: a malformed DSN; OverflowError: an integer PostgreSQL cannot hold.
# InternalClientError: a connection the server ended under a query (seen when a paused
# process wakes up and uses a session the server closed meanwhile).
_DRIVER_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    asyncio.TimeoutError,
    ValueError,
    OverflowError,
)


B = TypeVar("B")  # an item of a batch
O = TypeVar("O")  # noqa: E741 - an item's outcome


async def batch_or_each(
    together: Callable[[], Awaitable[list[Outcome[O]]]],
    alone: Callable[[B], Awaitable[O]],
    batch: list[B],
) -> list[Outcome[O]]:
    """A batch's outcomes; when one of its items raised (a refused hold: the statement
    committed nothing), each item alone, its error its own outcome (the public method
    that awaits it translates it). Any other failure is every item's. One item goes
    alone at once."""
    if len(batch) > 1:
        try:
            return await together()
        except asyncpg.PostgresError:
            pass
    outcomes: list[Outcome[O]] = []
    for item in batch:
        try:
            outcomes.append(await alone(item))
        except _DRIVER_ERRORS as exc:
            outcomes.append(exc)
    return outcomes


_MAX_BATCH = 64  # holds (or receipts) in one statement


class RateMove(NamedTuple):
    """One request's move of its rate-limit buckets (migration 0018's rules): take (or,
    `forced`, give back) units of (name, per minute, units) buckets at `at_us` (None: the
    database's clock)."""

    buckets: list[tuple[str, int, int]]
    forced: bool
    at_us: int | None


class _HoldGone(StateConflict):
    """Settlement found no open hold to consume (GWR01)."""


# Outside the class on purpose: the Storage base class translates driver errors, once, at
# the boundary of every public method (tests/storage/test_error_translation.py checks that
# no backend method catches them). These two helpers never translate: one reruns a
# transient failure and re-raises anything else unchanged, the other lets housekeeping
# (closing, pinging, reconnecting the listener) see that a driver call failed.


async def _on_connection(pool: Any, op: Callable[[Connection], Awaitable[T]]) -> T:
    """Run `op` on a pooled connection; rerun it on a serialization failure or a deadlock
    (nothing of it was committed). Every other error propagates as raised."""
    for attempt in range(_RETRIES):
        try:
            async with pool.acquire() as conn:
                return await op(conn)
        except asyncpg.PostgresError as exc:
            if exc.sqlstate in _TRANSIENT and attempt + 1 < _RETRIES:
                continue
            raise
    raise AssertionError("unreachable")


async def _failure(call: Callable[[], Awaitable[object]]) -> BaseException | None:
    """The driver error `call` raised, or None: for housekeeping that must go on."""
    try:
        await call()
    except _DRIVER_ERRORS as exc:
        return exc
    return None


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files("model_gateway.storage") / "migrations" / "postgres"
    scripts = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name)
    return [(int(p.name.split("_", 1)[0]), p.read_text()) for p in scripts]


async def _keep_session(conn: Connection) -> None:
    """Pool release hook: nothing to reset."""


def _connect_url(url: str) -> str:
    """asyncpg's DSN: `postgresql+asyncpg://` and `postgres://` are accepted too."""
    scheme, rest = url.split("://", 1)
    if scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        raise StorageError("a PostgreSQL URL looks like postgresql://user@host:5432/database")
    return f"postgresql://{rest}"


# The handles of this process, per database: a change through one bumps them all at once.
_HANDLES: dict[str, weakref.WeakSet[PostgresBase]] = {}


class PostgresBase(Storage):
    """The pool of a PostgreSQL storage and its life cycle; the domain classes
    (accounts.py, ledger.py, ...) build on it, and PostgresStorage is their union."""

    base_exceptions: ClassVar[tuple[type[BaseException], ...]] = _DRIVER_ERRORS

    def __init__(self, pool: Any, dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn
        self._database = dsn
        self._epoch = 0
        self._listener: Connection | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._sequencer: Connection | None = None  # holds or tries the sequencer lock
        self._sequencing = False  # whether its session holds the lock
        self._watchers: list[Callable[[int], None]] = []
        self._vacuum_due = 0.0  # monotonic: the first checkpoint vacuums
        # The concurrent requests' holds, and their receipts, a batch per transaction.
        self._holds: Batcher[ReservationRecord, None] = Batcher(
            self._reserve_batch, _MAX_BATCH, LOCKSTEP_BATCH
        )
        self._receipts: Batcher[ReceiptRecord, bool] = Batcher(
            self._settle_batch, _MAX_BATCH, LOCKSTEP_BATCH
        )
        # Their rate-limit moves (takes and give-backs), a batch per statement too.
        self._rate_moves: Batcher[RateMove, tuple[int, int]] = Batcher(
            self._rate_move_batch, _MAX_BATCH, LOCKSTEP_BATCH
        )

    @classmethod
    def translate_error(cls, exc: BaseException, operation: str) -> StorageError:
        """The one place where PostgreSQL's errors get their meaning. Messages carry the
        SQLSTATE and, for our own triggers, their reason (our words); never SQL text."""
        where = (
            "cannot open PostgreSQL database" if operation == "open" else f"PostgreSQL {operation}"
        )
        if isinstance(exc, asyncpg.PostgresError):
            state: str = exc.sqlstate or ""
            if state == "GWL01":  # a refused reservation: the message is the reason
                return LimitReached(str(exc))
            if state == "GWR01":
                return _HoldGone(f"{where}: {exc}")
            if state == "GWA01":  # a step refused by its run's state: the bare reason
                return StateConflict(str(exc))
            if state == "GWC01":  # a change the rules forbid: the message is ours
                return StateConflict(f"{where}: {exc}")
            if state == "23503":  # foreign_key_violation: the record it names does not exist
                return RecordNotFound(f"{where}: {type(exc).__name__} ({state})")
            if state == "22003":  # numeric_value_out_of_range: a bigint sum past 2^63-1
                return AmountOverflow(f"{where}: {type(exc).__name__} ({state})")
            if state.startswith("23"):  # unique, check, not-null: the change does not fit
                return StateConflict(f"{where}: {type(exc).__name__} ({state})")
            return StorageError(f"{where}: {type(exc).__name__} ({state})")
        if isinstance(exc, OSError) and exc.strerror:
            return StorageError(f"{where}: {exc.strerror}")
        return StorageError(f"{where}: {type(exc).__name__}")

    @classmethod
    async def open(cls, url: str) -> Self:
        dsn = _connect_url(url)
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=10,
            # No session state is ever left on a pooled connection (no SET, LISTEN,
            # session lock or cursor): skip asyncpg's reset query, a round trip per use.
            reset=_keep_session,
            # The money triggers rely on a fresh snapshot per statement after their
            # row locks: READ COMMITTED, whatever the server's default says.
            server_settings={
                "application_name": "model-gateway",
                "default_transaction_isolation": "read committed",
                # A request must not wait without end behind a stuck transaction (an
                # operator's open psql session holding a project row): it fails instead.
                "lock_timeout": "30s",
            },
        )
        storage = cls(pool, dsn)
        try:
            await storage._migrate()
            storage._database = await storage._run(
                lambda c: c.fetchval(
                    "SELECT coalesce(host(inet_server_addr()), '')"
                    " || ':' || coalesce(inet_server_port(), 0) || '/' || current_database()"
                )
            )
            _HANDLES.setdefault(storage._database, weakref.WeakSet()).add(storage)
            await storage._listen()
        except BaseException:
            await storage.close()
            raise
        return storage

    async def _run(self, op: Callable[[Connection], Awaitable[T]]) -> T:
        """Run `op` on a pooled connection, rerunning a serialization failure or deadlock."""
        return await _on_connection(self._pool, op)

    async def _one(self, record: Callable[[Row], R], sql: str, *args: object) -> R | None:
        """The first row of a read as its record, or None."""
        row = await self._run(lambda c: c.fetchrow(sql, *args))
        return None if row is None else record(row)

    async def _all(self, record: Callable[[Row], R], sql: str, *args: object) -> list[R]:
        """Every row of a read as its record."""
        rows = await self._run(lambda c: c.fetch(sql, *args))
        return [record(row) for row in rows]

    async def _migrate(self) -> None:
        async def migrate(conn: Connection) -> None:
            scripts = _migrations()
            # Every start of every process comes here: an up-to-date schema costs one read.
            if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
                applied = await conn.fetchval("SELECT max(version) FROM schema_migrations")
                if applied is not None and applied >= scripts[-1][0]:
                    return
            for number, script in scripts:
                async with conn.transaction():
                    # Several processes may start at once: one migrates, the others wait
                    # here and then find the versions applied.
                    await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
                    await conn.execute(
                        "CREATE TABLE IF NOT EXISTS schema_migrations ("
                        " version INTEGER PRIMARY KEY,"
                        " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                    )
                    # What a migration changed in the operator's data, kept and logged.
                    await conn.execute(
                        "CREATE TABLE IF NOT EXISTS migration_notes ("
                        " version INTEGER NOT NULL, note TEXT NOT NULL)"
                    )
                    done = await conn.fetchval(
                        "SELECT 1 FROM schema_migrations WHERE version = $1", number
                    )
                    if done:
                        continue
                    await conn.execute(script)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version) VALUES ($1)", number
                    )
                    notes = await conn.fetch(
                        "SELECT note FROM migration_notes WHERE version = $1 ORDER BY note",
                        number,
                    )
                log_migration_notes(number, [row["note"] for row in notes])

        await self._run(migrate)

    def _bump_process(self) -> None:
        """A change through this handle: every handle of this process sees it at once."""
        for handle in list(_HANDLES.get(self._database, ())):
            handle._epoch += 1
        self._epoch += 1

    # --- housekeeping ----------------------------------------------------------------

    async def close(self) -> None:
        await self._holds.close()
        await self._receipts.close()
        await self._rate_moves.close()
        self._closed = True
        handles = _HANDLES.get(self._database)
        if handles is not None:
            handles.discard(self)
            if not handles:
                del _HANDLES[self._database]
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        listener, self._listener = self._listener, None
        if listener is not None and await _failure(lambda: asyncio.wait_for(listener.close(), 5)):
            listener.terminate()
        self._drop_sequencer()
        if await _failure(lambda: asyncio.wait_for(self._pool.close(), 10)):
            self._pool.terminate()

    def writes_idle(self) -> bool:
        return self._holds.idle and self._receipts.idle

    async def health(self) -> None:
        await self._run(lambda c: c.fetchval("SELECT 1"))

    async def checkpoint(self) -> None:
        """Check that the admin notifications still arrive, then vacuum the churned tables
        when due."""
        await self._check_listener()
        if time.monotonic() >= self._vacuum_due:
            self._vacuum_due = time.monotonic() + _VACUUM_EVERY_S
            await self._vacuum()

    async def _vacuum(self) -> None:
        """Free the dead row versions of the tables each request churns. Autovacuum may be
        off, and by default it waits for a fifth of a table to be dead: the hold and log
        queue tables hold a few hundred live rows and gain thousands of dead ones a second,
        which every scan of them then steps over (the log's queue read took 1 ms after 3
        minutes of load without a vacuum). Every instance vacuums; SKIP_LOCKED leaves a
        table another instance (or autovacuum) is vacuuming to it. A role that does not own
        the tables gets a warning from the server and relies on autovacuum."""
        tables = ", ".join(_CHURNED)
        await self._run(lambda c: c.execute(f"VACUUM (SKIP_LOCKED) {tables}"))

    def _drop_sequencer(self) -> None:
        """Close the lock's session (the server frees the lock when its socket closes)."""
        conn, self._sequencer, self._sequencing = self._sequencer, None, False
        if conn is not None:
            conn.terminate()

    # Of the domain classes, called by the life cycle here.

    @abc.abstractmethod
    async def _listen(self) -> None:
        """Start listening for admin changes (cluster.py)."""

    @abc.abstractmethod
    async def _check_listener(self) -> None:
        """Reconnect the listener if it does not answer (cluster.py)."""

    @abc.abstractmethod
    async def _reserve_batch(self, batch: list[ReservationRecord]) -> list[Outcome[None]]:
        """Take a batch of holds (ledger.py)."""

    @abc.abstractmethod
    async def _settle_batch(self, batch: list[ReceiptRecord]) -> list[Outcome[bool]]:
        """Settle a batch of receipts (ledger.py)."""

    @abc.abstractmethod
    async def _rate_move_batch(self, batch: list[RateMove]) -> list[Outcome[tuple[int, int]]]:
        """Move a batch's rate-limit buckets (cluster.py)."""
