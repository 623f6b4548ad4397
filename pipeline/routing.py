"""Routing: finds the endpoint before anything looks at credentials, and picks its chain.

Reads: method and path (less the mount's root_path). Writes: `ctx.endpoint`,
`ctx.path_params`. Rejects: 404 not_found (an unknown /v1 path points at GET /v1) and
405 method_not_allowed with an `allow` header. Public endpoints go on through the public
chain, every other one through the keyed chain (see `build_pipeline`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from model_gateway.pipeline.context import context_of
from model_gateway.pipeline.endpoint import PUBLIC, RouteTable
from model_gateway.pipeline.errors import MethodNotAllowed, NotFound, send_error


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


class Routing:
    def __init__(self, *, table: RouteTable, public: ASGIApp, keyed: ASGIApp) -> None:
        self.table = table
        self.public = public
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = context_of(scope)
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
