"""The console inside the gateway process: `/console` pages, `/console/api/` JSON, and the
playground, which is the /v1 request path with the session as its principal."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.gateway.admin.admin_context import (
    ANONYMOUS,
    InvalidChange,
    admin_context,
    user_actor,
)
from model_gateway.gateway.admin.audit_trail import acting
from model_gateway.gateway.console import (
    api_agents,
    api_audit,
    api_money,
    api_projects,
    api_purchases,
    api_session,
    pages,
    pages_audit,
    sso,
)
from model_gateway.gateway.console.call import Call, handler_of
from model_gateway.gateway.console.guard import (
    PLAYGROUND_PROJECT,
    SessionAuth,
    check_origin,
    signed_in,
)
from model_gateway.gateway.console.prefix import under_prefix
from model_gateway.gateway.console.sessions import Sessions
from model_gateway.gateway.console.throttle import LoginThrottle
from model_gateway.gateway.metering.storage_meter import current_month
from model_gateway.pipeline import chain
from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.endpoint import PUBLIC, Endpoint, RouteTable
from model_gateway.pipeline.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    Unauthenticated,
    send_error,
)
from model_gateway.pipeline.observe import Observe
from model_gateway.pipeline.request_id import RequestId
from model_gateway.pipeline.routing import route_path
from model_gateway.storage.base import RecordNotFound, StateConflict, Storage, UserRecord, now_s

if TYPE_CHECKING:
    from model_gateway.gateway.agents.run_engine import AgentEngine
    from model_gateway.gateway.catalog import ConfigCatalog
    from model_gateway.gateway.config import Config
    from model_gateway.pipeline.ports import RequestObserver

# The three playground paths and the /v1 endpoint each one runs.
_PLAYGROUND = re.compile(
    r"^/console/api/projects/(?P<project>[^/]+)/playground"
    r"(?P<path>/chat/completions|/responses|/sandbox/executions)$"
)


class ConsoleGateway(Protocol):
    """What the console reads of a started gateway (gateway.app.Gateway): its settings and
    storage, the models its pages offer, the agents' engine, who observes its requests, and
    the /v1 request path its playground runs."""

    @property
    def config(self) -> Config: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def catalog(self) -> ConfigCatalog: ...
    @property
    def agents(self) -> AgentEngine: ...
    def observers(self) -> Sequence[RequestObserver]: ...
    def pipeline(self, authenticate: Middleware | None = None) -> ASGIApp: ...


class Console:
    """The console's parts over a started gateway."""

    def __init__(self, gateway: ConsoleGateway) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.storage = gateway.storage
        # Its changes; each request's are recorded as its signed-in user's (_dispatch).
        self.admin = admin_context(self.storage, self.config, current_month, ANONYMOUS)
        self.public_url = self.config.server.public_url
        self.sessions = Sessions(
            self.storage,
            idle_s=self.config.console.session_idle_s,
            secure=self.config.server.environment == "production",
        )
        self.throttle = LoginThrottle(self.storage, self.config.console)
        self.routes = RouteTable(
            api_session.routes(self)
            + api_projects.routes(self)
            + api_money.routes(self)
            + api_purchases.routes(self)
            + api_agents.routes(self)
            + pages.routes(self)
            + sso.routes(self)  # none without [console.oidc]
            + api_audit.routes(self)
            + pages_audit.routes(self)
        )
        # Observed like /v1: an access line and the request metrics for every console
        # request. The playground is not in this chain: the /v1 chain observes it.
        self.app = chain(
            [Middleware(RequestId), Middleware(Observe, observers=gateway.observers())],
            self._dispatch,
        )
        self.playground = gateway.pipeline(authenticate=Middleware(SessionAuth, console=self))

    async def authenticate(self, scope: Scope) -> UserRecord:
        """The Origin check, then the session: the order every console request follows.
        The user is named in the request's access line."""
        check_origin(scope, self.public_url)
        user = await signed_in(self.sessions, scope)
        context_of(scope).user = user.email
        return user

    async def purge(self) -> None:
        now = now_s()
        console = self.config.console
        await self.storage.purge_console(now - console.session_idle_s, now - console.login_window_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = _PLAYGROUND.match(route_path(scope))
        if found is None:
            await self.app(scope, receive, send)
            return
        # The /v1 endpoint, through the same stages; only the principal differs.
        root = scope.get("root_path", "")
        inner = {
            **scope,
            "path": root + "/v1" + found["path"],
            PLAYGROUND_PROJECT: found["project"],
        }
        inner["raw_path"] = inner["path"].encode()
        await self.playground(inner, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = context_of(scope)
        path = route_path(scope)
        is_api = path.startswith("/console/api/")
        try:
            endpoint, params = self._route(scope, path)
            user: UserRecord | None = None
            if endpoint.scope == PUBLIC:
                check_origin(scope, self.public_url)
            else:
                user = await self.authenticate(scope)
            # Changes are the user's (audit_trail), under this request's id.
            with acting(ANONYMOUS if user is None else user_actor(user.email), ctx.request_id):
                response = await _answer(
                    endpoint, Call(Request(scope, receive), user, params, ctx.request_id)
                )
        except Unauthenticated as error:
            if is_api:
                await send_error(send, error, ctx.request_id)
            else:
                await RedirectResponse("/console/login", status_code=303)(scope, receive, send)
            return
        except GatewayError as error:
            if is_api:
                await send_error(send, error, ctx.request_id)
            else:
                await pages.error_page(error)(scope, receive, send)
            return
        await response(scope, receive, send)

    def _route(self, scope: Scope, path: str) -> tuple[Endpoint, dict[str, str]]:
        found = self.routes.match(path)
        if found is None:
            raise NotFound("No console page or endpoint exists at this path.")
        routes, params = found
        endpoint = routes.methods.get(scope["method"])
        if endpoint is None:
            raise MethodNotAllowed(
                f"This path supports {routes.allow} only.", headers={"allow": routes.allow}
            )
        context_of(scope).endpoint = endpoint  # the metrics' label: the path's template
        return endpoint, params


async def _answer(endpoint: Endpoint, call: Call) -> Response:
    """The handler's response; a record gone or changed meanwhile is a 404 or a 409, a
    change the admin service refuses for its input a 400 naming the field."""
    try:
        return await handler_of(endpoint)(call)
    except RecordNotFound:
        raise NotFound() from None
    except StateConflict:
        raise Conflict() from None
    except InvalidChange as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None


class ConsoleMount:
    """Sends `/console` and everything under it to the console, the rest to the gateway."""

    def __init__(self, console: ASGIApp, main: ASGIApp) -> None:
        self.console = console
        self.main = main

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = route_path(scope)
            if path == "/console" or path.startswith("/console/"):
                root = scope.get("root_path", "")
                await self.console(scope, receive, under_prefix(root, send) if root else send)
                return
        await self.main(scope, receive, send)


def mount_console(gateway: ConsoleGateway, main: ASGIApp) -> ASGIApp:
    return ConsoleMount(Console(gateway), main)
