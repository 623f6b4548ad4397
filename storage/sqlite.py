"""The embedded backend: one SQLite file in WAL mode through aiosqlite.

One gateway process per database file: several processes may read and administer it
(the CLI does), but the metering counters assume a single serving process. Use the
PostgreSQL backend for several gateway instances.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

import aiosqlite
import orjson

from storage.base import (
    Account,
    Audit,
    KeyRecord,
    LimitReached,
    LogLeaf,
    ProjectRecord,
    ReceiptRecord,
    RecordNotFound,
    ReservationRecord,
    SandboxRecord,
    StateConflict,
    Storage,
    StorageError,
    TreeHeadRecord,
    now_s,
)
from storage.group_commit import GroupCommitWriter

_LIMIT_REASONS = frozenset({"budget_exceeded", "insufficient_balance"})

_PREFIX = "sqlite:///"


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files("storage") / "migrations" / "sqlite"
    scripts = sorted(p for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(int(p.name.split("_", 1)[0]), p.read_text()) for p in scripts]


def _statements(script: str):
    """Split a migration into statements the way SQLite's own tokenizer sees them."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            yield pending.strip()
            pending = ""


def _json_list(value: list[str] | frozenset[str] | None) -> str | None:
    return None if value is None else orjson.dumps(sorted(value)).decode()


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
        tmp.write_bytes(os.urandom(8))
        os.replace(tmp, self.path)


_WAL_SIZE_LIMIT = 64 * 2**20  # a restarted WAL is truncated back to this

_PRAGMAS = (
    "journal_mode = WAL",
    "synchronous = NORMAL",  # durable at checkpoints; safe from corruption in WAL
    "foreign_keys = ON",
    "busy_timeout = 5000",
    f"journal_size_limit = {_WAL_SIZE_LIMIT}",
)


