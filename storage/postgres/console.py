"""The console's sessions and sign-in throttle (ConsolePort) on PostgreSQL."""

from __future__ import annotations

from model_gateway.storage.postgres.audit import PostgresAudit
from model_gateway.storage.postgres.connection import Connection
from model_gateway.storage.postgres.rows import _user
from model_gateway.storage.records import AuditEntry, UserRecord


class PostgresConsole(PostgresAudit):
    """Sessions and failed sign-ins (migration 0005)."""

    async def create_session(
        self, id_hash: bytes, user_id: str, now: int, audit: AuditEntry | None = None
    ) -> None:
        await self._execute_audited(
            audit,
            "INSERT INTO sessions (id_hash, user_id, created_at, seen_at) VALUES ($1, $2, $3, $3)",
            id_hash,
            user_id,
            now,
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

    async def record_login_failure(
        self, subjects: list[str], now: int, audit: AuditEntry | None = None
    ) -> None:
        await self._execute_audited(
            audit,
            "INSERT INTO login_failures (subject, at) SELECT s, $2 FROM unnest($1::text[]) s",
            subjects,
            now,
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
