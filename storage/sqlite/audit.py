"""The audit log (AuditPort) on SQLite: its list, and how a change writes its entry in
its own transaction (migration 0019: the table refuses UPDATE and DELETE).

The domain classes whose changes are audited (accounts, ledger, console) build on
`SQLiteAudit`: a change made in an aiosqlite transaction inserts its entry there
(`_record`); a change of one statement goes to the group commit as a unit with its entry
(`_write_audited`), all or nothing."""

from __future__ import annotations

import aiosqlite
import orjson

from model_gateway.storage.records import AUDIT_NEWEST, AuditEntry, audit_entry
from model_gateway.storage.sqlite.connection import SQLiteBase

_INSERT = (
    "INSERT INTO audit_log (id, at, actor, action, target, changes, request_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _row(entry: AuditEntry) -> tuple[object, ...]:
    return (
        entry.id,
        entry.at,
        entry.actor,
        entry.action,
        orjson.dumps(entry.target).decode(),
        orjson.dumps(entry.changes).decode(),
        entry.request_id,
    )


class SQLiteAudit(SQLiteBase):
    """The audit log, and the write of an entry with its change."""

    async def list_audit(
        self,
        limit: int,
        before: int | None,
        *,
        action: str | None = None,
        actor: str | None = None,
    ) -> list[tuple[int, AuditEntry]]:
        return await self._all(
            audit_entry,
            "SELECT * FROM audit_log WHERE seq < ? AND (? IS NULL OR action = ?)"
            " AND (? IS NULL OR actor = ?) ORDER BY seq DESC LIMIT ?",
            (AUDIT_NEWEST if before is None else before, action, action, actor, actor, limit),
        )

    @staticmethod
    async def _record(db: aiosqlite.Connection, audit: AuditEntry | None) -> None:
        """Insert the entry in the caller's open transaction (nothing when None)."""
        if audit is not None:
            await db.execute(_INSERT, _row(audit))

    async def _write_audited(
        self, sql: str, params: tuple[object, ...], audit: AuditEntry | None
    ) -> None:
        """One statement, group-committed; with its entry, as one unit: both or neither."""
        if audit is None:
            await self._write(sql, params)
        else:
            await self._writer.execute_unit([(sql, [params]), (_INSERT, [_row(audit)])])
