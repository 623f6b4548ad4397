"""Console users: create (the password hashed, never kept), grant a project, disable."""

from __future__ import annotations

from model_gateway.gateway.admin.admin_context import AdminContext, InvalidChange
from model_gateway.gateway.admin.passwords import hash_password
from model_gateway.storage import RecordNotFound
from model_gateway.storage.base import UserRecord, new_id, now_s


async def create_user(
    admin: AdminContext, email: str, password: str, role: str | None = None
) -> UserRecord:
    """A console user; `role` None: owner when it is the first user, else member
    (StateConflict: the email exists)."""
    try:
        password_hash = hash_password(password)
    except ValueError as exc:
        raise InvalidChange(str(exc)) from None
    user = UserRecord(
        id=new_id("usr"), email=email.strip(), password_hash=password_hash, created_at=now_s()
    )
    if "@" not in user.email:
        raise InvalidChange(f"not an email address: {email!r}")
    return await admin.storage.create_user(user, role)


async def grant_project(admin: AdminContext, email: str, project_id: str) -> UserRecord:
    """Let the user see the project; granting twice is a no-op (RecordNotFound)."""
    await admin.storage.grant_project(email, project_id)
    user = await admin.storage.get_user(email)
    if user is None:  # disappeared meanwhile
        raise RecordNotFound(f"no user {email}")
    return user


async def disable_user(admin: AdminContext, email: str) -> UserRecord:
    """Disable the user and end their sessions (RecordNotFound)."""
    return await admin.storage.disable_user(email)
