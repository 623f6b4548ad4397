"""The shared backend: PostgreSQL through an asyncpg pool, for any number of gateway processes.

Money rules live in the database (migrations/postgres/0002_metering.sql): a reservation
is one INSERT whose trigger locks the project row, then the key row, checks the key's
monthly limit, the project's monthly budget and the available balance, and holds the
amount; a settlement is one INSERT of the receipt, made only while its hold exists (the
EXISTS subquery locks the hold: a concurrent settlement or release waits, then finds it
gone and the insert writes nothing: `settle` is False), whose trigger deletes the hold
and writes the charge, capped at the hold. Every statement runs in autocommit under READ
COMMITTED; none checks first and writes later. Hosted agents' run budgets are kept the
same way (migrations/postgres/0005_agents.sql: the run row is locked at admission).
Concurrent holds, and concurrent receipts, go as one statement per batch (migration
0015, storage/batching.py): each item under the same triggers; a batch in which one item
raises commits nothing, and its items then run alone.

Errors: driver errors are translated once, by the `Storage` base class, which wraps every
public coroutine method and calls `translate_error` here (our triggers' SQLSTATEs GWL01,
GWR01, GWA01, GWC01 and the integrity classes get their meaning there). No method catches
driver errors: `_on_connection` (module level) only reruns a deadlock or serialization
failure, which committed nothing, and re-raises everything else unchanged; and
`_batch_or_each` (module level) runs a failed batch's items alone, each error its own.

The transparency log is stored as C2SP tiles (migration 0004): entries, tiles and the
signed head of one integration are one transaction; a tile only grows (a trigger refuses
any other update), a reused leaf index, receipt or signed size fails a unique key, an
append that does not continue the latest signed head is refused (compare-and-set on the
tree size), and any of these is a StateConflict with nothing written. `log_pending`
holds exactly the receipts in neither log_leaves (old-format leaves) nor log_entries.
One process appends: the log's sequencer, which holds a session advisory lock on a
connection of its own (`claim_log_sequencer`).

Admin epoch: every process LISTENs on the `gateway_admin` channel on a connection of its
own. Triggers on `projects` and `api_keys` NOTIFY it at the commit of any change, by any
writer; the notification bumps an in-process counter, so `admin_epoch()` never touches
the database. A change made through a handle of this process bumps every handle of the
process on the same database at once; other processes see it when the notification
arrives (normally well under a millisecond later). While the listening connection is down
the epoch is different on every call, so the key cache never serves a stale entry.

Instances (migration 0009): every key or project change also takes the next admin change
number (one counter row, so numbers commit in order) and notifies it as the payload; the
handle counts the newest it heard (`admin_applied`). An instance's lease renewal reads
the counter FOR SHARE after renewing, in one transaction, so a change that commits
meanwhile is either read by the renewal or finds the instance live (gateway/instance.py
and gateway/admin_confirm.py use this). Leases are on the database's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable
from importlib import resources
from operator import itemgetter
from typing import Any, ClassVar, TypeVar

import asyncpg  # type: ignore[import-untyped]  # ships no type information
import msgspec
import orjson

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
from model_gateway.storage.batching import LOCKSTEP_BATCH, Batcher, Outcome

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
Connection = Any  # asyncpg.Connection, untyped
Row = Any  # asyncpg.Record, untyped

CHANNEL = "gateway_admin"
# pg_advisory_xact_lock keys: one migrator, one log appender, one user creator, one
# writer of payer addresses at a time.
_MIGRATION_LOCK = 0x6D67_7721
_LOG_LOCK = 0x6D67_6C67
_USERS_LOCK = 0x6D67_7573
_PAYERS_LOCK = 0x6D67_7061
# pg_try_advisory_lock key (session level): the transparency log's one sequencer.
_SEQUENCER_LOCK = 0x6D67_7371
# The server ends the sequencer's session after this long without a query (a hung
# holder: its lock goes with it); the holder queries it before every integration.
_SEQUENCER_IDLE = "5s"
_SEQUENCER_TIMEOUT_S = 2.0
_LATEST_CHANGE = "SELECT n FROM admin_changes"
_TRANSIENT = frozenset({"40001", "40P01"})  # serialization failure, deadlock: safe to rerun
_RETRIES = 3
_LISTENER_PING_S = 2.0
# Tables every request rewrites rows of: a hold is inserted and deleted, a receipt queued
# for the log and dequeued, counters updated. Their dead row versions are vacuumed by
# `checkpoint` at most this often, whether autovacuum runs or not (see there).
_CHURNED = ("reservations", "log_pending", "projects", "api_keys", "month_spend", "log_tiles")
_VACUUM_EVERY_S = 10.0
_RECONNECT_S = 1.0

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


_MAX_BATCH = 64  # holds (or receipts) in one statement
B = TypeVar("B")  # an item of a batch
O = TypeVar("O")  # noqa: E741 - an item's outcome


class _HoldGone(StateConflict):
    """Settlement found no open hold to consume (GWR01)."""


async def _batch_or_each(
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


def _sorted(value: list[str] | frozenset[str] | None) -> list[str] | None:
    # Sorted as the SQLite backend stores them, so both backends answer the same lists.
    return None if value is None else sorted(value)


def _project(row: Row) -> ProjectRecord:
    allow = row["allow_models"]
    return ProjectRecord(
        id=row["id"],
        name=row["name"],
        state=row["state"],
        monthly_budget=row["monthly_budget"],
        rpm=row["rpm"],
        allow_models=None if allow is None else list(allow),
        exclude_models=list(row["exclude_models"]),
        created_at=row["created_at"],
    )


def _key(row: Row) -> KeyRecord:
    models = row["models"]
    return KeyRecord(
        id=row["id"],
        prefix=row["prefix"],
        key_hash=bytes(row["key_hash"]),
        project_id=row["project_id"],
        scopes=frozenset(row["scopes"]),
        models=None if models is None else list(models),
        monthly_limit=row["monthly_limit"],
        expires_at=row["expires_at"],
        rpm=row["rpm"],
        state=row["state"],
        created_at=row["created_at"],
    )


def _fields(row: Row, record: type[msgspec.Struct]) -> dict[str, Any]:
    """The row's columns that are fields of the record (tables may hold more)."""
    return {name: row[name] for name in record.__struct_fields__}


def _receipt(row: Row) -> ReceiptRecord:
    return ReceiptRecord(**{**_fields(row, ReceiptRecord), "usage": orjson.loads(row["usage"])})


def _leaf(row: Row) -> LogLeaf:
    return LogLeaf(**{**_fields(row, LogLeaf), "public_receipt": bytes(row["public_receipt"])})


def _instance(row: Row) -> InstanceRecord:
    return InstanceRecord(**_fields(row, InstanceRecord))


def _sandbox(row: Row) -> SandboxRecord:
    return SandboxRecord(**_fields(row, SandboxRecord))


