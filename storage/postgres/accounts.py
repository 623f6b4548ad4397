"""Projects, keys, sandboxes, console users and grants (AccountsPort) on PostgreSQL.
Every change of a project or key bumps this process's handles at once (the NOTIFY of its
trigger tells the other processes: cluster.py)."""

from __future__ import annotations

import msgspec

from model_gateway.storage.errors import RecordNotFound, StateConflict, StorageError
from model_gateway.storage.postgres.audit import PostgresAudit
from model_gateway.storage.postgres.connection import Connection, Row
from model_gateway.storage.postgres.rows import _fields, _user
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

# pg_advisory_xact_lock key: one user creator at a time.
_USERS_LOCK = 0x6D67_7573


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
        tpm=row["tpm"],
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
        tpm=row["tpm"],
        state=row["state"],
        created_at=row["created_at"],
    )


def _sandbox(row: Row) -> SandboxRecord:
    return SandboxRecord(**_fields(row, SandboxRecord))


def _key_listing(row: Row) -> KeyListing:
    return KeyListing(
        key=_key(row),
        name=row["name"],
        last_used_at=None if row["last_used_us"] is None else row["last_used_us"] // 10**6,
    )


class PostgresAccounts(PostgresAudit):
    """Projects, keys, sandboxes, users and grants."""

    async def create_project(
        self, project: ProjectRecord, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        p = project
        await self._execute_audited(
            audit,
            "INSERT INTO projects (id, name, state, monthly_budget, rpm, tpm, allow_models,"
            " exclude_models, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            p.id,
            p.name,
            p.state,
            p.monthly_budget,
            p.rpm,
            p.tpm,
            _sorted(p.allow_models),
            _sorted(p.exclude_models),
            p.created_at,
        )
        self._bump_process()
        return project

    async def get_project(self, project_id: str) -> ProjectRecord | None:
        return await self._one(_project, "SELECT * FROM projects WHERE id = $1", project_id)

    async def list_projects(self, ids: set[str] | None = None) -> list[ProjectRecord]:
        return await self._all(
            _project,
            "SELECT * FROM projects WHERE $1::text[] IS NULL OR id = ANY($1)"
            " ORDER BY created_at DESC, seq DESC",
            None if ids is None else sorted(ids),
        )

    async def update_project(
        self, project_id: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> ProjectRecord:
        columns = ("name", "monthly_budget", "rpm", "tpm", "allow_models", "exclude_models")
        row = await self._update_row(
            "projects", "id", project_id, "active", columns, changes, audit
        )
        return _project(row)

    async def archive_project(
        self, project_id: str, audit: AuditEntry | None = None
    ) -> ProjectRecord:
        row = await self._leave_state(
            "projects", "id", project_id, ("active", "archived"), f"project {project_id}", audit
        )
        return _project(row)

    async def _leave_state(
        self,
        table: str,
        column: str,
        value: str,
        states: tuple[str, str],
        noun: str,
        audit: AuditEntry | None,
    ) -> Row:
        """Move a row from its live state to its end state (archived, revoked) in one
        conditional statement, with its audit entry; the second read only names the
        refusal."""
        live, end = states

        async def change(conn: Connection) -> Row:
            async with conn.transaction():
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
                await self._record(conn, audit)
                return row

        row = await self._run(change)
        self._bump_process()
        return row

    async def create_key(
        self, key: KeyRecord, name: str | None = None, audit: AuditEntry | None = None
    ) -> KeyRecord:
        k = key
        await self._execute_audited(
            audit,
            "INSERT INTO api_keys (id, prefix, key_hash, project_id, scopes, models,"
            " monthly_limit, expires_at, rpm, tpm, state, created_at, name)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            k.id,
            k.prefix,
            k.key_hash,
            k.project_id,
            _sorted(k.scopes),
            _sorted(k.models),
            k.monthly_limit,
            k.expires_at,
            k.rpm,
            k.tpm,
            k.state,
            k.created_at,
            name,
        )
        self._bump_process()
        return key

    async def get_key(self, prefix: str) -> KeyRecord | None:
        return await self._one(_key, "SELECT * FROM api_keys WHERE prefix = $1", prefix)

    async def list_keys(self, project_id: str) -> list[KeyListing]:
        return await self._all(
            _key_listing,
            "SELECT k.*, (SELECT max(r.created_at) FROM receipts r WHERE r.key_id = k.id)"
            " AS last_used_us FROM api_keys k WHERE k.project_id = $1"
            " ORDER BY k.created_at DESC, k.seq DESC",
            project_id,
        )

    async def update_key(
        self, prefix: str, changes: dict[str, object], audit: AuditEntry | None = None
    ) -> KeyRecord:
        columns = ("name", "models", "monthly_limit", "expires_at", "rpm", "tpm")
        row = await self._update_row(
            "api_keys", "prefix", prefix, "usable", columns, changes, audit
        )
        return _key(row)

    async def revoke_key(self, prefix: str, audit: AuditEntry | None = None) -> KeyRecord:
        row = await self._leave_state(
            "api_keys", "prefix", prefix, ("usable", "revoked"), f"key {prefix}", audit
        )
        return _key(row)

    async def _update_row(
        self,
        table: str,
        id_column: str,
        value: str,
        live_state: str,
        columns: tuple[str, ...],
        changes: dict[str, object],
        audit: AuditEntry | None,
    ) -> Row:
        """Change the given columns of a row still in its live state, in one conditional
        statement, with its audit entry; bump the admin epoch (cached keys carry their
        limits and model policy)."""
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
            async with conn.transaction():
                row = await conn.fetchrow(update, value, live_state, *values)
                if row is None:
                    state = await conn.fetchval(
                        f"SELECT state FROM {table} WHERE {id_column} = $1",  # noqa: S608
                        value,
                    )
                    if state is None:
                        raise RecordNotFound(f"no {noun} {value}")
                    raise StateConflict(f"{noun} {value} is {state}")
                await self._record(conn, audit)
                return row

        row = await self._run(change)
        if changes:
            self._bump_process()
        return row

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

    async def list_sandboxes(self, project_id: str) -> list[SandboxRecord]:
        return await self._all(
            _sandbox,
            "SELECT * FROM sandboxes WHERE project_id = $1 ORDER BY created_at DESC, seq DESC",
            project_id,
        )

    # Console users (migration 0005).

    async def create_user(
        self, user: UserRecord, role: str | None, audit: AuditEntry | None = None
    ) -> UserRecord:
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
                await self._record(conn, with_changes(audit, role=chosen))  # the first: owner
                return chosen

        return msgspec.structs.replace(user, role=await self._run(create))

    async def get_user(self, email: str) -> UserRecord | None:
        return await self._one(_user, "SELECT * FROM users WHERE lower(email) = lower($1)", email)

    async def list_users(self) -> list[UserRecord]:
        return await self._all(_user, "SELECT * FROM users ORDER BY seq")

    async def disable_user(self, email: str, audit: AuditEntry | None = None) -> UserRecord:
        async def disable(conn: Connection) -> Row:
            async with conn.transaction():
                row = await conn.fetchrow(
                    "UPDATE users SET disabled = true WHERE lower(email) = lower($1) RETURNING *",
                    email,
                )
                if row is None:
                    raise RecordNotFound(f"no user {email}")
                await conn.execute("DELETE FROM sessions WHERE user_id = $1", row["id"])
                await self._record(conn, audit)
                return row

        return _user(await self._run(disable))

    async def grant_project(
        self, email: str, project_id: str, audit: AuditEntry | None = None
    ) -> None:
        async def grant(conn: Connection) -> None:
            async with conn.transaction():
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
                await self._record(conn, audit)

        await self._run(grant)

    async def granted_projects(self, user_id: str) -> set[str]:
        rows = await self._run(
            lambda c: c.fetch("SELECT project_id FROM grants WHERE user_id = $1", user_id)
        )
        return {row["project_id"] for row in rows}
