"""Projects, keys, sandboxes, console users and grants (AccountsPort) on SQLite. A change
that Python decides between statements (a key's project must exist, a state must allow it)
is an aiosqlite transaction; archiving, revoking and updating replace the admin epoch file."""

from __future__ import annotations

import sqlite3

import msgspec
import orjson

from model_gateway.storage.errors import RecordNotFound, StateConflict, StorageError
from model_gateway.storage.records import (
    AuditEntry,
    KeyListing,
    KeyRecord,
    ProjectRecord,
    SandboxRecord,
    UserRecord,
    now_s,
    with_changes,
)
from model_gateway.storage.sqlite.audit import SQLiteAudit
from model_gateway.storage.sqlite.rows import _json_list, _user


def _project(row: sqlite3.Row) -> ProjectRecord:
    allow = row["allow_models"]
    return ProjectRecord(
        id=row["id"],
        name=row["name"],
        state=row["state"],
        monthly_budget=row["monthly_budget"],
        rpm=row["rpm"],
        tpm=row["tpm"],
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
        tpm=row["tpm"],
        state=row["state"],
        created_at=row["created_at"],
    )


class SQLiteAccounts(SQLiteAudit):
    """Projects, keys, sandboxes, users and grants."""

    async def create_project(
        self, project: ProjectRecord, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        await self._write_audited(
            "INSERT INTO projects (id, name, state, monthly_budget, rpm, tpm, allow_models,"
            " exclude_models, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                project.id,
                project.name,
                project.state,
                project.monthly_budget,
                project.rpm,
                project.tpm,
                _json_list(project.allow_models),
                _json_list(project.exclude_models),
                project.created_at,
            ),
            audit,
        )
        return project

    async def get_project(self, project_id: str) -> ProjectRecord | None:
        return await self._one(_project, "SELECT * FROM projects WHERE id = ?", (project_id,))

    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        rows = await self._fetchall("SELECT * FROM projects ORDER BY created_at DESC, rowid DESC")
        return [_project(row) for row in rows if ids is None or row["id"] in ids]

    async def update_project(
        self, project_id: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> ProjectRecord:
        columns = ("name", "monthly_budget", "rpm", "tpm", "allow_models", "exclude_models")
        await self._update_row("projects", "id", project_id, "active", columns, changes, audit)
        return await self._found(self.get_project(project_id), f"no project {project_id}")

    async def archive_project(
        self, project_id: str, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM projects WHERE id = ?", (project_id,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no project {project_id}")
            if row["state"] == "archived":
                raise StateConflict(f"project {project_id} is already archived")
            await db.execute("UPDATE projects SET state = 'archived' WHERE id = ?", (project_id,))
            await self._record(db, audit)
        self._epoch.bump()
        archived = await self.get_project(project_id)
        if archived is None:  # projects are never deleted; this would be a broken database
            raise RecordNotFound(f"no project {project_id}")
        return archived

    async def create_key(
        self, key: KeyRecord, name: str | None = None, audit: AuditEntry | None = None
    ) -> KeyRecord:
        async with self._transaction() as db:
            found = await (
                await db.execute("SELECT 1 FROM projects WHERE id = ?", (key.project_id,))
            ).fetchone()
            if found is None:
                raise RecordNotFound(f"no project {key.project_id}")
            await db.execute(
                "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, models,"
                " monthly_limit, expires_at, rpm, tpm, state, created_at, name)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    key.tpm,
                    key.state,
                    key.created_at,
                    name,
                ),
            )
            await self._record(db, audit)
        return key

    async def get_key(self, prefix: str) -> KeyRecord | None:
        return await self._one(_key, "SELECT * FROM api_keys WHERE prefix = ?", (prefix,))

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

    async def update_key(
        self, prefix: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> KeyRecord:
        columns = ("name", "models", "monthly_limit", "expires_at", "rpm", "tpm")
        await self._update_row("api_keys", "prefix", prefix, "usable", columns, changes, audit)
        return await self._found(self.get_key(prefix), f"no key {prefix}")

    async def revoke_key(self, prefix: str, audit: AuditEntry | None = None) -> KeyRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT state FROM api_keys WHERE prefix = ?", (prefix,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no key {prefix}")
            if row["state"] == "revoked":
                raise StateConflict(f"key {prefix} is already revoked")
            await db.execute("UPDATE api_keys SET state = 'revoked' WHERE prefix = ?", (prefix,))
            await self._record(db, audit)
        self._epoch.bump()
        revoked = await self.get_key(prefix)
        if revoked is None:  # keys are never deleted; this would be a broken database
            raise RecordNotFound(f"no key {prefix}")
        return revoked

    async def _update_row(
        self,
        table: str,
        id_column: str,
        value: str,
        live_state: str,
        columns: tuple[str, ...],
        changes: dict[str, object],
        audit: AuditEntry | None,
    ) -> None:
        """Change the given columns of a row still in its live state, with its audit entry;
        bump the admin epoch, since cached keys carry their own and their project's limits
        and model policy."""
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
            await self._record(db, audit)
        self._epoch.bump()

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

    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        rows = await self._fetchall(
            "SELECT * FROM sandboxes WHERE project_id = ? ORDER BY created_at DESC, rowid DESC",
            (project_id,),
        )
        return [SandboxRecord(**dict(row)) for row in rows]

    # Console users (migration 0005).

    async def create_user(
        self, user: UserRecord, role: str | None, audit: AuditEntry | None = None
    ) -> UserRecord:
        async with self._transaction() as db:
            if role is None:
                row = await (await db.execute("SELECT 1 FROM users LIMIT 1")).fetchone()
                role = "member" if row is not None else "owner"
            await db.execute(
                "INSERT INTO users (id, email, password_hash, role, disabled, created_at)"
                " VALUES (?, ?, ?, ?, 0, ?)",
                (user.id, user.email, user.password_hash, role, user.created_at),
            )
            await self._record(db, with_changes(audit, role=role))  # the first: owner
        return msgspec.structs.replace(user, role=role)

    async def get_user(self, email: str) -> UserRecord | None:
        return await self._one(_user, "SELECT * FROM users WHERE email = ?", (email,))

    async def list_users(self) -> list[UserRecord]:
        return [_user(row) for row in await self._fetchall("SELECT * FROM users ORDER BY rowid")]

    async def disable_user(self, email: str, audit: AuditEntry | None = None) -> UserRecord:
        async with self._transaction() as db:
            row = await (
                await db.execute("SELECT id FROM users WHERE email = ?", (email,))
            ).fetchone()
            if row is None:
                raise RecordNotFound(f"no user {email}")
            await db.execute("UPDATE users SET disabled = 1 WHERE id = ?", (row["id"],))
            await db.execute("DELETE FROM sessions WHERE user_id = ?", (row["id"],))
            await self._record(db, audit)
        return await self._found(self.get_user(email), f"no user {email}")

    async def grant_project(
        self, email: str, project_id: str, audit: AuditEntry | None = None
    ) -> None:
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
            await self._record(db, audit)

    async def granted_projects(self, user_id: str) -> set[str]:
        rows = await self._fetchall("SELECT project_id FROM grants WHERE user_id = ?", (user_id,))
        return {row["project_id"] for row in rows}
