"""API keys: create (the secret is returned once, never recorded), update, revoke; each with
its audit entry (key.create, key.update, key.revoke), whose target is the key's id."""

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
from model_gateway.gateway.admin.audit_trail import audit_entry, given, target
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
    fields = given(
        project=project_id,
        scopes=scopes,
        models=models,
        monthly_limit=monthly_limit,
        expires_at=expires_at,
        rpm=rpm,
        tpm=tpm,
        name=name,
    )
    audit = audit_entry(admin, "key.create", target("key", record.id), fields)
    return CreatedKey(secret, await admin.storage.create_key(record, name, audit))


async def update_key(
    admin: AdminContext, prefix: str, changes: KeyChanges
) -> ConfirmedChange[KeyRecord]:
    """Change a usable key (RecordNotFound, StateConflict when revoked)."""
    check_tpm(changes.get("tpm"))
    stored = await _stored(admin, prefix)
    audit = audit_entry(admin, "key.update", target("key", stored.id), changes) if changes else None
    return await confirmed(admin, await admin.storage.update_key(prefix, dict(changes), audit))


async def revoke_key(admin: AdminContext, prefix_or_key: str) -> ConfirmedChange[KeyRecord]:
    """Revoke a usable key, effective on the next request everywhere (RecordNotFound,
    StateConflict when revoked). The whole key (pasted from a leak report) revokes only
    the key stored under its prefix, so that a made-up key never revokes someone else's."""
    if keys.is_well_formed(prefix_or_key):
        pepper = admin.pepper()
        found = await admin.storage.get_key(keys.public_prefix(prefix_or_key))
        if found is None or not keys.matches(pepper, prefix_or_key, found.key_hash):
            raise RecordNotFound("no such key")
        stored = found
    else:
        stored = await _stored(admin, prefix_or_key)
    audit = audit_entry(admin, "key.revoke", target("key", stored.id), {"state": "revoked"})
    return await confirmed(admin, await admin.storage.revoke_key(stored.prefix, audit))


async def _stored(admin: AdminContext, prefix: str) -> KeyRecord:
    """The key with this prefix (RecordNotFound): its id names it in the audit entry."""
    stored = await admin.storage.get_key(prefix)
    if stored is None:
        raise RecordNotFound(f"no key {prefix}")
    return stored
