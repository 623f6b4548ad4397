"""Routing: finds the endpoint before anything looks at credentials, and picks its chain.

Reads: method and path (less the mount's root_path). Writes: `ctx.endpoint`,
`ctx.path_params`. Rejects: 404 not_found (an unknown /v1 path points at GET /v1) and
405 method_not_allowed with an `allow` header. Public endpoints go on through the public
chain, every other one through the keyed chain (see `build_pipeline`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import request_context
from model_gateway.pipeline.endpoint import PUBLIC, RouteTable
from model_gateway.pipeline.errors import MethodNotAllowed, NotFound, send_error


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


async def answer_foreign_scope(scope: Scope, receive: Receive, send: Send) -> None:
    """What a terminal stage does with a scope that is not a request, as Starlette's router
    does with what it does not route: a websocket is closed, a lifespan completes (the
    pipeline itself has nothing to start)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1000})
    elif scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


class Routing:
    def __init__(self, *, table: RouteTable, public: ASGIApp, keyed: ASGIApp) -> None:
        self.table = table
        self.public = public
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = request_context(scope)
        if ctx is None:
            await answer_foreign_scope(scope, receive, send)
            return
        path = route_path(scope)
        found = self.table.match(path)
        if found is None:
            hint = (
                " GET /v1 lists the endpoints." if path == "/v1" or path.startswith("/v1/") else ""
            )
            await send_error(
                send, NotFound("No endpoint exists at this path." + hint), ctx.request_id
            )
            return
        routes, params = found
        endpoint = routes.methods.get(scope["method"])
        if endpoint is None:
            error = MethodNotAllowed(
                f"This path supports {routes.allow} only.", headers={"allow": routes.allow}
            )
            await send_error(send, error, ctx.request_id)
            return
        ctx.endpoint = endpoint
        ctx.path_params = params
        await (self.public if endpoint.scope == PUBLIC else self.keyed)(scope, receive, send)
