"""POST /console/api/login, POST /console/api/logout, GET /console/api/me, and the one
sign-in both the JSON endpoint and the sign-in form (without JavaScript) go through."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import Response

from model_gateway.gateway.admin.admin_views import user_view
from model_gateway.gateway.admin.passwords import check_password
from model_gateway.gateway.console.call import SESSION, Call, no_content, route
from model_gateway.gateway.console.payload import Fields
from model_gateway.gateway.json_response import json_response
from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.endpoint import PUBLIC, Endpoint
from model_gateway.pipeline.errors import Unauthenticated
from model_gateway.storage.base import UserRecord

if TYPE_CHECKING:
    from model_gateway.gateway.console.mount import Console

WRONG_CREDENTIALS = "The email or password is incorrect."  # one message for both


async def sign_in(console: Console, call: Call, fields: Fields) -> tuple[UserRecord, str]:
    """Check `email` and `password` under the throttle's rules (400, 401 for a wrong email
    or password alike, 429 while throttled); the user and the new session's Set-Cookie."""
    email = fields.string("email", required=True, max_length=320)
    password = fields.string("password", required=True, max_length=1024, strip=False)
    address = call.request.client.host if call.request.client else "unknown"
    async with console.throttle.turn(email, address):
        await console.throttle.check(email, address)
        found = await console.storage.get_user(email)
        user = found if found is not None and not found.disabled else None  # None: unusable
        # Verified against a decoy when unusable: the same time and the same answer.
        verified = await check_password(None if user is None else user.password_hash, password)
        if user is None or not verified:
            await console.throttle.failed(email, address)
            raise Unauthenticated(WRONG_CREDENTIALS)
        await console.throttle.succeeded(email)
    return user, await open_session(console, call, user)


async def open_session(console: Console, call: Call, user: UserRecord) -> str:
    """A new session for a user whose sign-in passed (password or single sign-on); its
    Set-Cookie value."""
    await console.purge()  # expired sessions and stale failures, at each sign-in
    # A new session id at every sign-in; a session the browser brought along ends.
    await console.sessions.end(call.request.scope)
    cookie = await console.sessions.start(user)
    context_of(call.request.scope).user = user.email  # named in the access line
    return cookie


def routes(console: Console) -> list[Endpoint]:
    async def login(call: Call) -> Response:
        fields = Fields(await call.json())
        user, cookie = await sign_in(console, call, fields)
        return json_response({"user": user_view(user)}, headers={"set-cookie": cookie})

    async def logout(call: Call) -> Response:
        cookie = await console.sessions.end(call.request.scope)
        return no_content({"set-cookie": cookie})

    async def me(call: Call) -> Response:
        user = call.session_user
        projects = None
        if user.role == "member":
            projects = sorted(await console.storage.granted_projects(user.id))
        return json_response({"user": user_view(user, projects)})

    return [
        route("POST", "/console/api/login", PUBLIC, login),
        route("POST", "/console/api/logout", SESSION, logout),
        route("GET", "/console/api/me", SESSION, me),
    ]
