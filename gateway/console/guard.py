"""Who may do what in the console: the cross-site check, the session, project visibility.

Order for every console request: the Origin check (unsafe methods only), then the
session. API keys are never read here; session cookies are never read on /v1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.errors import (
    Conflict,
    Forbidden,
    GatewayError,
    NotFound,
    Unauthenticated,
    send_error,
)
from model_gateway.storage.base import ProjectRecord, Storage, UserRecord

if TYPE_CHECKING:
    from model_gateway.gateway.console.call import Call
    from model_gateway.gateway.console.mount import Console
    from model_gateway.gateway.console.sessions import Sessions

SAFE_METHODS = frozenset({"GET", "HEAD"})
PLAYGROUND_PROJECT = "console.project_id"  # scope key: the project a playground call is for


def own_origin(scope: Scope, public_url: str | None) -> str:
    if public_url:
        parts = urlsplit(public_url)
        return f"{parts.scheme}://{parts.netloc}".lower()
    host = Headers(scope=scope).get("host", "")
    return f"{scope.get('scheme', 'http')}://{host}".lower()


def check_origin(scope: Scope, public_url: str | None) -> None:
    """403 forbidden for an unsafe request whose Origin is present and not our own."""
    if scope["method"] in SAFE_METHODS:
        return
    origin = Headers(scope=scope).get("origin")
    if origin is not None and origin.lower() != own_origin(scope, public_url):
        raise Forbidden("Cross-site requests to the console are refused.")


async def visible_project(storage: Storage, user: UserRecord, project_id: str) -> ProjectRecord:
    """The project if the user may see it; otherwise as absent as a missing one (404)."""
    project = await storage.get_project(project_id)
    if project is not None and (
        user.role == "owner" or project_id in await storage.granted_projects(user.id)
    ):
        return project
    raise NotFound("No project with this ID exists.")


async def project_of(storage: Storage, call: Call) -> ProjectRecord:
    """The project named in the request's path, if the signed-in user may see it."""
    return await visible_project(storage, call.session_user, call.params["project_id"])


def require_owner(user: UserRecord) -> None:
    if user.role != "owner":
        raise Forbidden("Only an owner may do this.")


def require_active(project: ProjectRecord) -> None:
    if project.state != "active":
        raise Conflict("The project is archived: it is read-only.")


class SessionAuth:
    """The playground's authentication stage, in the place of key auth: the principal is
    the signed-in user, acting with full scope on a project they may see (`ctx.key` None).

    Reads: `origin`, the session cookie, the project id the console mount put in the scope.
    Writes: `ctx.project`. Rejects: 403 forbidden (foreign origin), 401 unauthenticated,
    404 not_found (a project the user may not see), 409 conflict (archived project).
    """

    def __init__(self, app: ASGIApp, *, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = context_of(scope)
        try:
            user = await self.console.authenticate(scope)
            project = await visible_project(self.console.storage, user, scope[PLAYGROUND_PROJECT])
            require_active(project)
        except GatewayError as error:
            await send_error(send, error, ctx.request_id)
            return
        ctx.key, ctx.project = None, project
        await self.app(scope, receive, send)


async def signed_in(sessions: Sessions, scope: Scope) -> UserRecord:
    user = await sessions.user(scope)
    if user is None:
        raise Unauthenticated()
    return user