class SQLiteStorage(Storage):
    """Reads and multi-statement admin changes go through aiosqlite; the single-statement
    writes of the request path (holds, settlements) through a group-commit writer."""

    def __init__(self, conn: aiosqlite.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path
        self._epoch = AdminEpoch(path)
        # aiosqlite shares one connection: a transaction must not interleave with another's.
        self._write_lock = asyncio.Lock()
        self._writer = GroupCommitWriter(path, _PRAGMAS)

    @classmethod
    async def open(cls, url: str) -> SQLiteStorage:
        if not url.startswith(_PREFIX):
            raise StorageError(
                "a SQLite URL looks like sqlite:///relative/path or sqlite:////abs/path"
            )
        path = Path(url[len(_PREFIX) :])
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = await aiosqlite.connect(path, isolation_level=None)
            conn.row_factory = sqlite3.Row
            for pragma in _PRAGMAS:
                await conn.execute(f"PRAGMA {pragma}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open SQLite database {path}: {exc}") from None
        storage = cls(conn, path)
        try:
            await storage._migrate()
        except BaseException:
            await storage.close()  # the threads would otherwise keep the process alive
            raise
        return storage

    async def _migrate(self) -> None:
        for number, script in _migrations():
            async with self._transaction() as db:
                # Re-read inside the write transaction: another process may have migrated.
                version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
                if number <= version:
                    continue
                for statement in _statements(script):
                    await db.execute(statement)
                await db.execute(f"PRAGMA user_version = {number}")

    @asynccontextmanager
    async def _transaction(self):
        async with self._write_lock:
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    await self._conn.rollback()
                    raise
                await self._conn.commit()
            except sqlite3.IntegrityError as exc:
                raise StateConflict(str(exc)) from None
            except sqlite3.Error as exc:
                raise StorageError(str(exc)) from None

    async def _write(self, sql: str, params: tuple = ()) -> int:
        """One atomic statement (its triggers included), committed; returns rowcount."""
        try:
            return await self._writer.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if str(exc) in _LIMIT_REASONS:
                raise LimitReached(str(exc)) from None
            raise StateConflict(str(exc)) from None
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from None

    async def _fetchall(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        try:
            async with self._conn.execute(sql, params) as cursor:
                return await cursor.fetchall()
        except (sqlite3.Error, ValueError) as exc:  # ValueError: aiosqlite, connection closed
            raise StorageError(str(exc)) from None

    async def _fetchone(self, sql: str, params: tuple = ()) -> sqlite3.Row | None:
        try:
            async with self._conn.execute(sql, params) as cursor:
                return await cursor.fetchone()
        except (sqlite3.Error, ValueError) as exc:  # ValueError: aiosqlite, connection closed
            raise StorageError(str(exc)) from None

    async def checkpoint(self) -> None:
        """Fold the WAL into the database file and let it start over.

        On a connection and thread of its own: it fsyncs, and waits for readers. RESTART,
        not PASSIVE: under unbroken writes a passive checkpoint copies frames but the WAL
        never starts over (6.7 GB after a 10-minute soak). Meanwhile the request path's
        writer finds the database busy and retries asynchronously; the loop never waits.
        """

        def fold() -> None:
            conn = sqlite3.connect(self._path, isolation_level=None, timeout=2.0)
            try:
                conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
                conn.execute("PRAGMA wal_checkpoint(RESTART)")
            finally:
                conn.close()

        try:
            await asyncio.to_thread(fold)
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from None

    async def close(self) -> None:
        await self._writer.close()
        await self._conn.close()

    async def health(self) -> None:
        await self._fetchone("SELECT 1")

    def admin_epoch(self) -> tuple[int, int]:
        return self._epoch.current()

    async def create_project(self, project: ProjectRecord) -> ProjectRecord:
        async with self._transaction() as db:
            await db.execute(
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
        row = await self._fetchone("SELECT * FROM projects WHERE id = ?", (project_id,))
        return None if row is None else _project(row)

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
        return await self.get_project(project_id)

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
        row = await self._fetchone("SELECT * FROM api_keys WHERE prefix = ?", (prefix,))
        return None if row is None else _key(row)

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
        return await self.get_key(prefix)

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
        try:
            await self._write(
                "INSERT INTO receipts (id, reservation_id, project_id, key_id, request_id, kind,"
                " endpoint, model_or_runtime, status, usage, cost, month, created_at,"
                " request_sha256, response_sha256)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
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
                ),
            )
        except StateConflict as exc:
            if str(exc) == "reservation_gone":
                return False
            raise
        return True

    async def release(self, reservation_id: str) -> None:
        await self._write("DELETE FROM reservations WHERE id = ?", (reservation_id,))

    async def renew_leases(self, owner: str, lease_until: int) -> None:
        await self._write(
            "UPDATE reservations SET lease_until = ? WHERE owner = ?", (lease_until, owner)
        )

    async def release_abandoned(self, owner_alive) -> int:
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
            "SELECT p.balance, p.reserved, COALESCE(m.spent, 0) AS spent FROM projects p"
            " LEFT JOIN month_spend m ON m.subject = p.id AND m.month = ? WHERE p.id = ?",
            (month, project_id),
        )
        if row is None:
            raise RecordNotFound(f"no project {project_id}")
        return Account(balance=row["balance"], reserved=row["reserved"], month_spend=row["spent"])

    async def key_month_spend(self, key_id: str, month: str) -> int:
        row = await self._fetchone(
            "SELECT spent FROM month_spend WHERE subject = ? AND month = ?", (key_id, month)
        )
        return 0 if row is None else row["spent"]

    async def get_receipt(self, receipt_id: str) -> ReceiptRecord | None:
        row = await self._fetchone("SELECT * FROM receipts WHERE id = ?", (receipt_id,))
        if row is None:
            return None
        fields = dict(row)
        fields["usage"] = orjson.loads(fields["usage"])
        return ReceiptRecord(**fields)

    async def audit(self, project_id: str, month: str) -> Audit:
        row = await self._fetchone(
            "SELECT p.balance, p.reserved,"
            " (SELECT COALESCE(SUM(CASE kind WHEN 'credit' THEN amount ELSE -amount END), 0)"
            "  FROM ledger WHERE project_id = p.id) AS ledger_sum,"
            " (SELECT COALESCE(SUM(amount), 0) FROM reservations WHERE project_id = p.id) AS held,"
            " (SELECT COALESCE(SUM(spent), 0) FROM month_spend WHERE subject = p.id AND month = ?)"
            "  AS month_spend,"
            " (SELECT COALESCE(SUM(amount), 0) FROM ledger"
            "  WHERE project_id = p.id AND kind = 'charge' AND month = ?) AS month_charges"
            " FROM projects p WHERE p.id = ?",
            (month, month, project_id),
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
        rows = await self._fetchall(
            # Leaves follow receipt rowids, so the search starts after the last logged one
            # instead of scanning every receipt ever issued.
            "SELECT r.* FROM receipts r WHERE r.rowid > COALESCE("
            " (SELECT x.rowid FROM log_leaves l JOIN receipts x ON x.id = l.receipt_id"
            "  ORDER BY l.leaf_index DESC LIMIT 1), 0)"
            " AND NOT EXISTS (SELECT 1 FROM log_leaves l WHERE l.receipt_id = r.id)"
            " ORDER BY r.rowid LIMIT ?",
            (limit,),
        )
        return [ReceiptRecord(**{**dict(row), "usage": orjson.loads(row["usage"])}) for row in rows]

    async def append_log(self, leaves: list[LogLeaf], head: TreeHeadRecord) -> None:
        leaf_rows = [(x.leaf_index, x.receipt_id, x.public_receipt, x.signature) for x in leaves]
        head_row = (head.size, head.root_hash, head.timestamp, head.key_id, head.signature)
        try:
            await self._writer.execute_unit(
                [
                    (
                        "INSERT INTO log_leaves (leaf_index, receipt_id, public_receipt,"
                        " signature) VALUES (?, ?, ?, ?)",
                        leaf_rows,
                    ),
                    (
                        "INSERT INTO tree_heads (size, root_hash, timestamp, key_id, signature)"
                        " VALUES (?, ?, ?, ?, ?)",
                        [head_row],
                    ),
                ]
            )
        except sqlite3.IntegrityError as exc:
            raise StateConflict(str(exc)) from None
        except sqlite3.Error as exc:
            raise StorageError(str(exc)) from None

    async def log_leaves(self, start: int = 0) -> list[LogLeaf]:
        rows = await self._fetchall(
            "SELECT * FROM log_leaves WHERE leaf_index >= ? ORDER BY leaf_index", (start,)
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
            row = await self._fetchone("SELECT * FROM tree_heads ORDER BY size DESC LIMIT 1")
        else:
            row = await self._fetchone("SELECT * FROM tree_heads WHERE size = ?", (size,))
        return None if row is None else TreeHeadRecord(**dict(row))
