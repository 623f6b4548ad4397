"""API keys: create (the secret is returned once), update, revoke."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from model_gateway.gateway.access import keys
from model_gateway.gateway.admin.admin_context import (
    AdminContext,
    ConfirmedChange,
    InvalidChange,
    check_tpm,
    confirmed,
)
from model_gateway.gateway.admin.money_admin import active_project
from model_gateway.storage import RecordNotFound
from model_gateway.storage.base import KeyRecord, new_id, now_s


@dataclass(frozen=True)
class CreatedKey:
    secret: str  # the key itself: shown this once, never stored
    record: KeyRecord


class KeyChanges(TypedDict, total=False):
    """The fields to change; a present None clears an optional one."""

    name: str | None
    models: list[str] | None
    monthly_limit: int | None
    expires_at: int | None  # unix seconds
    rpm: int | None
    tpm: int | None


async def create_key(
    admin: AdminContext,
    project_id: str,
    *,
    scopes: frozenset[str],
    models: list[str] | None = None,
    monthly_limit: int | None = None,
    expires_at: int | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    name: str | None = None,
) -> CreatedKey:
    """A new key of an active project (RecordNotFound, StateConflict). `scopes` are valid
    ones (gateway.keys.parse_scopes); `expires_at` in the past is refused."""
    check_tpm(tpm)
    if expires_at is not None and expires_at <= now_s():
        raise InvalidChange("is in the past: the key would never work", "expires_at")
    await active_project(admin, project_id)
    pepper = admin.pepper()
    secret = keys.generate_key()
    record = KeyRecord(
        id=new_id("key"),
        prefix=keys.public_prefix(secret),
        key_hash=keys.hash_key(pepper, secret),
        project_id=project_id,
        scopes=scopes,
        models=models,
        monthly_limit=monthly_limit,
        expires_at=expires_at,
        rpm=rpm,
        tpm=tpm,
        created_at=now_s(),
    )
    created = await admin.storage.create_key(record)
    if name is not None:
        await admin.storage.update_key(created.prefix, {"name": name})
    return CreatedKey(secret, created)


async def update_key(
    admin: AdminContext, prefix: str, changes: KeyChanges
) -> ConfirmedChange[KeyRecord]:
    """Change a usable key (RecordNotFound, StateConflict when revoked)."""
    check_tpm(changes.get("tpm"))
    return await confirmed(admin, await admin.storage.update_key(prefix, dict(changes)))


async def revoke_key(admin: AdminContext, prefix_or_key: str) -> ConfirmedChange[KeyRecord]:
    """Revoke a usable key, effective on the next request everywhere (RecordNotFound,
    StateConflict when revoked). The whole key (pasted from a leak report) revokes only
    the key stored under its prefix, so that a made-up key never revokes someone else's."""
    prefix = prefix_or_key
    if keys.is_well_formed(prefix_or_key):
        pepper = admin.pepper()
        stored = await admin.storage.get_key(keys.public_prefix(prefix_or_key))
        if stored is None or not keys.matches(pepper, prefix_or_key, stored.key_hash):
            raise RecordNotFound("no such key")
        prefix = stored.prefix
    return await confirmed(admin, await admin.storage.revoke_key(prefix))
