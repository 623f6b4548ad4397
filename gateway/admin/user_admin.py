"""Console users: create (the password hashed, never kept nor recorded), grant a project,
disable; each with its audit entry (user.create, user.grant, user.disable)."""

from __future__ import annotations

import asyncio

from model_gateway.gateway.admin.admin_context import AdminContext, InvalidChange
from model_gateway.gateway.admin.audit_trail import audit_entry, target
from model_gateway.gateway.admin.passwords import hash_password
from model_gateway.storage import RecordNotFound
from model_gateway.storage.base import UserRecord, new_id, now_s


async def create_user(
    admin: AdminContext, email: str, password: str, role: str | None = None
) -> UserRecord:
    """A console user; `role` None: owner when it is the first user, else member
    (StateConflict: the email exists)."""
    try:
        # Off the event loop: single sign-on creates users in the serving process.
        password_hash = await asyncio.to_thread(hash_password, password)
    except ValueError as exc:
        raise InvalidChange(str(exc)) from None
    user = UserRecord(
        id=new_id("usr"), email=email.strip(), password_hash=password_hash, created_at=now_s()
    )
    if "@" not in user.email:
        raise InvalidChange(f"not an email address: {email!r}")
    # The role given; None is decided (owner or member) in the insert's transaction.
    audit = audit_entry(
        admin, "user.create", target("user", user.id), {"email": user.email, "role": role}
    )
    return await admin.storage.create_user(user, role, audit)


async def grant_project(admin: AdminContext, email: str, project_id: str) -> UserRecord:
    """Let the user see the project; granting twice changes nothing, and is recorded
    (RecordNotFound)."""
    user = await _user(admin, email)
    audit = audit_entry(admin, "user.grant", target("user", user.id), {"project": project_id})
    await admin.storage.grant_project(email, project_id, audit)
    return user


async def disable_user(admin: AdminContext, email: str) -> UserRecord:
    """Disable the user and end their sessions (RecordNotFound)."""
    user = await _user(admin, email)
    audit = audit_entry(admin, "user.disable", target("user", user.id), {"disabled": True})
    return await admin.storage.disable_user(email, audit)


async def _user(admin: AdminContext, email: str) -> UserRecord:
    """The user (RecordNotFound): their id names them in the audit entry."""
    user = await admin.storage.get_user(email)
    if user is None:
        raise RecordNotFound(f"no user {email}")
    return user