def _tree_head(row: Row) -> TreeHeadRecord:
    return TreeHeadRecord(**_fields(row, TreeHeadRecord))


def _purchase(row: Row) -> PurchaseRecord:
    return PurchaseRecord(
        **{**_fields(row, PurchaseRecord), "token_units": int(row["token_units"])}
    )


def _key_listing(row: Row) -> KeyListing:
    return KeyListing(
        key=_key(row),
        name=row["name"],
        last_used_at=None if row["last_used_us"] is None else row["last_used_us"] // 10**6,
    )


async def _keep_session(conn: Connection) -> None:
    """Pool release hook: nothing to reset."""


def _connect_url(url: str) -> str:
    """asyncpg's DSN: `postgresql+asyncpg://` and `postgres://` are accepted too."""
    scheme, rest = url.split("://", 1)
    if scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        raise StorageError("a PostgreSQL URL looks like postgresql://user@host:5432/database")
    return f"postgresql://{rest}"


# The handles of this process, per database: a change through one bumps them all at once.
_HANDLES: dict[str, weakref.WeakSet[PostgresStorage]] = {}
_DEAF = itertools.count()  # epochs handed out while not listening: never the same twice


class PostgresStorage(Storage):
    """Every public method is one short autocommit statement (or one transaction) on a
    pooled connection, through `_run`, which reruns transient failures. Driver errors
    become StorageErrors once, in `translate_error`, called by the Storage base class."""

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
    async def open(cls, url: str) -> PostgresStorage:
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

    # --- the admin epoch -------------------------------------------------------------

    async def _listen(self) -> None:
        conn = await asyncpg.connect(
            self._dsn, server_settings={"application_name": "model-gateway-listener"}
        )
        try:
            await conn.add_listener(CHANNEL, self._on_notify)
            # Read after listening: a later change is heard, an earlier one is counted here.
            latest = await conn.fetchval(_LATEST_CHANGE)
        except BaseException:
            await conn.close()
            raise
        conn.add_termination_listener(self._on_listener_lost)
        self._listener = conn
        # Whatever changed while we were not listening is unknown: drop every cache.
        self._epoch += 1
        self._admin_applied = max(self._admin_applied, latest)

    def _on_notify(self, conn: Connection, pid: int, channel: str, payload: str) -> None:
        self._epoch += 1
        if payload.isdigit():  # the change number (migration 0009)
            self._admin_applied = max(self._admin_applied, int(payload))
        for callback in self._watchers:
            callback(self._admin_applied)

    def watch_admin(self, callback: Callable[[int], None]) -> None:
        self._watchers.append(callback)

    def catch_up_admin(self, change: int) -> None:
        if change > self._admin_applied:
            self._epoch += 1  # a change we were not told of: drop every cache
            self._admin_applied = change

    def _on_listener_lost(self, conn: Connection) -> None:
        if conn is self._listener:
            self._listener = None
            self._reconnect_soon()

    def _reconnect_soon(self) -> None:
        if self._closed or self._reconnecting is not None:
            return
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            while not self._closed and self._listener is None:
                failure = await _failure(self._listen)
                if failure is not None:
                    log.warning("admin notifications: cannot listen (%s); retrying", failure)
                    await asyncio.sleep(_RECONNECT_S)
        finally:
            self._reconnecting = None

    def _bump_process(self) -> None:
        """A change through this handle: every handle of this process sees it at once."""
        for handle in list(_HANDLES.get(self._database, ())):
            handle._epoch += 1
        self._epoch += 1

    def admin_epoch(self) -> Hashable:
        if self._listener is None:
            return ("deaf", next(_DEAF))  # cannot hear other processes: never cache
        return self._epoch

    # --- housekeeping ----------------------------------------------------------------

    async def close(self) -> None:
        await self._holds.close()
        await self._receipts.close()
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

    async def _check_listener(self) -> None:
        """A dead connection is noticed only when used: reconnect the listener if it does
        not answer."""
        listener = self._listener
        if listener is None:
            self._reconnect_soon()
            return
        failure = await _failure(
            lambda: asyncio.wait_for(listener.fetchval("SELECT 1"), _LISTENER_PING_S)
        )
        if failure is not None:
            log.warning("admin notifications: listener lost (%s); reconnecting", failure)
            listener.terminate()
            if self._listener is listener:
                self._listener = None
            self._reconnect_soon()

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

    # --- projects and keys -----------------------------------------------------------

    async def create_project(self, project: ProjectRecord) -> ProjectRecord:
        p = project
        await self._run(
            lambda c: c.execute(
                "INSERT INTO projects (id, name, state, monthly_budget, rpm, allow_models,"
                " exclude_models, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                p.id,
                p.name,
                p.state,
                p.monthly_budget,
                p.rpm,
                _sorted(p.allow_models),
                _sorted(p.exclude_models),
                p.created_at,
            )
        )
        self._bump_process()
        return project

    async def get_project(self, project_id: str) -> ProjectRecord | None:
        return await self._one(_project, "SELECT * FROM projects WHERE id = $1", project_id)

    async def archive_project(self, project_id: str) -> ProjectRecord:
        row = await self._leave_state(
            "projects", "id", project_id, ("active", "archived"), f"project {project_id}"
        )
        return _project(row)

    async def _leave_state(
        self, table: str, column: str, value: str, states: tuple[str, str], noun: str
    ) -> Row:
        """Move a row from its live state to its end state (archived, revoked) in one
        conditional statement; the second read only names the refusal."""
        live, end = states

        async def change(conn: Connection) -> Row:
            row = await conn.fetchrow(
                f"UPDATE {table} SET state = $2 WHERE {column} = $1 AND state = $3"  # noqa: S608
                " RETURNING *",
                value,
                end,
                live,
            )
            if row is None:
                if await conn.fetchval(f"SELECT 1 FROM {table} WHERE {column} = $1", value):  # noqa: S608
                    raise StateConflict(f"{noun} is already {end}")
                raise RecordNotFound(f"no {noun.split(' ', 1)[0]} {value}")
            return row

        row = await self._run(change)
        self._bump_process()
        return row

    async def create_key(self, key: KeyRecord) -> KeyRecord:
        k = key
        await self._run(
            lambda c: c.execute(
                "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, models,"
                " monthly_limit, expires_at, rpm, state, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                k.id,
                k.prefix,
                k.key_hash,
                k.project_id,
                _sorted(k.scopes),
                _sorted(k.models),
                k.monthly_limit,
                k.expires_at,
                k.rpm,
                k.state,
                k.created_at,
            )
        )
        self._bump_process()
        return key

    async def get_key(self, prefix: str) -> KeyRecord | None:
        return await self._one(_key, "SELECT * FROM api_keys WHERE prefix = $1", prefix)

    async def revoke_key(self, prefix: str) -> KeyRecord:
        row = await self._leave_state(
            "api_keys", "prefix", prefix, ("usable", "revoked"), f"key {prefix}"
        )
        return _key(row)

    # --- instances ---------------------------------------------------------------------

    async def admin_change(self) -> int:
        return int(await self._run(lambda c: c.fetchval(_LATEST_CHANGE)))

    async def renew_instance(self, instance_id: str, lease_ms: int, acked: int) -> int:
        async def renew(conn: Connection) -> int:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO instances (id, started_at, lease_until, acked)"
                    " VALUES ($1, gateway_now_ms(), gateway_now_ms() + $2, $3)"
                    " ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until,"
                    " acked = greatest(instances.acked, excluded.acked)",
                    instance_id,
                    lease_ms,
                    acked,
                )
                # After the renewal, and locked against a change committing meanwhile
                # (migration 0009 says why).
                return int(await conn.fetchval(_LATEST_CHANGE + " FOR SHARE"))

        return await self._run(renew)

    async def acknowledge_admin(self, instance_id: str, change: int) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE instances SET acked = $2 WHERE id = $1 AND acked < $2",
                instance_id,
                change,
            )
        )

    async def deregister_instance(self, instance_id: str) -> None:
        await self._run(lambda c: c.execute("DELETE FROM instances WHERE id = $1", instance_id))

    async def list_instances(self) -> list[InstanceRecord]:
        return await self._all(
            _instance,
            "SELECT id, started_at, lease_until, acked,"
            " lease_until >= gateway_now_ms() AS live FROM instances ORDER BY id",
        )

    async def forget_instances(self, expired_for_ms: int) -> int:
        status = await self._run(
            lambda c: c.execute(
                "DELETE FROM instances WHERE lease_until < gateway_now_ms() - $1", expired_for_ms
            )
        )
        return int(status.rsplit(" ", 1)[1])

    # --- money -----------------------------------------------------------------------

    async def add_credit(self, project_id: str, amount: int, month: str) -> None:
        # An unknown project fails the ledger's foreign key: RecordNotFound.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
                " VALUES ($1, 'credit', $2, $3, $4)",
                project_id,
                amount,
                month,
                now_s(),
            )
        )

    async def reserve(self, reservation: ReservationRecord) -> None:
        # The trigger `reservation_admits` locks, checks and holds, for each item of a
        # batch (migration 0015) as for a statement alone.
        await self._holds.submit(reservation)

    async def settle(self, receipt: ReceiptRecord) -> bool:
        return await self._receipts.submit(receipt)

    async def _reserve_batch(self, batch: list[ReservationRecord]) -> list[Outcome[None]]:
        async def together() -> list[Outcome[None]]:
            await self._many("gateway_reserve_many", batch)
            return [None] * len(batch)

        return await _batch_or_each(together, self._reserve_one, batch)

    async def _reserve_one(self, reservation: ReservationRecord) -> None:
        r = reservation
        await self._run(
            lambda c: c.execute(
                "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
                " lease_until, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                r.id,
                r.project_id,
                r.key_id,
                r.amount,
                r.month,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )

    async def _settle_batch(self, batch: list[ReceiptRecord]) -> list[Outcome[bool]]:
        async def together() -> list[Outcome[bool]]:
            return list(await self._many("gateway_settle_many", batch))

        return await _batch_or_each(together, self._settle_one, batch)

    async def _settle_one(self, receipt: ReceiptRecord) -> bool:
        r = receipt
        # Inserted only while its hold is open and covers the cost, in the one statement:
        # the subquery locks the hold (a concurrent settlement or release waits, then finds
        # it gone: no row, False). The trigger `receipt_consumes_hold` deletes the hold and
        # writes the charge, and refuses (GWR01) any other writer's receipt without a hold.
        status = await self._run(
            lambda c: c.execute(
                "INSERT INTO receipts (id, reservation_id, project_id, key_id, request_id,"
                " kind, endpoint, model_or_runtime, status, usage, cost, month, created_at,"
                " request_sha256, response_sha256, request_salt, response_salt,"
                " request_commitment, response_commitment, usage_source, provider)"
                " SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13,"
                " $14, $15, $16, $17, $18, $19, $20, $21"
                " WHERE EXISTS (SELECT 1 FROM reservations"
                "  WHERE id = $2 AND project_id = $3 AND amount >= $11 FOR UPDATE)",
                r.id,
                r.reservation_id,
                r.project_id,
                r.key_id,
                r.request_id,
                r.kind,
                r.endpoint,
                r.model_or_runtime,
                r.status,
                orjson.dumps(r.usage).decode(),
                r.cost,
                r.month,
                r.created_at,
                r.request_sha256,
                r.response_sha256,
                r.request_salt,
                r.response_salt,
                r.request_commitment,
                r.response_commitment,
                r.usage_source,
                r.provider,
            )
        )
        return bool(status == "INSERT 0 1")

    async def _many(
        self, function: str, batch: list[ReservationRecord] | list[ReceiptRecord]
    ) -> list[Any]:
        """One call of a batch function (migration 0015), the items sorted by project and
        key so that every batch locks rows in one order; its answers (none for a function
        without) in the batch's order."""
        order = sorted(
            range(len(batch)), key=lambda i: (batch[i].project_id, batch[i].key_id or "")
        )
        payload = msgspec.json.encode([batch[i] for i in order]).decode()
        sorted_answers = await self._run(
            lambda c: c.fetchval(f"SELECT {function}($1::jsonb)", payload)
        )
        answers: list[Any] = [None] * len(sorted_answers or ())
        for position, i in enumerate(order[: len(answers)]):
            answers[i] = sorted_answers[position]
        return answers

    async def release(self, reservation_id: str) -> None:
        await self._run(
            lambda c: c.execute("DELETE FROM reservations WHERE id = $1", reservation_id)
        )

    async def renew_leases(self, owner: str, lease_until: int) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET lease_until = $1 WHERE owner = $2", lease_until, owner
            )
        )

    async def release_abandoned(self, owner_alive: Callable[[str], bool | None]) -> int:
        now = now_s()

        async def sweep(conn: Connection) -> int:
            owners = await conn.fetch("SELECT DISTINCT owner FROM reservations")
            dead = [row["owner"] for row in owners if owner_alive(row["owner"]) is False]
            rows = await conn.fetch(
                "SELECT id, owner FROM reservations WHERE lease_until < $1 OR owner = ANY($2)",
                now,
                dead,
            )
            released = 0
            for row in rows:
                # One hold per statement, its condition checked again under the row lock (a
                # hold settled or renewed meanwhile stays). One at a time, so that two
                # sweepers never lock several projects in different orders.
                status = await conn.execute(
                    "DELETE FROM reservations"
                    " WHERE id = $1 AND (lease_until < $2 OR owner = ANY($3))",
                    row["id"],
                    now,
                    dead,
                )
                released += int(status.rsplit(" ", 1)[1])
            return released

        return await self._run(sweep)

    async def project_account(self, project_id: str, month: str) -> Account:
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved, p.leased, COALESCE(m.spent, 0) AS spent,"
                " (SELECT COALESCE(SUM(LEAST(in_use, amount)), 0) FROM reservations"
                "  WHERE project_id = p.id AND lease) AS in_use"
                " FROM projects p"
                " LEFT JOIN month_spend m ON m.subject = p.id AND m.month = $1 WHERE p.id = $2",
                month,
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return account(row)

    async def key_month_spend(self, key_id: str, month: str) -> int:
        spent = await self._run(
            lambda c: c.fetchval(
                "SELECT spent FROM month_spend WHERE subject = $1 AND month = $2", key_id, month
            )
        )
        return 0 if spent is None else int(spent)

    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        return await self._one(_receipt, "SELECT * FROM receipts WHERE id = $1", receipt_id)

    async def audit(self, project_id: str, month: str) -> Audit:
        # One statement: one snapshot, so the counters and the sums are of the same moment.
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved,"
                " (SELECT COALESCE(SUM(CASE kind WHEN 'credit' THEN amount ELSE -amount END), 0)"
                "  FROM ledger WHERE project_id = p.id)::bigint AS ledger_sum,"
                " (SELECT COALESCE(SUM(amount), 0) FROM reservations"
                "  WHERE project_id = p.id)::bigint AS held,"
                " (SELECT COALESCE(SUM(spent), 0) FROM month_spend"
                "  WHERE subject = p.id AND month = $1)::bigint AS month_spend,"
                " (SELECT COALESCE(SUM(amount), 0) FROM ledger"
                "  WHERE project_id = p.id AND kind = 'charge' AND month = $1)::bigint"
                "  AS month_charges"
                " FROM projects p WHERE p.id = $2",
                month,
                project_id,
            )
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

    # --- sandboxes -------------------------------------------------------------------

    async def create_sandbox(self, sandbox: SandboxRecord) -> SandboxRecord:
        b = sandbox
        # An unknown project fails the foreign key: RecordNotFound.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO sandboxes (id, project_id, runtime, timeout_s, memory_mb, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                b.id,
                b.project_id,
                b.runtime,
                b.timeout_s,
                b.memory_mb,
                b.created_at,
            )
        )
        return sandbox

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        return await self._one(
            _sandbox,
            "SELECT id, project_id, runtime, timeout_s, memory_mb, created_at"
            " FROM sandboxes WHERE id = $1",
            sandbox_id,
        )

    # --- the transparency log --------------------------------------------------------

    async def unlogged_receipts(self, limit: int) -> list[ReceiptRecord]:
        # log_pending holds exactly the receipts in neither log_leaves nor log_entries
        # (their triggers take them out), in issue order.
        return await self._all(
            _receipt,
            "SELECT r.* FROM log_pending q JOIN receipts r ON r.id = q.receipt_id"
            " ORDER BY q.seq LIMIT $1",
            limit,
        )

    async def unlogged_receipt_ids(self, limit: int) -> list[tuple[str, int]]:
        return await self._all(
            lambda row: (row["receipt_id"], row["created_at"]),
            "SELECT q.receipt_id, r.created_at FROM log_pending q"
            " JOIN receipts r ON r.id = q.receipt_id ORDER BY q.seq LIMIT $1",
            limit,
        )

    async def skip_unloggable(self, receipt_ids: list[str]) -> None:
        # The queue would hold them forever, ahead of every follower's look.
        await self._run(
            lambda c: c.execute(
                "DELETE FROM log_pending WHERE receipt_id = ANY($1::text[])", receipt_ids
            )
        )

    async def log_leaves(self, start: int = 0, limit: int | None = None) -> list[LogLeaf]:
        return await self._all(
            _leaf,
            "SELECT leaf_index, receipt_id, public_receipt, signature FROM log_leaves"
            " WHERE leaf_index >= $1 ORDER BY leaf_index LIMIT $2",
            start,
            limit,
        )

    async def log_leaf(self, receipt_id: str) -> LogLeaf | None:
        return await self._one(
            _leaf,
            "SELECT leaf_index, receipt_id, public_receipt, signature FROM log_leaves"
            " WHERE receipt_id = $1",
            receipt_id,
        )

    async def append_log_tiles(
        self, entries: list[LogEntry], tiles: list[LogTile], head: TreeHeadRecord | None
    ) -> None:
        async def append(conn: Connection) -> None:
            async with conn.transaction():
                # One integrator at a time (no lock-order deadlock between tile upserts);
                # a writer that raced us then fails on the entries' keys, before the tiles.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOG_LOCK)
                if head is not None:
                    # Compare-and-set on the tree size: a stale sequencer (one that paused
                    # and lost its lock) cannot fork the log or leave a gap in it.
                    stored = await conn.fetchval("SELECT coalesce(max(size), 0) FROM tree_heads")
                    if stored != head.size - len(entries):
                        raise StateConflict(
                            f"PostgreSQL append_log_tiles: the log is at size {stored},"
                            f" this append continues size {head.size - len(entries)}"
                        )
                await conn.execute(
                    "INSERT INTO log_entries (leaf_index, receipt_id)"
                    " SELECT * FROM unnest($1::bigint[], $2::text[])",
                    [e.leaf_index for e in entries],
                    [e.receipt_id for e in entries],
                )
                # The log_tiles_only_grow trigger refuses an update that is not an append.
                await conn.execute(
                    "INSERT INTO log_tiles (level, idx, hashes)"
                    " SELECT * FROM unnest($1::integer[], $2::bigint[], $3::bytea[])"
                    " ON CONFLICT (level, idx) DO UPDATE SET hashes = EXCLUDED.hashes",
                    [t.level for t in tiles],
                    [t.index for t in tiles],
                    [t.hashes for t in tiles],
                )
                if head is not None:
                    await conn.execute(
                        "INSERT INTO tree_heads (size, root_hash, timestamp, key_id, signature)"
                        " VALUES ($1, $2, $3, $4, $5)",
                        head.size,
                        head.root_hash,
                        head.timestamp,
                        head.key_id,
                        head.signature,
                    )

        await self._run(append)

    async def log_tiles(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        wanted = sorted(set(keys))
        rows = await self._run(
            lambda c: c.fetch(
                "SELECT t.level, t.idx, t.hashes FROM log_tiles t"
                " JOIN unnest($1::integer[], $2::bigint[]) AS k (level, idx)"
                " ON t.level = k.level AND t.idx = k.idx",
                [level for level, _ in wanted],
                [index for _, index in wanted],
            )
        )
        return {(row["level"], row["idx"]): bytes(row["hashes"]) for row in rows}

    async def log_entry_index(self, receipt_id: str) -> int | None:
        index = await self._run(
            lambda c: c.fetchval(
                "SELECT leaf_index FROM log_entries WHERE receipt_id = $1", receipt_id
            )
        )
        return None if index is None else int(index)

    async def log_entry_receipts(self, start: int, end: int) -> list[tuple[int, ReceiptRecord]]:
        return await self._all(
            lambda row: (int(row["log_leaf_index"]), _receipt(row)),
            "SELECT e.leaf_index AS log_leaf_index, r.* FROM log_entries e"
            " JOIN receipts r ON r.id = e.receipt_id"
            " WHERE e.leaf_index >= $1 AND e.leaf_index < $2 ORDER BY e.leaf_index",
            start,
            end,
        )

    async def tree_head(self, size: int | None = None) -> TreeHeadRecord | None:
        if size is None:
            return await self._one(
                _tree_head, "SELECT * FROM tree_heads ORDER BY size DESC LIMIT 1"
            )
        return await self._one(_tree_head, "SELECT * FROM tree_heads WHERE size = $1", size)

    # --- the log's sequencer -----------------------------------------------------------

    async def claim_log_sequencer(self) -> bool:
        """A session advisory lock, on a connection of its own: held while that session
        lives. It ends, and frees the lock, when the process dies (its socket closes) or
        hangs (the server ends a session idle for `_SEQUENCER_IDLE`; the holder queries it
        on every call). A lock rather than a lease row: a dead holder's lock is free at
        once, and no clock or expiry is involved. A call that fails drops the connection
        (and the lock with it): the next call starts a new session and tries again."""

        async def claim() -> None:
            if self._sequencer is None or self._sequencer.is_closed():
                self._sequencing = False
                self._sequencer = await asyncpg.connect(
                    self._dsn,
                    server_settings={
                        "application_name": "model-gateway-sequencer",
                        "idle_session_timeout": _SEQUENCER_IDLE,
                    },
                )
            if self._sequencing:  # the session is alive, so the lock is still ours
                await self._sequencer.fetchval("SELECT 1")
            else:
                self._sequencing = await self._sequencer.fetchval(
                    "SELECT pg_try_advisory_lock($1)", _SEQUENCER_LOCK
                )

        failure = await _failure(lambda: asyncio.wait_for(claim(), _SEQUENCER_TIMEOUT_S))
        if failure is not None:
            log.warning("log sequencer lock: %s; starting a new session", failure)
            self._drop_sequencer()
        return self._sequencing

    def _drop_sequencer(self) -> None:
        """Close the lock's session (the server frees the lock when its socket closes)."""
        conn, self._sequencer, self._sequencing = self._sequencer, None, False
        if conn is not None:
            conn.terminate()

    # --- the console -----------------------------------------------------------------

    async def create_user(self, user: UserRecord, role: str | None) -> UserRecord:
        async def create(conn: Connection) -> str:
            async with conn.transaction():
                # Two first users at once: one is the owner, the other a member.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _USERS_LOCK)
                chosen = role
                if chosen is None:
                    chosen = (
                        "member" if await conn.fetchval("SELECT 1 FROM users LIMIT 1") else "owner"
                    )
                # An email taken (case-insensitively) fails the unique index: StateConflict.
                await conn.execute(
                    "INSERT INTO users (id, email, password_hash, role, disabled, created_at)"
                    " VALUES ($1, $2, $3, $4, false, $5)",
                    user.id,
                    user.email,
                    user.password_hash,
                    chosen,
                    user.created_at,
                )
                return chosen

        return msgspec.structs.replace(user, role=await self._run(create))

    async def get_user(self, email: str) -> UserRecord | None:
        return await self._one(_user, "SELECT * FROM users WHERE lower(email) = lower($1)", email)

    async def list_users(self) -> list[UserRecord]:
        return await self._all(_user, "SELECT * FROM users ORDER BY seq")

    async def disable_user(self, email: str) -> UserRecord:
        async def disable(conn: Connection) -> Row:
            async with conn.transaction():
                row = await conn.fetchrow(
                    "UPDATE users SET disabled = true WHERE lower(email) = lower($1) RETURNING *",
                    email,
                )
                if row is None:
                    raise RecordNotFound(f"no user {email}")
                await conn.execute("DELETE FROM sessions WHERE user_id = $1", row["id"])
                return row

        return _user(await self._run(disable))

    async def grant_project(self, email: str, project_id: str) -> None:
        async def grant(conn: Connection) -> None:
            user_id = await conn.fetchval(
                "SELECT id FROM users WHERE lower(email) = lower($1)", email
            )
            if user_id is None:
                raise RecordNotFound(f"no user {email}")
            if not await conn.fetchval("SELECT 1 FROM projects WHERE id = $1", project_id):
                raise RecordNotFound(f"no project {project_id}")
            await conn.execute(
                "INSERT INTO grants (user_id, project_id, created_at) VALUES ($1, $2, $3)"
                " ON CONFLICT DO NOTHING",
                user_id,
                project_id,
                now_s(),
            )

        await self._run(grant)

    async def granted_projects(self, user_id: str) -> set[str]:
        rows = await self._run(
            lambda c: c.fetch("SELECT project_id FROM grants WHERE user_id = $1", user_id)
        )
        return {row["project_id"] for row in rows}

    async def create_session(self, id_hash: bytes, user_id: str, now: int) -> None:
        await self._run(
            lambda c: c.execute(
                "INSERT INTO sessions (id_hash, user_id, created_at, seen_at)"
                " VALUES ($1, $2, $3, $3)",
                id_hash,
                user_id,
                now,
            )
        )

    async def session_user(self, id_hash: bytes, idle_since: int) -> UserRecord | None:
        return await self._one(
            _user,
            "SELECT u.* FROM sessions s JOIN users u ON u.id = s.user_id"
            " WHERE s.id_hash = $1 AND s.seen_at >= $2 AND NOT u.disabled",
            id_hash,
            idle_since,
        )

    async def touch_session(self, id_hash: bytes, now: int) -> None:
        await self._run(
            lambda c: c.execute("UPDATE sessions SET seen_at = $1 WHERE id_hash = $2", now, id_hash)
        )

    async def delete_session(self, id_hash: bytes) -> None:
        await self._run(lambda c: c.execute("DELETE FROM sessions WHERE id_hash = $1", id_hash))

    async def purge_console(self, sessions_seen_before: int, failures_before: int) -> None:
        async def purge(conn: Connection) -> None:
            await conn.execute("DELETE FROM sessions WHERE seen_at < $1", sessions_seen_before)
            await conn.execute("DELETE FROM login_failures WHERE at < $1", failures_before)

        await self._run(purge)

    async def record_login_failure(self, subjects: list[str], now: int) -> None:
        await self._run(
            lambda c: c.execute(
                "INSERT INTO login_failures (subject, at) SELECT s, $2 FROM unnest($1::text[]) s",
                subjects,
                now,
            )
        )

    async def login_failures(self, subject: str, since: int) -> list[int]:
        return await self._all(
            lambda row: int(row["at"]),
            "SELECT at FROM login_failures WHERE subject = $1 AND at >= $2 ORDER BY at",
            subject,
            since,
        )

    async def clear_login_failures(self, subject: str) -> None:
        await self._run(
            lambda c: c.execute("DELETE FROM login_failures WHERE subject = $1", subject)
        )

    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        return await self._all(
            _project,
            "SELECT * FROM projects WHERE $1::text[] IS NULL OR id = ANY($1)"
            " ORDER BY created_at DESC, seq DESC",
            None if ids is None else sorted(ids),
        )

    async def update_project(self, project_id: str, changes: dict[str, object]) -> ProjectRecord:
        columns = ("monthly_budget", "rpm", "allow_models", "exclude_models")
        row = await self._update_row("projects", "id", project_id, "active", columns, changes)
        return _project(row)

    async def update_key(self, prefix: str, changes: dict[str, object]) -> KeyRecord:
        columns = ("name", "models", "monthly_limit", "expires_at", "rpm")
        row = await self._update_row("api_keys", "prefix", prefix, "usable", columns, changes)
        return _key(row)

    async def _update_row(
        self,
        table: str,
        id_column: str,
        value: str,
        live_state: str,
        columns: tuple[str, ...],
        changes: dict[str, object],
    ) -> Row:
        """Change the given columns of a row still in its live state, in one conditional
        statement; bump the admin epoch (cached keys carry their limits and model policy)."""
        unknown = set(changes) - set(columns)
        if unknown:
            raise StorageError(f"cannot change {', '.join(sorted(unknown))}")
        values = [
            _sorted(new) if name.endswith("models") else new  # type: ignore[arg-type]
            for name, new in changes.items()
        ]
        noun = table.rstrip("s").replace("api_", "")
        # Column and table names come from the fixed tuples above, never from a caller.
        assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(changes, start=3))
        update = (
            f"UPDATE {table} SET {assignments} WHERE {id_column} = $1 AND state = $2"  # noqa: S608
            " RETURNING *"
            if changes
            else f"SELECT * FROM {table} WHERE {id_column} = $1 AND state = $2"  # noqa: S608
        )

        async def change(conn: Connection) -> Row:
            row = await conn.fetchrow(update, value, live_state, *values)
            if row is None:
                state = await conn.fetchval(
                    f"SELECT state FROM {table} WHERE {id_column} = $1",  # noqa: S608
                    value,
                )
                if state is None:
                    raise RecordNotFound(f"no {noun} {value}")
                raise StateConflict(f"{noun} {value} is {state}")
            return row

        row = await self._run(change)
        if changes:
            self._bump_process()
        return row

    async def list_keys(self, project_id: str) -> list[KeyListing]:
        return await self._all(
            _key_listing,
            "SELECT k.*, (SELECT max(r.created_at) FROM receipts r WHERE r.key_id = k.id)"
            " AS last_used_us FROM api_keys k WHERE k.project_id = $1"
            " ORDER BY k.created_at DESC, k.seq DESC",
            project_id,
        )

    async def usage(
        self, project_id: str, start_us: int, end_us: int, group_by: str
    ) -> list[dict[str, object]]:
        group = {
            "day": "to_char(to_timestamp(r.created_at / 1000000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            "model": "r.model_or_runtime",
            "key": "k.prefix",
        }[group_by]
        return await self._all(
            lambda row: {**dict(row), "group": row["grp"]},
            f"SELECT {group} AS grp, count(*) AS requests,"  # noqa: S608 (a fixed expression)
            " COALESCE(SUM((r.usage ->> 'input_tokens')::bigint), 0)::bigint"
            "  AS input_tokens,"
            " COALESCE(SUM((r.usage ->> 'output_tokens')::bigint), 0)::bigint"
            "  AS output_tokens,"
            " COALESCE(SUM(CASE r.kind WHEN 'sandbox'"
            "  THEN (r.usage ->> 'duration_ms')::bigint END), 0)::bigint AS sandbox_ms,"
            " SUM(r.cost)::bigint AS cost"
            " FROM receipts r LEFT JOIN api_keys k ON k.id = r.key_id"
            " WHERE r.project_id = $1 AND r.created_at >= $2 AND r.created_at < $3"
            " GROUP BY grp ORDER BY grp",
            project_id,
            start_us,
            end_us,
        )

    async def list_receipts(
        self, project_id: str, limit: int, before: int | None
    ) -> list[tuple[int, ReceiptRecord]]:
        return await self._all(
            lambda row: (int(row["seq"]), _receipt(row)),
            "SELECT * FROM receipts WHERE project_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
            project_id,
            2**63 - 1 if before is None else before,
            limit,
        )

    async def list_ledger(
        self, project_id: str, limit: int, before: int | None
    ) -> list[LedgerEntry]:
        return await self._all(
            ledger_entry,
            "SELECT l.id, l.kind, l.amount, l.key_id, l.receipt_id, l.created_at,"
            " p.reference, u.tx_hash FROM ledger l"
            " LEFT JOIN payments p ON p.ledger_id = l.id"
            " LEFT JOIN purchases u ON u.ledger_id = l.id"
            " WHERE l.project_id = $1 AND l.id < $2 ORDER BY l.id DESC LIMIT $3",
            project_id,
            2**63 - 1 if before is None else before,
            limit,
        )

    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        return await self._all(
            _sandbox,
            "SELECT * FROM sandboxes WHERE project_id = $1 ORDER BY created_at DESC, seq DESC",
            project_id,
        )

    @staticmethod
    async def _credit_once(
        conn: Connection,
        project_id: str,
        amount: int,
        month: str,
        created_at: int,
        seen: tuple[str, tuple[object, ...]],
        conflict: str,
    ) -> int:
        """A credit entry for money that arrived once (a payment, a purchase), inside the
        caller's transaction; StateConflict when the `seen` query finds it recorded. Two
        writers racing past that check meet at the unique key of the caller's next insert:
        the loser's transaction, its credit included, fails whole (StateConflict)."""
        if not await conn.fetchval("SELECT 1 FROM projects WHERE id = $1", project_id):
            raise RecordNotFound(f"no project {project_id}")
        if await conn.fetchval(seen[0], *seen[1]):
            raise StateConflict(conflict)
        ledger_id: int = await conn.fetchval(
            "INSERT INTO ledger (project_id, kind, amount, month, created_at)"
            " VALUES ($1, 'credit', $2, $3, $4) RETURNING id",
            project_id,
            amount,
            month,
            created_at,
        )
        return ledger_id

    async def record_payment(self, payment: PaymentRecord) -> PaymentRecord:
        p = payment

        async def record(conn: Connection) -> None:
            async with conn.transaction():
                ledger_id = await self._credit_once(
                    conn,
                    p.project_id,
                    p.amount,
                    p.month,
                    p.created_at,
                    (
                        "SELECT 1 FROM payments WHERE project_id = $1 AND reference = $2",
                        (p.project_id, p.reference),
                    ),
                    f"payment {p.reference!r} is already recorded",
                )
                await conn.execute(
                    "INSERT INTO payments (id, project_id, reference, amount, ledger_id,"
                    " recorded_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    p.id,
                    p.project_id,
                    p.reference,
                    p.amount,
                    ledger_id,
                    p.recorded_by,
                    p.created_at,
                )

        await self._run(record)
        return payment

    async def payer_addresses(self, project_id: str) -> list[str]:
        return await self._all(
            itemgetter("address"),
            "SELECT address FROM payer_addresses WHERE project_id = $1 ORDER BY address",
            project_id,
        )

    async def set_payer_addresses(self, project_id: str, addresses: list[str]) -> None:
        async def replace(conn: Connection) -> None:
            async with conn.transaction():
                # The project row's lock orders concurrent replacements: the last one wins whole.
                state = await conn.fetchval(
                    "SELECT state FROM projects WHERE id = $1 FOR NO KEY UPDATE", project_id
                )
                if state is None:
                    raise RecordNotFound(f"no project {project_id}")
                if state != "active":
                    raise StateConflict(f"project {project_id} is archived")
                # One writer at a time, so this check sees every address registered before
                # and refuses clearly; the unique constraint (migration 0016) is the rule.
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _PAYERS_LOCK)
                taken = await conn.fetchval(
                    "SELECT min(address) FROM payer_addresses"
                    " WHERE address = ANY($2::text[]) AND project_id <> $1",
                    project_id,
                    addresses,
                )
                if taken is not None:
                    raise PayerAddressTaken(taken)
                await conn.execute("DELETE FROM payer_addresses WHERE project_id = $1", project_id)
                await conn.execute(
                    "INSERT INTO payer_addresses (project_id, address)"
                    " SELECT $1, a FROM unnest($2::text[]) a"
                    " ON CONFLICT (project_id, address) DO NOTHING",  # a repeated address
                    project_id,
                    addresses,
                )

        await self._run(replace)

    async def get_purchase(self, tx_hash: str) -> PurchaseRecord | None:
        return await self._one(
            _purchase,
            "SELECT u.*, l.month FROM purchases u JOIN ledger l ON l.id = u.ledger_id"
            " WHERE u.tx_hash = $1",
            tx_hash,
        )

    async def record_purchase(self, purchase: PurchaseRecord) -> PurchaseRecord:
        p = purchase

        async def record(conn: Connection) -> None:
            async with conn.transaction():
                ledger_id = await self._credit_once(
                    conn,
                    p.project_id,
                    p.amount,
                    p.month,
                    p.created_at,
                    ("SELECT 1 FROM purchases WHERE tx_hash = $1", (p.tx_hash,)),
                    f"transaction {p.tx_hash} is already credited",
                )
                await conn.execute(
                    "INSERT INTO purchases (tx_hash, project_id, sender, token_units, amount,"
                    " ledger_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    p.tx_hash,
                    p.project_id,
                    p.sender,
                    str(p.token_units),
                    p.amount,
                    ledger_id,
                    p.created_at,
                )

        await self._run(record)
        return purchase

    async def limit_figures(
        self, project_id: str, key_id: str | None, month: str
    ) -> dict[str, int | None]:
        # One statement: every figure of the same moment.
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.balance, p.reserved, p.monthly_budget,"
                " COALESCE((SELECT spent FROM month_spend WHERE subject = p.id AND month = $1),"
                "  0) AS month_spend,"
                " k.monthly_limit AS key_monthly_limit, k.reserved AS key_reserved,"
                " COALESCE((SELECT spent FROM month_spend WHERE subject = k.id AND month = $1),"
                "  0) AS key_month_spend"
                " FROM projects p LEFT JOIN api_keys k ON k.id = $2 WHERE p.id = $3",
                month,
                key_id,
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return dict(row)

    # --- hosted agents: the money moves in triggers (migrations/postgres/0005_agents.sql)

    async def create_agent(self, agent: AgentRecord) -> AgentRecord:
        a = agent
        # An unknown project fails the foreign key: RecordNotFound.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agents (id, project_id, name, model, instructions, tools,"
                " sandbox_id, max_steps, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                a.id,
                a.project_id,
                a.name,
                a.model,
                a.instructions,
                orjson.dumps(a.tools).decode(),
                a.sandbox_id,
                a.max_steps,
                a.created_at,
            )
        )
        return agent

    async def get_agent(self, agent_id: str) -> AgentRecord | None:
        return await self._one(_agent, "SELECT * FROM agents WHERE id = $1", agent_id)

    async def list_agents(self, project_id: str) -> list[AgentRecord]:
        return await self._all(
            _agent, "SELECT * FROM agents WHERE project_id = $1 ORDER BY created_at, id", project_id
        )

    async def create_run(self, run: RunRecord) -> RunRecord:
        r = run
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agent_runs (id, agent_id, project_id, input, budget, owner,"
                " lease_until, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                r.id,
                r.agent_id,
                r.project_id,
                r.input,
                r.budget,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )
        return run

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._one(_agent_run, "SELECT * FROM agent_runs WHERE id = $1", run_id)

    async def list_runs(self, agent_id: str, limit: int = 50) -> list[RunRecord]:
        return await self._all(
            _agent_run,
            "SELECT * FROM agent_runs WHERE agent_id = $1"
            " ORDER BY created_at DESC, id DESC LIMIT $2",
            agent_id,
            limit,
        )

    async def run_steps(self, run_id: str) -> list[StepRecord]:
        return await self._all(
            _step, "SELECT * FROM agent_steps WHERE run_id = $1 ORDER BY seq", run_id
        )

    async def begin_step(self, step: StepRecord) -> None:
        s = step
        # The trigger `agent_step_admits` locks the run, checks and holds in this statement.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO agent_steps (run_id, seq, kind, subject, hold, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                s.run_id,
                s.seq,
                s.kind,
                s.subject,
                s.hold,
                s.created_at,
            )
        )

    async def drop_step(self, run_id: str, seq: int) -> None:
        await self._run(
            lambda c: c.execute(
                "DELETE FROM agent_steps WHERE run_id = $1 AND seq = $2 AND state = 'in_flight'"
                " AND reservation_id IS NULL",
                run_id,
                seq,
            )
        )

    async def attach_step_hold(self, run_id: str, seq: int, reservation_id: str) -> None:
        await self._run(
            lambda c: c.execute(
                "UPDATE agent_steps SET reservation_id = $1 WHERE run_id = $2 AND seq = $3",
                reservation_id,
                run_id,
                seq,
            )
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
        await self._run(
            lambda c: c.execute(
                "UPDATE agent_steps SET input_tokens = $1, output_tokens = $2, duration_ms = $3,"
                " error = $4, state = CASE state WHEN 'in_flight' THEN 'released' ELSE state END,"
                " closed_at = $5 WHERE run_id = $6 AND seq = $7",
                input_tokens,
                output_tokens,
                duration_ms,
                _json_or_none(error),
                now_s(),
                run_id,
                seq,
            )
        )

    async def finish_run(
        self, run_id: str, status: str, output: str | None, error: dict[str, object] | None
    ) -> bool:
        # The status change releases the run's holds in flight (trigger agent_run_ends).
        ended = await self._run(
            lambda c: c.execute(
                "UPDATE agent_runs SET status = $1, output = $2, error = $3, finished_at = $4"
                " WHERE id = $5 AND status = 'running'",
                status,
                output,
                _json_or_none(error),
                now_s(),
                run_id,
            )
        )
        return bool(ended == "UPDATE 1")

    async def request_cancel(self, run_id: str) -> RunRecord:
        async def flag(conn: Connection) -> Row:
            row = await conn.fetchrow(
                "UPDATE agent_runs SET cancel_requested = true"
                " WHERE id = $1 AND status = 'running' RETURNING *",
                run_id,
            )
            if row is None:
                status = await conn.fetchval("SELECT status FROM agent_runs WHERE id = $1", run_id)
                if status is None:
                    raise RecordNotFound(f"no run {run_id}")
                raise StateConflict(f"run {run_id} has already ended ({status})")
            return row

        return _agent_run(await self._run(flag))

    async def renew_run_leases(self, owner: str, lease_until: int) -> list[str]:
        rows = await self._run(
            lambda c: c.fetch(
                "UPDATE agent_runs SET lease_until = $1 WHERE owner = $2 AND status = 'running'"
                " RETURNING id, cancel_requested",
                lease_until,
                owner,
            )
        )
        return sorted(row["id"] for row in rows if row["cancel_requested"])

    async def _fail_run(
        self, run_id: str, owner_dead: bool, now: int, error: dict[str, object]
    ) -> bool:
        """Fail a run still running and still abandoned, judged under its row lock: a run
        renewed or ended meanwhile stays as it is. Its end releases its holds in flight."""
        ended = await self._run(
            lambda c: c.execute(
                "UPDATE agent_runs SET status = 'failed', error = $1, finished_at = $2"
                " WHERE id = $3 AND status = 'running' AND (lease_until < $2 OR $4)",
                _json_or_none(error),
                now,
                run_id,
                owner_dead,
            )
        )
        return bool(ended == "UPDATE 1")

    async def fail_abandoned_runs(
        self, owner_alive: Callable[[str], bool | None], error: dict[str, object]
    ) -> list[str]:
        rows = await self._run(
            lambda c: c.fetch(
                "SELECT id, owner, lease_until FROM agent_runs WHERE status = 'running'"
            )
        )
        now = now_s()
        # Owners are checked once each: /proc reads, not one per run.
        alive = {row["owner"]: owner_alive(row["owner"]) for row in rows}
        abandoned = [
            (row["id"], alive[row["owner"]] is False)
            for row in rows
            if row["lease_until"] < now or alive[row["owner"]] is False
        ]
        failed = []
        for run_id, dead in abandoned:
            if await self._fail_run(run_id, dead, now, error):
                failed.append(run_id)
        return failed

    # -- Leases (migrations/postgres/0012_leases.sql): each write one autocommit statement

    async def grant_lease(self, lease: ReservationRecord) -> None:
        r = lease
        # The trigger `reservation_admits` locks, checks and holds, as for any hold.
        await self._run(
            lambda c: c.execute(
                "INSERT INTO reservations (id, project_id, key_id, amount, month, owner,"
                " lease_until, created_at, lease) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, true)",
                r.id,
                r.project_id,
                r.key_id,
                r.amount,
                r.month,
                r.owner,
                r.lease_until,
                r.created_at,
            )
        )

    async def return_lease(self, lease_id: str, amount: int) -> bool:
        status = await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET amount = amount - $2, recalled = false"
                " WHERE id = $1 AND lease AND amount >= $2",
                lease_id,
                amount,
            )
        )
        return bool(status == "UPDATE 1")

    async def mark_in_use(self, uses: list[tuple[str, int]]) -> None:
        await self._run(
            lambda c: c.executemany(
                "UPDATE reservations SET in_use = $2 WHERE id = $1 AND lease", uses
            )
        )

    async def recall_leases(self, project_id: str, owner: str) -> int:
        status = await self._run(
            lambda c: c.execute(
                "UPDATE reservations SET recalled = true"
                " WHERE project_id = $1 AND lease AND owner <> $2 AND NOT recalled",
                project_id,
                owner,
            )
        )
        return int(status.rsplit(" ", 1)[1])

    async def pending_recalls(self, project_id: str, owner: str) -> int:
        pending = await self._run(
            lambda c: c.fetchval(
                "SELECT count(*) FROM reservations"
                " WHERE project_id = $1 AND lease AND owner <> $2 AND recalled",
                project_id,
                owner,
            )
        )
        return int(pending)

    async def recalled_leases(self, owner: str) -> list[str]:
        return await self._all(
            itemgetter("id"),
            "SELECT id FROM reservations WHERE owner = $1 AND lease AND recalled",
            owner,
        )

    async def lease_audit(self, project_id: str) -> tuple[int, int]:
        row = await self._run(
            lambda c: c.fetchrow(
                "SELECT p.leased, (SELECT COALESCE(SUM(amount), 0) FROM reservations"
                "  WHERE project_id = p.id AND lease)::bigint AS held"
                " FROM projects p WHERE p.id = $1",
                project_id,
            )
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return int(row["leased"]), int(row["held"])

    # --- requests per minute, shared by every instance (migration 0008) ---------------

    async def take_rate_limits(
        self, buckets: list[tuple[str, int]], at_us: int | None = None
    ) -> int:
        """Take one request from every (name, rpm) bucket or from none, in one statement on
        the database's clock (`at_us`: a given time instead, for tests): 0, or the whole
        seconds to wait."""
        names = [name for name, _ in buckets]
        rpms = [rpm for _, rpm in buckets]
        wait = await self._run(
            lambda c: c.fetchval("SELECT rate_limit_take($1, $2, $3::BIGINT)", names, rpms, at_us)
        )
        return int(wait)

    async def prune_rate_limits(self) -> int:
        """Delete buckets whose arrival time is past (the same as no row); rows a request
        holds are skipped, never waited for. Returns how many went."""
        status = await self._run(
            lambda c: c.execute(
                "DELETE FROM rate_limits WHERE bucket IN (SELECT bucket FROM rate_limits"
                " WHERE tat < (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT"
                " FOR UPDATE SKIP LOCKED)"
            )
        )
        return int(status.split()[-1])


def _user(row: Row) -> UserRecord:
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


def _agent(row: Row) -> AgentRecord:
    return AgentRecord(**{**_fields(row, AgentRecord), "tools": orjson.loads(row["tools"])})


def _agent_run(row: Row) -> RunRecord:
    fields = _fields(row, RunRecord)
    fields["cancel_requested"] = bool(fields["cancel_requested"])
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return RunRecord(**fields)


def _step(row: Row) -> StepRecord:
    fields = _fields(row, StepRecord)
    fields["error"] = None if row["error"] is None else orjson.loads(row["error"])
    return StepRecord(**fields)
