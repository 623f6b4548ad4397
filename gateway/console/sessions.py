"""Server-side console sessions: the cookie holds 32 random bytes, the database their SHA-256.

Cookie: `HttpOnly; SameSite=Strict; Path=/console`, plus `Secure` in production. A new id
at every sign-in (no fixation); sign-out deletes the row, so the cookie is dead at once.
Every session starts with its `session.sign_in` audit entry, in the same write (whatever
signed the user in: a password, single sign-on); the entry never holds the session id.
"""

from __future__ import annotations

import hashlib
import secrets
from http.cookies import SimpleCookie

from starlette.datastructures import Headers
from starlette.types import Scope

from model_gateway.gateway.admin.admin_context import user_actor
from model_gateway.gateway.admin.audit_trail import entry, target
from model_gateway.storage import ConsolePort
from model_gateway.storage.base import UserRecord, now_s

COOKIE_NAME = "console_session"
_TOUCH_EVERY_S = 60  # the idle clock moves at most once a minute: not a write per request


def _id_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def presented_token(scope: Scope) -> str | None:
    cookie = SimpleCookie()
    try:
        cookie.load(Headers(scope=scope).get("cookie", ""))
    except Exception:  # a malformed Cookie header is no session
        return None
    morsel = cookie.get(COOKIE_NAME)
    return morsel.value if morsel is not None and morsel.value else None


class Sessions:
    def __init__(self, storage: ConsolePort, *, idle_s: int, secure: bool) -> None:
        self.storage = storage
        self.idle_s = idle_s
        self.secure = secure

    async def start(self, user: UserRecord) -> str:
        """A new session for the user, recorded as their sign-in; returns the Set-Cookie
        value."""
        token = secrets.token_urlsafe(32)
        audit = entry(user_actor(user.email), "session.sign_in", target("user", user.id))
        await self.storage.create_session(_id_hash(token), user.id, now_s(), audit)
        return self._cookie(token, max_age=None)

    async def user(self, scope: Scope) -> UserRecord | None:
        """The signed-in user of this request, or None."""
        token = presented_token(scope)
        if token is None:
            return None
        now = now_s()
        id_hash = _id_hash(token)
        user = await self.storage.session_user(id_hash, now - self.idle_s)
        if user is not None:
            # Touch only when the idle clock would move by a minute or more.
            if await self.storage.session_user(id_hash, now - _TOUCH_EVERY_S) is None:
                await self.storage.touch_session(id_hash, now)
        return user

    async def end(self, scope: Scope) -> str:
        """Delete the request's session; returns the Set-Cookie value that clears it."""
        token = presented_token(scope)
        if token is not None:
            await self.storage.delete_session(_id_hash(token))
        return self._cookie("", max_age=0)

    def _cookie(self, value: str, *, max_age: int | None) -> str:
        parts = [f"{COOKIE_NAME}={value}", "HttpOnly", "SameSite=Strict", "Path=/console"]
        if self.secure:
            parts.append("Secure")
        if max_age is not None:
            parts.append(f"Max-Age={max_age}")
        return "; ".join(parts)
