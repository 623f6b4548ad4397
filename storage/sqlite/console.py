"""The console's sessions and sign-in throttle (ConsolePort) on SQLite."""

from __future__ import annotations

from model_gateway.storage.records import AuditEntry, UserRecord
from model_gateway.storage.sqlite.audit import SQLiteAudit
from model_gateway.storage.sqlite.rows import _user


class SQLiteConsole(SQLiteAudit):
    """Sessions and failed sign-ins (migration 0005)."""

    async def create_session(
        self, id_hash: bytes, user_id: str, now: int, audit: AuditEntry | None = None
    ) -> None:
        await self._write_audited(
            "INSERT INTO sessions (id_hash, user_id, created_at, seen_at) VALUES (?, ?, ?, ?)",
            (id_hash, user_id, now, now),
            audit,
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

    async def record_login_failure(
        self, subjects: list[str], now: int, audit: AuditEntry | None = None
    ) -> None:
        async with self._transaction() as db:
            await db.executemany(
                "INSERT INTO login_failures (subject, at) VALUES (?, ?)",
                [(subject, now) for subject in subjects],
            )
            await self._record(db, audit)

    async def login_failures(self, subject: str, since: int) -> list[int]:
        rows = await self._fetchall(
            "SELECT at FROM login_failures WHERE subject = ? AND at >= ? ORDER BY at",
            (subject, since),
        )
        return [row["at"] for row in rows]

    async def clear_login_failures(self, subject: str) -> None:
        await self._write("DELETE FROM login_failures WHERE subject = ?", (subject,))
