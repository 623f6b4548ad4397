"""The audit log (AuditPort) on PostgreSQL: its list, and how a change writes its entry in
its own transaction (migration 0019: a trigger refuses UPDATE, DELETE and TRUNCATE).

The domain classes whose changes are audited (accounts, ledger, console) build on
`PostgresAudit`: a change inserts its entry with `_record` inside the transaction it
runs in; a change of one statement runs in a transaction with it (`_execute_audited`)."""

from __future__ import annotations

import orjson

from model_gateway.storage.postgres.connection import Connection, PostgresBase
from model_gateway.storage.records import AUDIT_NEWEST, AuditEntry, audit_entry


class PostgresAudit(PostgresBase):
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
            "SELECT seq, id, at, actor, action, target::text AS target,"
            " changes::text AS changes, request_id FROM audit_log"
            " WHERE seq < $1 AND ($2::text IS NULL OR action = $2)"
            " AND ($3::text IS NULL OR actor = $3) ORDER BY seq DESC LIMIT $4",
            AUDIT_NEWEST if before is None else before,
            action,
            actor,
            limit,
        )

    @staticmethod
    async def _record(conn: Connection, audit: AuditEntry | None) -> None:
        """Insert the entry in the transaction open on `conn` (nothing when None)."""
        if audit is not None:
            await conn.execute(
                "INSERT INTO audit_log (id, at, actor, action, target, changes, request_id)"
                " VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7)",
                audit.id,
                audit.at,
                audit.actor,
                audit.action,
                orjson.dumps(audit.target).decode(),
                orjson.dumps(audit.changes).decode(),
                audit.request_id,
            )

    async def _execute_audited(self, audit: AuditEntry | None, sql: str, *args: object) -> None:
        """One statement; with its entry, in one transaction: both or neither."""

        async def run(conn: Connection) -> None:
            async with conn.transaction():
                await conn.execute(sql, *args)
                await self._record(conn, audit)

        if audit is None:
            await self._run(lambda c: c.execute(sql, *args))
        else:
            await self._run(run)
